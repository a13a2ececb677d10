"""The built-in tasks reproduce the splits, prompts, grammars, parses, metric values and search
potentials recorded in tests/data/task_records.json (bundled samples; the worked custom
example) before the task plugin refactor. Regenerate only for an intended change: `python -m tests.test_task_records`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from grammarrl.errors import ConfigError
from grammarrl.search.potentials import make_potential
from grammarrl.tasks import Example, Task, load_task
from tests.conftest import compose_config

RECORDS = Path(__file__).resolve().parent / "data" / "task_records.json"
REPO = Path(__file__).resolve().parents[1]
RECORDED_TASKS = {  # record name -> config overrides
    "gloss": ["task=gloss"],
    "wos": ["task=wos"],
    "conll": ["task=conll"],
    "support_tickets": ["task=custom", f"task.spec={REPO / 'examples/support_tickets/task.yaml'}"],
}
PROMPTED = 3  # test-pool examples whose prompts are recorded in full


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def _plain(value: Any) -> Any:
    """JSON-ready (tuples, sets and other objects by their repr where JSON has no form), with
    the checkout's location written `<repo>`: uids are `file:line` paths."""
    text = json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)
    return json.loads(text.replace(json.dumps(str(REPO))[1:-1], "<repo>"))


def _predictions(pool: list[Example]) -> list[str]:
    """Gold targets at odd positions, the next example's at even ones, a truncated target
    first and an invalid string last: a metric value strictly between 0 and 1."""
    texts = [ex.target if i % 2 else pool[(i + 1) % len(pool)].target for i, ex in enumerate(pool)]
    texts[0] = pool[0].target[: len(pool[0].target) // 2]
    texts[-1] = "not an output"
    return texts


def _penalties(task: Task, pool: list[Example], predictions: list[str]) -> Any:
    try:
        potential = make_potential("task", task)
    except ConfigError as err:  # a task without a task potential: its error is part of the record
        return type(err).__name__
    return [
        [potential.prefix(ex, p[: len(p) // 2]), *potential.complete(ex, [p])]
        for ex, p in zip(pool, predictions)
    ]


def snapshot(task: Task) -> dict[str, Any]:
    """What the task produces on its bundled samples, in a form that diffs well."""
    splits = task.splits()
    parts = {
        "train": splits.train,
        "dev": splits.dev,
        "fewshot": splits.fewshot,
        "test_pool": splits.test_pool,
    }
    pool = splits.test_pool
    predictions = _predictions(pool)
    scores = task.score(predictions, pool)

    def parsed(text: str) -> Any:
        try:
            return task.parse(text)
        except ValueError as err:
            return f"ValueError: {err}"

    return _plain(
        {
            "name": task.name,
            "metric_name": task.metric_name,
            "splits": {
                k: {
                    "size": len(v),
                    "digest": _digest(_plain([(e.uid, e.input, e.target) for e in v])),
                }
                for k, v in parts.items()
            },
            "skipped": splits.skipped,
            "grammar": task.grammar(),
            "prompts": [
                {"forward": task.forward_messages(ex), "reverse": task.reverse_messages(ex.target)}
                for ex in pool[:PROMPTED]
            ],
            "prompt_digests": [
                _digest(_plain([task.forward_messages(ex), task.reverse_messages(ex.target)]))
                for ex in pool
            ],
            "parses": [parsed(p) for p in predictions],
            "scores": {
                "metric": scores.metric,
                "value": scores.value,
                "validity": scores.validity,
                "per_example": scores.per_example,
                "details": scores.details,
            },
            "task_potential": _penalties(task, pool, predictions),
        }
    )


def _load(name: str) -> Task:
    return load_task(compose_config([*RECORDED_TASKS[name], "data.dir=null"]))


@pytest.mark.parametrize("name", RECORDED_TASKS)
def test_built_in_task_matches_its_record(name):
    recorded = json.loads(RECORDS.read_text(encoding="utf-8"))[name]
    now = snapshot(_load(name))
    for key in recorded:
        assert now[key] == recorded[key], f"task {name}: {key} differs from the record"
    assert set(now) == set(recorded)


if __name__ == "__main__":
    RECORDS.parent.mkdir(exist_ok=True)
    RECORDS.write_text(
        json.dumps(
            {n: snapshot(_load(n)) for n in RECORDED_TASKS},
            indent=1,
            ensure_ascii=False,
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {RECORDS}")
