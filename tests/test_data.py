"""Data sources, bad input handling, the split policy and the hint index (bundled samples)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

from grammarrl.data.hints import HintIndex, top_k
from grammarrl.data.sources import SAMPLES_DIR, data_root, relative_uid
from grammarrl.data.splits import partition
from grammarrl.errors import DataError
from grammarrl.tasks import load_task
from grammarrl.tasks.base import drawing_note
from grammarrl.types import Example, Splits
from tests.conftest import compose_config

TASKS = ("gloss", "wos", "conll")


def task_on(name: str, data_dir, *overrides: str):
    value = "null" if data_dir is None else str(data_dir)
    return load_task(compose_config([f"task={name}", f"data.dir={value}", *overrides]))


@pytest.fixture
def copy_samples(tmp_path):
    """A writable copy of the bundled samples (to corrupt)."""
    shutil.copytree(SAMPLES_DIR, tmp_path / "data")
    return tmp_path / "data"


# ----- sources ---------------------------------------------------------------------------
def test_data_dir_defaults_to_env_then_samples(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAMMARRL_DATA_DIR", str(tmp_path))
    assert compose_config([]).data.dir == str(tmp_path)
    monkeypatch.delenv("GRAMMARRL_DATA_DIR")
    assert compose_config([]).data.dir is None
    assert data_root(None) == SAMPLES_DIR
    assert task_on("wos", None).root == SAMPLES_DIR


def test_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"data.dir=.*nowhere: no such directory"):
        task_on("gloss", tmp_path / "nowhere")
    task = task_on("conll", tmp_path)  # the directory exists but has no conll2003/
    with pytest.raises(DataError, match=r"conll2003"):
        task.splits()


def test_missing_or_unreadable_file_is_a_clear_error(copy_samples):
    (copy_samples / "conll2003" / "test.txt").unlink()
    with pytest.raises(DataError, match=r"missing data file .*conll2003/test.txt"):
        task_on("conll", copy_samples).splits()
    (copy_samples / "wos" / "wos_labelled.jsonl").write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(DataError, match=r"cannot read .*wos_labelled.jsonl"):
        task_on("wos", copy_samples).splits()


def test_gloss_files_must_pair_line_by_line(copy_samples):
    path = copy_samples / "aslg_pc12" / "ENG-ASL_Dev_0.046.asl"
    path.write_text(path.read_text() + "EXTRA LINE\n")
    with pytest.raises(DataError, match=r"ENG-ASL_Dev_0.046.en has 12 lines but .*has 13"):
        task_on("gloss", copy_samples).splits()


# ----- bad rows are skipped, counted and located ---------------------------------------------
def test_wos_bad_rows_are_skipped_with_file_and_line(copy_samples, caplog):
    path = copy_samples / "wos" / "wos_labelled.jsonl"
    good = path.read_text().splitlines()
    bad = [
        json.dumps({"abstract": "No labels here."}),
        json.dumps({"abstract": "   ", "parent": "CS", "child": "Cryptography"}),
        json.dumps({"abstract": "A text.", "parent": "CS", "child": "Depression"}),
        "{not json",
    ]
    path.write_text("\n".join(good + bad) + "\n")
    with caplog.at_level(logging.WARNING):
        task = task_on("wos", copy_samples)
        corpus = task.corpus
    assert sum(map(len, corpus.values())) == len(good)
    assert task.skips.as_dict() == {
        "empty_text": 1,
        "label_outside_hierarchy": 1,
        "malformed_json": 1,
        "missing_field": 1,
    }
    n = len(good)
    for offset, reason in enumerate(
        ["missing_field", "empty_text", "label_outside_hierarchy", "malformed_json"], start=1
    ):
        assert f"wos_labelled.jsonl:{n + offset}: row skipped ({reason})" in caplog.text
    assert task.splits().skipped["label_outside_hierarchy"] == 1


def test_gloss_empty_line_and_conll_bad_tag_are_skipped(copy_samples, caplog):
    en = copy_samples / "aslg_pc12" / "ENG-ASL_test_0.046.en"
    lines = en.read_text().splitlines()
    lines[2] = "   "
    en.write_text("\n".join(lines) + "\n")
    conll = copy_samples / "conll2003" / "valid.txt"
    rows = conll.read_text().split("\n")
    rows[2] = rows[2].rsplit(" ", 1)[0] + " B-PERSON"  # first token of the first sentence
    conll.write_text("\n".join(rows))
    with caplog.at_level(logging.WARNING):
        gloss = task_on("gloss", copy_samples)
        assert len(gloss.corpus["test"]) == 11
        conll_task = task_on("conll", copy_samples)
        assert len(conll_task.corpus["dev"]) == 8  # 10 sentences: one without entity, one bad
        assert conll_task.skips.as_dict()["malformed_line"] == 1
    assert gloss.skips.as_dict() == {"empty_text": 1}
    assert "ENG-ASL_test_0.046.en:3: row skipped (empty_text)" in caplog.text
    assert "valid.txt:3: row skipped (malformed_line)" in caplog.text
    assert "B-PERSON" in caplog.text


# ----- split policy ----------------------------------------------------------------------
@pytest.mark.parametrize("name", TASKS)
def test_splits_are_disjoint_and_deterministic(name):
    splits = task_on(name, None).splits()
    parts = {
        "train": splits.train,
        "dev": splits.dev,
        "fewshot": splits.fewshot,
        "test": splits.test_pool,
    }
    inputs = {key: {ex.input for ex in part} for key, part in parts.items()}
    for a in parts:
        for b in parts:
            if a < b:
                assert not inputs[a] & inputs[b], f"{name}: {a} and {b} share inputs"
    assert all(parts.values()), f"{name}: an empty split: { {k: len(v) for k, v in parts.items()} }"
    again = task_on(name, None).splits()
    assert again.train == splits.train and again.dev == splits.dev
    assert again.fewshot == splits.fewshot and again.test_pool == splits.test_pool


def test_split_sizes_follow_config_and_seed():
    small = task_on("gloss", None, "task.train_size=5", "task.dev_size=4", "task.num_fewshot=3")
    splits = small.splits()
    assert (len(splits.train), len(splits.dev), len(splits.fewshot)) == (5, 4, 3)
    other = task_on("gloss", None, "task.train_size=5", "data.split_seed=7").splits()
    assert [ex.uid for ex in other.train] != [ex.uid for ex in splits.train]


def test_test_sets_are_seeded_and_reproducible():
    task = task_on("conll", None)
    sets = task.test_sets(num_sets=3, size=4, seed=10)
    assert [len(s) for s in sets] == [4, 4, 4]
    assert sets == task.test_sets(num_sets=3, size=4, seed=10)
    assert sets[0] != sets[1]
    pool = set(task.splits().test_pool)
    assert all(set(s) <= pool for s in sets)


def _task_with_pool(size: int):
    """The conll task with a test pool of `size` synthetic examples."""
    task = task_on("conll", None)
    pool = [Example(f"t:{i}", f"text {i}", "") for i in range(size)]
    task._splits = Splits(train=[], dev=[], fewshot=[], test_pool=pool)
    return task


def test_test_sets_of_different_seeds_share_no_example():
    task = _task_with_pool(1200)
    drawn = {
        (seed, i): {ex.uid for ex in test_set}
        for seed in range(4)
        for i, test_set in enumerate(task.test_sets(3, 100, seed))
    }
    assert all(len(ids) == 100 for ids in drawn.values())
    pairs = [(a, b) for a in drawn for b in drawn if a < b]
    assert all(not drawn[a] & drawn[b] for a, b in pairs)
    assert drawing_note(3, 100, 3, 1200, "disjoint") == ""
    # the drawing before: seed 1's first set is seed 0's second, and it stays reproducible
    old = {s: task.test_sets(3, 100, s, "seed_plus_index") for s in (0, 1)}
    assert old[1][0] == old[0][1]
    assert "Random(seed+i)" in drawing_note(3, 100, 0, 1200, "seed_plus_index")


def test_disjoint_test_sets_are_nested_in_the_number_of_sets_and_wrap_with_a_note():
    task = _task_with_pool(250)
    assert task.test_sets(2, 50, 0) == task.test_sets(5, 50, 0)[:2]
    wrapped = task.test_sets(3, 100, 0)  # 300 examples wanted from 250
    assert all(len({ex.uid for ex in s}) == 100 for s in wrapped)
    assert {ex.uid for ex in wrapped[2]} & {ex.uid for ex in wrapped[0]}
    note = drawing_note(3, 100, 0, 250, "disjoint")
    assert "250" in note and "share examples" in note


def test_example_ids_are_relative_to_the_data_directory(tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(SAMPLES_DIR, copy)
    here = task_on("conll", None).splits().test_pool
    there = task_on("conll", copy).splits().test_pool
    assert [ex.uid for ex in there] == [ex.uid for ex in here]
    assert here[0].uid.startswith("conll2003/") and ":" in here[0].uid
    # older results held the absolute path: normalised to the same id
    assert relative_uid(f"{copy}/{here[0].uid}", copy) == here[0].uid
    assert relative_uid("eriktks/conll2003:test:3", copy) == "eriktks/conll2003:test:3"


def test_validation_slice_reaches_val_size_beyond_the_calibration_dev_split(caplog):
    """The dev split (calibration) keeps task.dev_size inputs; the dev validation slice is it
    followed by the rest of the dev pool, up to train.val_size (default 200), and the log says
    how many inputs come from each (the splits' own line names the dev split's 24 only)."""
    from grammarrl.data.sources import SkipLog
    from grammarrl.data.splits import make_splits
    from grammarrl.training.datamodule import DataSettings, GrammarRLDataModule

    def pool(kind: str, n: int) -> list[Example]:
        return [Example(f"{kind}:{i}", f"{kind} text {i}", "t") for i in range(n)]

    splits = make_splits(
        {"train": pool("train", 50), "dev": pool("dev", 300), "test": pool("test", 10)},
        train_size=40,
        dev_size=24,
        num_fewshot=0,
        pick_fewshot=lambda p, k: [],
        seed=0,
        skips=SkipLog("toy"),
        task="toy",
    )
    assert len(splits.dev) == 24 and len(splits.dev_reserve) == 276
    assert not set(splits.dev) & set(splits.dev_reserve)
    cfg = compose_config([])
    assert cfg.train.val_size == 200

    class Toy:
        name = "toy"

        def splits(self):
            return splits

    module = GrammarRLDataModule(Toy(), DataSettings.from_config(cfg))
    with caplog.at_level("INFO", logger="grammarrl.training.datamodule"):
        module.setup()
    assert "dev validation slice 200 inputs (24 of the dev split, 176 more of the dev pool)" in (
        caplog.text
    )
    assert module.val_names == ("train", "dev") and module.val[0] == splits.train[:200]
    assert module.val[1][:24] == splits.dev and len(module.val[1]) == 200
    dev_only_cfg = compose_config(["train.val_train_slice=false"])
    dev_only = GrammarRLDataModule(Toy(), DataSettings.from_config(dev_only_cfg))
    dev_only.setup()
    assert dev_only.val_names == ("dev",) and dev_only.val == (module.val[1],)


def test_partition_sizes_and_determinism():
    pool = [Example(str(i), f"text {i}", "t") for i in range(1000)]
    parts = partition(pool, dev_size=100, test_fraction=0.5, seed=3)
    assert {k: len(v) for k, v in parts.items()} == {"dev": 100, "test": 450, "train": 450}
    assert parts == partition(pool, dev_size=100, test_fraction=0.5, seed=3)
    assert len({ex.uid for part in parts.values() for ex in part}) == 1000
    tiny = partition(pool[:30], dev_size=100, test_fraction=0.5, seed=3)
    assert len(tiny["dev"]) == 3  # at most a tenth of a small pool goes to dev


# ----- hints -----------------------------------------------------------------------------
def test_top_k_orders_by_similarity():
    items = np.array([[1, 0], [0.8, 0.6], [0, 1]], dtype=np.float32)
    queries = np.array([[0, 1], [1, 0.1]], dtype=np.float32)
    assert top_k(queries, items, 2).tolist() == [[2, 1], [0, 1]]


def test_hint_index_caches_on_disk_keyed_by_k(tmp_path):
    vocab = {"animals": ["cat", "dog", "eagle"], "tools": ["hammer", "saw"]}
    axes = {
        "cat": [1, 0, 0],
        "dog": [0.9, 0.1, 0],
        "eagle": [0, 1, 0],
        "hammer": [0, 0, 1],
        "saw": [0, 0.2, 0.9],
        "my cat": [1, 0, 0.1],
        "a bird and a saw": [0, 0.7, 0.7],
    }
    calls = []

    def encoder(texts, is_query):
        calls.append((tuple(texts), is_query))
        vectors = np.array([axes[t] for t in texts], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def index(k):
        return HintIndex("demo", vocab, k, "fake", tmp_path, "key", encoder=encoder)

    first = index(2)
    assert first.ensure(["my cat", "a bird and a saw"]) == 2
    assert first.get("my cat") == {"animals": ["cat", "dog"], "tools": ["hammer", "saw"]}
    assert first.path.is_file() and "-k2" in first.path.name
    n_calls = len(calls)
    second = index(2)  # a new process would find everything on disk
    assert second.get("a bird and a saw")["animals"][0] == "eagle"
    assert second.ensure(["my cat"]) == 0 and len(calls) == n_calls
    third = index(1)  # another k: another cache file, vocabulary embeddings reused
    assert third.path != first.path
    assert third.get("my cat") == {"animals": ["cat"], "tools": ["hammer"]}
    assert all(is_query for _, is_query in calls[n_calls:])


def test_two_processes_filling_one_hint_cache_at_once_both_succeed(tmp_path, monkeypatch):
    """DDP ranks start their first step together and fill the same hint cache: here the other
    rank writes its whole cache between this one's write and rename. With one shared staging
    file (`<cache>.tmp`), the other rank renamed it away and this one crashed."""
    vocab = {"animals": ["cat", "dog"]}

    def encoder(texts, is_query):
        return np.eye(2, dtype=np.float32)[[len(t) % 2 for t in texts]]

    this, other = (
        HintIndex("demo", vocab, 1, "fake", tmp_path, "key", encoder=encoder) for _ in "ab"
    )
    real_replace, interleaved = os.replace, []

    def replace(source, target):
        if not interleaved:
            interleaved.append(target)
            other.ensure(["my cat"])
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    assert this.ensure(["my cat"]) == 1
    assert interleaved and this.get("my cat") == other.get("my cat") == {"animals": ["cat"]}
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_minilm_hints_on_the_conll_sample(tmp_path):
    """The offline embedder finds the sentence's own spans among the nearest ones."""
    cfg = compose_config(
        ["task=conll", "data.dir=null", f"cache_dir={tmp_path}", "task.num_hints=3"]
    )
    task = load_task(cfg)
    example = next(ex for ex in task.splits().test_pool if "Tarvik" in ex.input)
    hints = task.hints(example)
    assert set(hints) == {"person", "organization", "location", "misc"}
    assert all(len(spans) == 3 for spans in hints.values())
    assert "Tarvik" in hints["location"]
    assert "Helios Air" in hints["organization"]
    assert (tmp_path / "embedders" / "all-MiniLM-L6-v2" / "modules.json").is_file()
    assert task.hint_index.path.is_file()


