"""task=custom: a task defined from configuration alone (grammarrl/tasks/custom.py).

Each constraint kind compiles and constrains decoding on the tiny model; each bad specification
fails before any model is loaded with a message naming the key, file or line; CSV and JSONL;
the one-file split; the metrics on hand-computed cases; unlabelled data trains.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.errors import ConfigError, DataError
from grammarrl.job import validate
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.tasks import load_task
from grammarrl.tasks.custom import CustomTask
from grammarrl.tasks.custom_grammar import ByteGrammarChecker
from grammarrl.tasks.custom_metrics import exact_match, json_fields_prf
from grammarrl.tasks.custom_spec import json_schema_of
from grammarrl.types import Example
from tests.conftest import compose_config
from tests.support.decoding import EndBias, check_validity

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = ["billing", "shipping", "technical"]
SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"enum": CATEGORIES},
        "urgent": {"type": "boolean"},
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["category", "urgent", "items"],
}
REGEX = r"[A-C][0-9]{2}"
LARK = 'start: WORD (" " WORD)?\nWORD: "yes" | "no" | "maybe"\n'
LARK_RE = re.compile(r"(yes|no|maybe)( (yes|no|maybe))?")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def ticket(i: int) -> dict:
    return {"category": CATEGORIES[i % 3], "urgent": i % 2 == 0, "items": i % 10}


def rows(n: int, labelled: int, gold=ticket) -> list[dict]:
    """n rows `{"text": ...}`, the first `labelled` of them with a gold output `label`."""
    return [
        {
            "text": f"message number {i} about order {1000 + i}",
            **({"label": gold(i)} if i < labelled else {}),
        }
        for i in range(n)
    ]


def spec_file(tmp_path: Path, **keys) -> Path:
    """A spec YAML in tmp_path; defaults: train.jsonl (40 rows, 20 labelled tickets), the
    schema, an instruction, a dev file."""
    if not (tmp_path / "train.jsonl").exists():
        write_jsonl(tmp_path / "train.jsonl", rows(40, 20))
    if not (tmp_path / "dev.jsonl").exists():
        write_jsonl(tmp_path / "dev.jsonl", [{"text": f"dev message {i}"} for i in range(4)])
    values = {
        "name": "tickets",
        "train": "train.jsonl",
        "dev": "dev.jsonl",
        "input_field": "text",
        "output_field": "label",
        "json_schema": SCHEMA,
        "instruction": "Read the support message and fill in the ticket.",
        **keys,
    }
    values = {k: v for k, v in values.items() if v is not None}
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return path


def config(spec: Path, *overrides: str):
    return compose_config(["task=custom", f"task.spec={spec}", "model=tiny", *overrides])


def task_of(spec: Path, *overrides: str) -> CustomTask:
    cfg = config(spec, *overrides)
    validate(cfg)
    task = load_task(cfg)
    assert isinstance(task, CustomTask)
    return task


# ---------------------------------------------------------------------- constraints


def label_for(kind: str):
    return {
        "json_schema": ticket,
        "regex": lambda i: f"B{i:02d}",
        "lark": lambda i: ["yes", "no maybe"][i % 2],
        "choices": lambda i: CATEGORIES[i % 3],
    }[kind]


def independent_check(kind: str, text: str) -> None:
    """The output, checked without llguidance."""
    if kind == "json_schema":
        value = json.loads(text)
        assert list(value) == ["category", "urgent", "items"], text  # schema order, closed
        assert value["category"] in CATEGORIES and isinstance(value["urgent"], bool)
        assert isinstance(value["items"], int) and 0 <= value["items"] <= 9
        assert text == json.dumps(value)  # one line, ", " and ": "
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "lark":
        assert LARK_RE.fullmatch(text), text
    else:
        assert text in CATEGORIES, text


@pytest.mark.parametrize("kind", ["json_schema", "regex", "lark", "choices"])
def test_each_constraint_compiles_and_constrains_decoding(tmp_path, tiny, kind):
    model, tok = tiny
    write_jsonl(tmp_path / "train.jsonl", rows(40, 20, label_for(kind)))
    constraint = {"json_schema": SCHEMA, "regex": REGEX, "lark": LARK, "choices": CATEGORIES}
    keys = dict.fromkeys(("json_schema", "regex", "lark", "choices"))
    keys[kind] = constraint[kind]
    task = task_of(spec_file(tmp_path, **keys, num_fewshot=2))
    assert task.gold_rejected == (
        0,
        20 if kind in ("json_schema", "regex") else {"lark": 2, "choices": 3}[kind],
    )
    examples = task.test_sets(1, 3, 0)[0]
    prompts = [encode_prompt(tok, task.forward_messages(ex)) for ex in examples]
    biased = EndBias(model, end_of_turn_id(tok), bias=6.0)
    decoder = ConstrainedDecoder(biased, tok, task.grammar(), max_new_tokens=40)
    groups = decoder.rollout(
        prompts,
        num_samples=16,
        beam_width=2,
        generator=torch.Generator().manual_seed(0),
        length_penalty=1.0,
    )
    gens = [g for group in groups for g in group] + decoder.greedy(prompts)
    finished = check_validity(task, tok, gens, 40)
    assert finished >= 0.8 * len(gens)
    for gen in gens:
        if gen.finished:
            independent_check(kind, gen.text)
    for text in {
        "json_schema": [
            '{"category":"billing","urgent":true,"items":1}',
            '{"category": "refund", "urgent": true, "items": 1}',
        ],
        "regex": ["B1", "D12"],
        "lark": ["yes no no", "yes "],
        "choices": ["bill", "billing "],
    }[kind]:
        with pytest.raises(ValueError):
            task.parse(text)


def test_pydantic_model_schema(tmp_path, tiny):
    """A Pydantic model's schema ($defs for the enum) is a json_schema; outputs validate."""
    from enum import Enum

    from pydantic import BaseModel, Field

    class Category(str, Enum):
        billing = "billing"
        shipping = "shipping"

    class Ticket(BaseModel):
        category: Category
        urgent: bool
        items: int = Field(ge=0, le=9)

    model, tok = tiny
    write_jsonl(
        tmp_path / "train.jsonl",
        rows(40, 20, lambda i: {"urgent": True, "category": "billing", "items": 2}),
    )
    task = task_of(spec_file(tmp_path, json_schema=json_schema_of(Ticket)))
    assert task.gold_rejected == (0, 1)
    assert task.splits().fewshot[0].target == '{"category": "billing", "urgent": true, "items": 2}'
    decoder = ConstrainedDecoder(model, tok, task.grammar(), max_new_tokens=40)
    prompts = [encode_prompt(tok, task.forward_messages(ex)) for ex in task.splits().test_pool]
    samples = decoder.sample(prompts[:2], num_samples=8, generator=torch.Generator().manual_seed(1))
    texts = [g.text for group in samples for g in group if g.finished]
    assert len(texts) >= 8
    for text in texts:
        Ticket.model_validate_json(text)  # raises if invalid
        assert set(json.loads(text)) == {"category", "urgent", "items"}  # closed: no extra keys


