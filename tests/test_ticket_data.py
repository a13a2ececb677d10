"""The support-ticket example's fresh test split (examples/support_tickets/test_fresh.jsonl):
written by make_data.py with its own seed, disjoint from every earlier message, selected with
`task.test=...` while the committed splits (what the quick start and earlier results read) stay
exactly as they were."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from grammarrl.job import validate
from grammarrl.tasks import load_task
from grammarrl.tasks.grammar_check import GrammarChecker
from tests.conftest import compose_config

FOLDER = Path(__file__).resolve().parents[1] / "examples" / "support_tickets"
FRESH = FOLDER / "test_fresh.jsonl"
# The committed splits, pinned: (rows, labelled rows) and test.jsonl's SHA-256.
EARLIER = {
    "demonstrations.jsonl": (3, 3),
    "train.jsonl": (240, 60),
    "dev.jsonl": (30, 30),
    "test.jsonl": (60, 60),
}
TEST_SHA256 = "a87310b734009ad66b26cee960d11304b0ee2f9fbd7f0050167fbb27d3481d65"


def make_data():
    spec = importlib.util.spec_from_file_location("make_data", FOLDER / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FOLDER / name).read_text().splitlines()]


def plain(text: str) -> str:
    """The text in lower case, letters and digits only (independent of make_data.near_key)."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower().replace("'", "")).split())


def test_earlier_splits_are_unchanged():
    for name, (count, labelled) in EARLIER.items():
        data = rows(name)
        assert (len(data), sum("triage" in row for row in data)) == (count, labelled), name
    digest = hashlib.sha256((FOLDER / "test.jsonl").read_bytes()).hexdigest()
    assert digest == TEST_SHA256


def test_make_data_writes_the_committed_files_and_the_fresh_split(tmp_path):
    module = make_data()
    module.main(tmp_path)
    for name in (*EARLIER, FRESH.name):
        assert (tmp_path / name).read_bytes() == (FOLDER / name).read_bytes(), name
    assert module.FRESH_SEED != module.SEED


def test_fresh_messages_share_no_text_with_earlier_ones():
    """No fresh message repeats an earlier one or another fresh one, not even near-identically:
    same text up to case and punctuation, or the same `near_key` (opener, sign-off, order and
    other numbers aside)."""
    near_key = make_data().near_key
    earlier = [row["message"] for name in EARLIER for row in rows(name)]
    fresh = [row["message"] for row in rows(FRESH.name)]
    assert not {plain(m) for m in fresh} & {plain(m) for m in earlier}
    assert not {near_key(m) for m in fresh} & {near_key(m) for m in earlier}
    assert len({near_key(m) for m in fresh}) == len(fresh)
    # near_key does count such messages as the same
    assert near_key("Hi, I was charged twice for order AB-12345. Thanks.") == near_key(
        "i was charged twice for order CD-67890. cheers, maria"
    )


def test_fresh_rows_are_labelled_for_both_specs():
    data = rows(FRESH.name)
    assert len(data) >= 100
    for row in data:
        ticket = row["ticket"]
        assert row["triage"] == {"category": ticket["category"], "order_id": ticket["order_id"]}
        if ticket["order_id"] is not None:
            assert ticket["order_id"] in row["message"]
    assert {row["ticket"]["category"] for row in data} == {
        "billing",
        "shipping",
        "technical",
        "account",
        "returns",
    }


@pytest.mark.parametrize(
    ("spec", "name"), [("task.yaml", "support_tickets"), ("triage.yaml", "support_triage")]
)
def test_task_test_selects_the_fresh_split(tok, spec, name):
    """`task.test=.../test_fresh.jsonl` on top of either spec: the test pool is the fresh rows
    (the other splits as before), and the task grammar accepts every gold output, byte-level
    and under the tiny model's tokenizer."""
    overrides = ["model=tiny", "task=custom", f"task.spec={FOLDER / spec}"]
    cfg = compose_config([*overrides, f"task.test={FRESH}"])
    validate(cfg)
    task = load_task(cfg)
    s = task.splits()
    assert task.name == name and task.spec.files["test"] == FRESH
    assert (len(s.train), len(s.fewshot), len(s.test_pool)) == (240, 3, len(rows(FRESH.name)))
    assert task.gold_rejected[0] == 0
    golds = [ex.target for ex in s.test_pool]
    assert all(golds) and GrammarChecker(task.grammar(), tok).rejected(golds) == []
    fresh = {row["message"] for row in rows(FRESH.name)}
    assert {ex.input for ex in s.test_pool} == fresh
    # without the override: the committed 60
    default = load_task(compose_config(overrides))
    assert len(default.splits().test_pool) == 60