# ----- hub source (offline: the hub call is replaced by a small fake) ---------------------
class _FakeSplit(list):
    def __init__(self, rows, names=None):
        super().__init__(rows)
        feature = type("F", (), {"names": names})()
        self.features = {"ner_tags": type("S", (), {"feature": feature})()}


def test_hub_rows_become_examples(monkeypatch):
    from grammarrl.tasks import conll, gloss

    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    sentence = {"tokens": ["Ann", "Lee", "visits", "Oslo", "."], "ner_tags": [1, 2, 0, 5, 0]}
    conll_data = {split: _FakeSplit([sentence], names) for split in ("train", "validation", "test")}
    gloss_data = _FakeSplit(
        [{"text": f"we meet on day {i} .", "gloss": f"X-WE MEET ON DAY {i} ."} for i in range(5000)]
    )
    monkeypatch.setattr(conll, "load_hub_dataset", lambda name, **kw: conll_data)
    monkeypatch.setattr(gloss, "load_hub_dataset", lambda name, **kw: gloss_data)

    task = load_task(compose_config(["task=conll", "data.source=hub"]))
    assert task.corpus["test"][0].target == (
        '{"person": "Ann Lee", "organization": "", "location": "Oslo", "misc": ""}'
    )
    assert task.corpus["test"][0].uid == "eriktks/conll2003:test:0"
    gloss_task = load_task(compose_config(["task=gloss", "data.source=hub"]))
    sizes = {split: len(pool) for split, pool in gloss_task.corpus.items()}
    assert sizes == {"train": 5000 - 2045 - 2046, "dev": 2045, "test": 2046}
    assert gloss_task.corpus["dev"][0].target.startswith("WE-X MEET ON DAY")
    with pytest.raises(DataError, match="WoS label names"):
        load_task(compose_config(["task=wos", "data.source=hub"])).splits()