# ---------------------------------------------------------------------- bad specifications


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            {"json_schema": None},
            r"task\.json_schema, task\.regex, task\.lark, task\.choices: .*none",
        ),
        ({"regex": "[0-9]+"}, r"^task\.json_schema, task\.regex: .*several are set"),
        (
            {"json_schema": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            r"^task\.json_schema: llguidance cannot compile it: .*Invalid type: strin",
        ),
        ({"json_schema": "missing.json"}, r"^task\.json_schema=.*missing\.json: no such file"),
        (
            {"json_schema": None, "regex": "[0-9"},
            r"^task\.regex: llguidance cannot compile it: invalid regex .* unclosed character class$",
        ),
        (
            {"json_schema": None, "lark": "start: foo\n"},
            r"^task\.lark: llguidance cannot compile it: at 1\(8\): unknown name: \"foo\"$",
        ),
        (
            {"json_schema": None, "lark": "grammar.lark"},
            r"^task\.lark=.*grammar\.lark: no such file",
        ),
        ({"json_schema": None, "choices": []}, r"^task\.choices=\[\] is invalid"),
        (
            {"json_schema": None, "choices": ["a", 3]},
            r"^task\.choices=.*expected a list of non-empty",
        ),
        ({"train": "nowhere.jsonl"}, r"^task\.train=.*nowhere\.jsonl: no such file"),
        ({"dev": "dev.txt"}, r"^task\.dev=.*dev\.txt: no such file"),
        ({"instruction": None}, r"^task\.instruction is required"),
        ({"metric": "f1"}, r"^task\.metric='f1' is invalid"),
        (
            {"json_schema": None, "regex": "a", "metric": "json_fields_f1"},
            r"^task\.metric=json_fields_f1 .* needs task\.json_schema, not task\.regex",
        ),
        ({"name": "conll"}, r"^task\.name='conll' is invalid for a custom task"),
        ({"num_hints": 5}, r"^task\.num_hints=5: hints are not supported"),
        (
            {"inptu_field": "text"},
            (
                r"^task\.spec=.*task\.yaml: task\.inptu_field: unknown config "
                r"key \(did you mean task\.input_field"
            ),
        ),
    ],
)
def test_bad_specification_names_the_key(tmp_path, keys, message):
    cfg = config(spec_file(tmp_path, **keys))
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_bad_spec_cases_without_a_spec_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^task=custom needs task\.spec=FILE"):
        validate(compose_config(["task=custom"]))
    with pytest.raises(ConfigError, match=r"^task\.spec=.*nope\.yaml: no such file"):
        validate(compose_config(["task=custom", f"task.spec={tmp_path}/nope.yaml"]))
    with pytest.raises(ConfigError, match=r"^task\.regex is read by task=custom only"):
        validate(compose_config(["task=conll", "+task.regex='[0-9]+'"]))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"^task\.spec=.*list\.yaml: expected a mapping"):
        validate(compose_config(["task=custom", f"task.spec={tmp_path}/list.yaml"]))


def test_cli_refuses_a_bad_spec_in_one_line(tmp_path):
    """`python -m grammarrl.run` stops with exit 2 and one line naming the key, before Hydra
    starts (no run directory is made) and before any model is loaded."""
    spec = spec_file(tmp_path, regex="[0-9]+")
    proc = subprocess.run(
        [sys.executable, "-m", "grammarrl.run", "task=custom", f"task.spec={spec}", "model=tiny"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        (
            "error: task.json_schema, task.regex: a custom task needs exactly one output constraint "
            "(several are set: keep one)"
        )
    ]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"text": "a"}\n{"txt": "b"}\n',
            (
                r"train\.jsonl:2: no 'text' \(task\.input_field\) in "
                r"this row \(fields: txt\)"
            ),
        ),
        ('{"text": "a"}\n\n{"text": ""}\n', r"train\.jsonl:3: no 'text'"),
        ('{"text": "a"}\n{"text": "b",\n', r"train\.jsonl:2: not a JSON object"),
        (
            '{"text": "a", "label": "{not json"}\n',
            (
                r"train\.jsonl:1: 'label' "
                r"\(task\.output_field\) is not JSON"
            ),
        ),
    ],
)
def test_bad_rows_stop_with_file_and_line(tmp_path, content, message):
    spec = spec_file(tmp_path)
    (tmp_path / "train.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        task_of(spec)


def test_demonstrations_need_outputs(tmp_path):
    write_jsonl(tmp_path / "demos.jsonl", [{"text": "x", "label": ticket(0)}, {"text": "y"}])
    task_cfg = config(spec_file(tmp_path, demonstrations="demos.jsonl", num_fewshot=2))
    with pytest.raises(DataError, match=r"demos\.jsonl:2: a demonstration needs its output"):
        load_task(task_cfg)


def test_gold_outputs_the_grammar_rejects_are_counted_and_warned(tmp_path, caplog):
    data = rows(40, 20)
    data[3]["label"] = {"category": "refund", "urgent": True, "items": 1}  # not in the enum
    data[5]["label"] = {"category": "billing", "urgent": True}  # a required field missing
    write_jsonl(tmp_path / "train.jsonl", data)
    with caplog.at_level(logging.WARNING, logger="grammarrl.tasks.custom"):
        task = task_of(spec_file(tmp_path))
    assert task.gold_rejected == (2, 20)
    (line,) = [r.message for r in caplog.records if "rejects" in r.message]
    assert "rejects 2 of 20 distinct gold outputs" in line and "train.jsonl:4" in line


# ---------------------------------------------------------------------- files and splits


def test_csv_and_tsv_rows_with_their_lines(tmp_path):
    (tmp_path / "train.csv").write_text(
        'text,label\n"first, with a comma",B01\n"a message\nover two lines",C02\nthird,\n'
    )
    task = task_of(
        spec_file(tmp_path, train="train.csv", json_schema=None, regex=REGEX, num_fewshot=1)
    )
    train = task.examples["train"]
    assert [(ex.uid.rsplit(":", 1)[1], ex.input, ex.target) for ex in train] == [
        ("2", "first, with a comma", "B01"),
        ("3", "a message over two lines", "C02"),
        ("5", "third", ""),
    ]
    (tmp_path / "bad.tsv").write_text("text\tlabel\nok\tA01\n\tA02\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: no 'text'"):
        task_of(spec_file(tmp_path, train="bad.tsv", json_schema=None, regex=REGEX))


def test_one_file_split(tmp_path):
    """One file: the first k labelled rows are the demonstrations; dev_size rows (at most a
    tenth) of the others are dev; test_fraction of the labelled rows left is the test pool."""
    write_jsonl(tmp_path / "train.jsonl", rows(80, 40))
    spec = spec_file(tmp_path, dev=None, num_fewshot=2, dev_size=3)
    task = task_of(spec)
    s = task.splits()
    inputs = {
        name: [ex.input for ex in part]
        for name, part in (
            ("train", s.train),
            ("dev", s.dev),
            ("fewshot", s.fewshot),
            ("test", s.test_pool),
        )
    }
    assert inputs["fewshot"] == [
        "message number 0 about order 1000",
        "message number 1 about order 1001",
    ]
    labelled_left = 38 - sum(bool(ex.target) for ex in s.dev)
    assert len(s.test_pool) == round(0.5 * labelled_left) and all(ex.target for ex in s.test_pool)
    assert len(s.dev) == 3 and len(s.train) == 80 - 2 - 3 - len(s.test_pool)
    every = [x for part in inputs.values() for x in part]
    assert len(set(every)) == len(every) == 80  # disjoint, nothing lost
    assert [ex.input for ex in task_of(spec).splits().test_pool] == inputs["test"]  # seeded
    other = task_of(spec, "data.split_seed=1").splits().test_pool
    assert [ex.input for ex in other] != inputs["test"]


def test_a_small_labelled_file_keeps_a_tenth_for_dev_and_warns_once(tmp_path, caplog):
    """160 labelled rows, no dev or test file, the default sizes: dev is held out first (a
    tenth: 15, not 7 of what the test pool left), the test pool is half of the rest, training
    takes all the others without a warning about the default train_size, and the short dev
    split is warned about once."""
    write_jsonl(tmp_path / "train.jsonl", rows(160, 160))
    with caplog.at_level(logging.WARNING):
        s = task_of(spec_file(tmp_path, dev=None)).splits()
    assert (len(s.fewshot), len(s.dev), len(s.test_pool), len(s.train)) == (3, 15, 71, 71)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == ["tickets dev: 100 examples wanted, only 15 available: using all"]


def test_spec_overrides_are_logged_once_per_job(tmp_path, caplog):
    spec = spec_file(tmp_path, max_new_tokens=24)
    cfg = config(spec, "task.max_new_tokens=50")
    with caplog.at_level(logging.INFO):
        validate(cfg)
        load_task(cfg)
    line = f"task.max_new_tokens=50 (command line) overrides {spec}'s 24"
    assert [r.getMessage() for r in caplog.records].count(line) == 1


def test_a_custom_tasks_run_directory_is_named_after_its_spec(tmp_path):
    """hydra.run.dir names the task of the spec (its `name:`), not the config group `custom`;
    a task.name given on the command line wins, as in the merged config."""
    from hydra import compose, initialize_config_dir

    import grammarrl.run  # noqa: F401  (registers the run directory's resolver)
    from grammarrl.config.checks import CONF_DIR

    def run_dir(*overrides: str) -> str:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", [*overrides, "model=tiny"], return_hydra_config=True)
        return str(cfg.hydra.run.dir)

    spec = f"task.spec={spec_file(tmp_path)}"
    assert run_dir("task=custom", spec).endswith("_tickets_tiny_train")
    assert run_dir("task=custom", spec, "task.name=mine").endswith("_mine_tiny_train")
    assert run_dir("task=conll").endswith("_conll_tiny_train")


def test_a_custom_task_is_built_by_the_corpus_tasks_init(tmp_path, monkeypatch):
    """CustomTask sets up through CorpusTask.__init__ (its own files as the data root), not a
    copy of it: the cache directory, split seed and skip log come from the one place."""
    from grammarrl.tasks.common import CorpusTask

    built = []
    real = CorpusTask.__init__

    def init(self, cfg):
        built.append(type(self).__name__)
        real(self, cfg)

    monkeypatch.setattr(CorpusTask, "__init__", init)
    task = task_of(spec_file(tmp_path), f"cache_dir={tmp_path / 'cache'}", "data.split_seed=3")
    assert built == ["CustomTask"]
    assert (task.source, task.root, task.seed) == ("local", tmp_path.resolve(), 3)
    assert task.cache_dir == tmp_path / "cache"


def test_given_dev_and_test_files(tmp_path):
    """A test file keeps its labelled rows only (when it has some); the dev file is used whole."""
    write_jsonl(
        tmp_path / "test.jsonl", [{**row, "text": f"test {row['text']}"} for row in rows(6, 4)]
    )
    spec = spec_file(tmp_path, test="test.jsonl", num_fewshot=1)
    s = task_of(spec).splits()
    assert len(s.test_pool) == 4 and len(s.dev) == 4 and len(s.train) == 39
    assert s.skipped == {"unlabelled_test_row": 2}


def test_too_few_rows_for_a_dev_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", rows(8, 4))
    with pytest.raises(DataError, match=r"no dev inputs from train .*give task\.dev"):
        task_of(spec_file(tmp_path, dev=None))


def test_data_files_under_the_data_and_cache_directories(tmp_path):
    """`<data>/PATH` is read from data.dir and `<cache>/PATH` from cache_dir, not from the
    spec's folder; the config keeps the paths as written (the same on every machine)."""
    corpus, derived = tmp_path / "data" / "corpus", tmp_path / "cache" / "derived"
    corpus.mkdir(parents=True)
    derived.mkdir(parents=True)
    write_jsonl(
        corpus / "rows.jsonl", [{**row, "text": f"corpus {row['text']}"} for row in rows(40, 20)]
    )
    write_jsonl(derived / "dev.jsonl", [{"text": "derived dev message"}])
    spec = spec_file(tmp_path, train="<data>/corpus/rows.jsonl", dev="<cache>/derived/dev.jsonl")
    cfg = config(spec, f"data.dir={tmp_path / 'data'}", f"cache_dir={tmp_path / 'cache'}")
    validate(cfg)
    assert (cfg.task.train, cfg.task.dev) == (
        "<data>/corpus/rows.jsonl",
        "<cache>/derived/dev.jsonl",
    )
    task = load_task(cfg)
    assert task.spec.files == {"train": corpus / "rows.jsonl", "dev": derived / "dev.jsonl"}
    assert task.examples["train"][0].input == "corpus message number 0 about order 1000"
    assert task.examples["train"][0].uid == "rows.jsonl:1"  # relative to the train file's folder
    assert [ex.input for ex in task.splits().dev] == ["derived dev message"]


def test_a_data_file_needs_the_data_directory_and_the_file(tmp_path):
    spec = spec_file(tmp_path, train="<data>/corpus/rows.jsonl")
    with pytest.raises(
        ConfigError,
        match=(
            r"^task\.train=<data>/corpus/rows\.jsonl: data\.dir is not set \(give data\.dir=DIR "
            r"or set GRAMMARRL_DATA_DIR\): <data>/ names a file under it$"
        ),
    ):
        validate(config(spec, "data.dir=null"))
    missing = re.escape(str(tmp_path / "corpus" / "rows.jsonl"))
    with pytest.raises(
        ConfigError,
        match=rf"^task\.train=<data>/corpus/rows\.jsonl: no such file {missing} \(data\.dir=",
    ):
        validate(config(spec, f"data.dir={tmp_path}"))


def test_spec_values_merge_under_the_command_line(tmp_path):
    spec = spec_file(tmp_path, max_new_tokens=24, lr=3e-5, num_fewshot=1)
    cfg = config(spec, "task.max_new_tokens=50")
    validate(cfg)
    assert cfg.task.max_new_tokens == 50  # the command line wins
    assert cfg.task.num_fewshot == 1 and cfg.optim.lr == pytest.approx(3e-5)  # the spec's
    assert cfg.task.train == str((tmp_path / "train.jsonl").resolve())  # from the spec's folder
    assert cfg.task.name == "tickets" and dict(cfg.task.sigmas) == {}
    validate(cfg)  # idempotent
    assert cfg.task.max_new_tokens == 50 and cfg.task.num_fewshot == 1


def test_the_command_lines_config_trains_with_the_specs_batch_lr_and_steps(tmp_path):
    """A single run's config is resolved before its job starts (`compose_job_config`): the
    spec's batch_size, lr and max_steps reach optim.* and trainer.max_steps there too, as in a
    sweep's jobs; a value on the command line still wins."""
    from grammarrl.job import compose_job_config

    spec = spec_file(tmp_path, batch_size=2, lr=3e-5, max_steps=12)
    cfg = compose_job_config(["task=custom", f"task.spec={spec}", "model=tiny"])
    validate(cfg)
    assert (cfg.optim.batch_size, cfg.optim.lr, cfg.trainer.max_steps) == (2, 3e-5, 12)
    given = compose_job_config(
        ["task=custom", f"task.spec={spec}", "model=tiny", "optim.batch_size=3"]
    )
    assert (given.optim.batch_size, given.trainer.max_steps) == (3, 12)


def test_prompts_default_reverse_instruction_and_output_format(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", rows(40, 20, label_for("choices")))
    task = task_of(
        spec_file(tmp_path, json_schema=None, choices=CATEGORIES, num_fewshot=1, output_format="")
    )
    demo = task.splits().fewshot[0]
    forward = task.forward_messages(Example("q", "where is my parcel", ""))
    assert forward == [
        {"role": "system", "content": "Read the support message and fill in the ticket."},
        {"role": "user", "content": demo.input},
        {"role": "assistant", "content": demo.target},
        {"role": "user", "content": "where is my parcel"},
    ]
    reverse = task.reverse_messages("shipping")
    assert reverse[0]["content"].startswith("Given the output of the task below, reconstruct")
    assert reverse[0]["content"].endswith("Task: Read the support message and fill in the ticket.")
    assert reverse[1:] == [
        {"role": "user", "content": demo.target},
        {"role": "assistant", "content": demo.input},
        {"role": "user", "content": "shipping"},
    ]
    task = task_of(
        spec_file(
            tmp_path,
            json_schema=None,
            choices=CATEGORIES,
            output_format=None,
            reverse_instruction="Write the message.",
        )
    )
    assert task.system_prompt(demo).endswith(
        "Answer with exactly one of: billing | shipping | technical"
    )
    assert task.reverse_messages("x")[0]["content"] == "Write the message."


# ---------------------------------------------------------------------- metrics


def test_exact_match_and_accuracy():
    assert exact_match(["a", None, "b"], ["a", "a", "c"]) == [True, False, False]
    # JSON by value: key order does not matter, 1 and true and 1.0 differ
    assert exact_match(
        [{"a": 1, "b": True}, {"a": True}, {"a": 1.0}], [{"b": True, "a": 1}, {"a": 1}, {"a": 1}]
    ) == [True, False, False]


def scored(tmp_path, kind_keys: dict, metric: str, golds: list[str], predictions: list[str]):
    task = task_of(spec_file(tmp_path, metric=metric, **kind_keys))
    examples = [Example(f"e{i}", f"input {i}", gold) for i, gold in enumerate(golds)]
    return task.score(predictions, examples)


def test_accuracy_counts_labelled_rows_only(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", rows(40, 20, label_for("choices")))
    keys = {"json_schema": None, "choices": CATEGORIES}
    result = scored(
        tmp_path,
        keys,
        "auto",
        ["billing", "shipping", "", "technical"],
        ["billing", "technical", "billing", "nonsense"],
    )
    assert result.metric == "accuracy" and result.value == pytest.approx(1 / 3)
    assert result.details["labelled"] == 3 and result.validity == pytest.approx(3 / 4)
    assert [e.get("correct") for e in result.per_example] == [True, False, None, False]


def test_json_fields_f1_by_hand(tmp_path):
    """Per field, the CoNLL rule; false and 0 are values, null is empty.
    e0: category tp; urgent (gold false) tp; items gold 0 pred 3: fp + fn.
    e1: category gold billing, pred shipping: fp + fn; urgent tp; items tp.
    e2: prediction invalid: fn for its 3 filled gold fields.
    tp 4, fp 2, fn 5: P 4/6, R 4/9, F1 2PR/(P+R) = 8/15."""
    golds = [
        {"category": "billing", "urgent": False, "items": 0},
        {"category": "billing", "urgent": True, "items": 2},
        {"category": "shipping", "urgent": True, "items": 1},
    ]
    preds = [
        {"category": "billing", "urgent": False, "items": 3},
        {"category": "shipping", "urgent": True, "items": 2},
    ]
    result = scored(
        tmp_path, {}, "auto", [json.dumps(g) for g in golds], [json.dumps(p) for p in preds] + ["{"]
    )
    assert result.metric == "json_fields_f1"
    micro = result.details["micro"]
    assert (micro["tp"], micro["fp"], micro["fn"]) == (4, 2, 5)
    assert result.value == pytest.approx(8 / 15)
    assert result.details["items"]["tp"] == 1 and result.details["category"]["fp"] == 1
    assert [(e["tp"], e["fp"], e["fn"]) for e in result.per_example] == [
        (2, 1, 1),
        (2, 1, 1),
        (0, 0, 3),
    ]
    counts = json_fields_prf([{"a": None, "b": ""}], [{"a": "", "b": []}])
    assert counts["micro"].tp + counts["micro"].fp + counts["micro"].fn == 0  # empty vs empty


def test_bleu_with_invalid_outputs_as_empty(tmp_path):
    """Identical outputs: BLEU 1. An output the grammar rejects scores as "": with one of two
    references lost, the 1-4-gram precisions stay 1 and the brevity penalty is exp(1 - 12/6)."""
    write_jsonl(tmp_path / "train.jsonl", rows(40, 20, lambda i: f"order {i}"))
    keys = {"json_schema": None, "regex": r"[a-z0-9]+( [a-z0-9]+)*"}
    golds = ["the parcel for order four never", "please refund my last two payments"]
    assert scored(tmp_path, keys, "bleu", golds, golds).value == pytest.approx(1.0)
    result = scored(tmp_path, keys, "bleu", golds, [golds[0], golds[1].upper()])
    assert result.value == pytest.approx(math.exp(1 - 12 / 6))
    assert result.validity == pytest.approx(1 / 2)


def test_byte_checker_is_the_grammar_language():
    checker = ByteGrammarChecker(LARK)
    assert checker.accepts("maybe no") and checker.accepts("no")
    assert not checker.accepts("no ") and not checker.accepts("")


# ---------------------------------------------------------------------- unlabelled training


def test_unlabelled_data_trains_and_reports_the_metric_unavailable(tmp_path, monkeypatch):
    """No gold output anywhere: σ's are calibrated on the dev inputs, two RL steps run, the
    adapter is saved and evaluated; the metric is `exact_match_unavailable`, NaN."""
    from grammarrl.training.train import run_train

    write_jsonl(
        tmp_path / "train.jsonl", [{"text": f"ticket {i} for order {i}"} for i in range(40)]
    )
    spec = spec_file(
        tmp_path, json_schema=None, regex=REGEX, output_field=None, num_fewshot=0, name="codes"
    )
    cfg = config(
        spec,
        "logger=none",
        "trainer.max_steps=2",
        "optim.batch_size=2",
        "task.max_new_tokens=8",
        "task.dev_size=2",
        "trainer.val_check_interval=2",
        "train.val_size=2",
        "train.checkpoint_every_n_steps=2",
        "eval.num_test_sets=1",
        "eval.test_size=3",
        "eval.batch_size=4",
        f"reward.calibration_file={tmp_path}/calibration.json",
    )
    validate(cfg)
    monkeypatch.chdir(tmp_path)
    results = run_train(cfg)
    greedy = results["greedy"]
    assert greedy["task"] == "codes" and greedy["metric"] == "exact_match_unavailable"
    assert math.isnan(greedy["mean"]) and greedy["per_set"][0]["details"]["labelled"] == 0
    assert greedy["num_examples"] == 3
    (entry,) = json.loads((tmp_path / "calibration.json").read_text())["codes/tiny/n3_b3"]
    assert entry["num_inputs"] == 2 and entry["sigma_direct"] > 0  # calibrated on the dev file
    (out,) = (tmp_path / "outputs").glob("*/*")
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    lines = (out / "predictions.jsonl").read_text().splitlines()
    predictions = [json.loads(line) for line in lines]
    assert len(predictions) == 3
    for row in predictions:
        assert row["gold"] == "" and (not row["finished"] or re.fullmatch(REGEX, row["prediction"]))


# ---------------------------------------------------------------------- the shipped example


def load_make_data(folder: Path):
    """An example folder's make_data.py as a module."""
    import importlib.util

    module_spec = importlib.util.spec_from_file_location("make_data", folder / "make_data.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_support_tickets_example_is_reproducible_and_loads(tmp_path):
    """examples/support_tickets: make_data.py writes exactly the committed files; the spec
    loads with its documented splits and every gold ticket is accepted by its schema."""
    folder = ROOT / "examples" / "support_tickets"
    load_make_data(folder).main(tmp_path)
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "demonstrations.jsonl"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name
    task = task_of(folder / "task.yaml")
    s = task.splits()
    assert (task.name, task.metric_name) == ("support_tickets", "json_fields_f1")
    assert (len(s.train), len(s.dev), len(s.fewshot), len(s.test_pool)) == (240, 16, 3, 60)
    assert sum(map(len, task.corpus.values())) == 60 + 60 + 3  # labelled train, test, demos
    assert task.gold_rejected[0] == 0 and task.gold_rejected[1] > 60  # distinct tickets
    assert sum(bool(ex.target) for ex in s.train) == 60


def test_real_data_examples_load_on_the_bundled_samples(tmp_path):
    """examples/wos_parent reads `<data>/wos/...`; examples/conll_persons reads the rows its
    make_data.py derives from `<data>/conll2003` into `<cache>/...` (tests/test_examples_real.py
    checks both on the real data)."""
    from grammarrl.data.sources import SAMPLES_DIR

    wos = task_of(ROOT / "examples" / "wos_parent" / "task.yaml", f"data.dir={SAMPLES_DIR}")
    assert (wos.name, wos.metric_name, wos.spec.kind, wos.vocab_size()) == (
        "wos_parent",
        "accuracy",
        "choices",
        7,
    )
    assert wos.spec.files["train"] == SAMPLES_DIR / "wos" / "wos_labelled.jsonl"
    assert wos.gold_rejected == (0, 7)

    folder = ROOT / "examples" / "conll_persons"
    out = load_make_data(folder).main([f"data.dir={SAMPLES_DIR}", f"cache_dir={tmp_path}"])
    assert out == tmp_path / "examples" / "conll_persons"
    first, second = map(json.loads, (out / "train.jsonl").read_text().splitlines()[:2])
    assert first == {
        "sentence": "Maria Olsen opened the new Nordvik Bank branch in Bergen on Monday .",
        "output": {"persons": ["Maria Olsen"]},
        "source": "conll2003/train.txt:3",
    }
    assert second["output"] == {"persons": []}  # an organisation and a misc entity, no person
    persons = task_of(folder / "task.yaml", f"cache_dir={tmp_path}")
    assert (persons.name, persons.metric_name) == ("conll_persons", "json_fields_f1")
    assert persons.splits().fewshot[0].target == '{"persons": ["Maria Olsen"]}'
    assert persons.gold_rejected[0] == 0
