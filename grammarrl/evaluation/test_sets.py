"""The seeded test sets of a scoring job (mode=eval, mode=search, a training run's final
evaluation): drawing them, the note when they cannot be disjoint, the check that the grammar
accepts their gold outputs, and the results fields that say which examples they hold."""

from __future__ import annotations

import logging
from typing import Any

from grammarrl.errors import DataError
from grammarrl.evaluation.settings import TestSetSpec
from grammarrl.tasks.base import Task, drawing_note
from grammarrl.types import Example

log = logging.getLogger(__name__)


def test_examples(spec: TestSetSpec, task: Task) -> tuple[list[list[Example]], list[Example]]:
    """The seeded test sets (`num_test_sets` x `test_size`, drawn as `spec.drawing` says) and
    all their examples in order; DataError when there are none. Warns when the sets cannot be
    disjoint (`drawing_note`)."""
    test_sets = task.test_sets(spec.num_test_sets, spec.test_size, spec.seed, spec.drawing)
    examples = [ex for test_set in test_sets for ex in test_set]
    if not examples:
        raise DataError(f"task {task.name}: the test sets are empty (no test examples)")
    note = test_sets_note(spec, task)
    if note:
        log.warning("task %s: %s", task.name, note)
    return test_sets, examples


def test_sets_note(spec: TestSetSpec, task: Task) -> str:
    """`drawing_note` for the run's test sets ("" when they are disjoint)."""
    pool = len(task.splits().test_pool)
    return drawing_note(spec.num_test_sets, spec.test_size, spec.seed, pool, spec.drawing)


def check_gold(task: Task, tokenizer: Any, examples: list[Example]) -> dict[str, int]:
    """`gold_rejected` and `gold_total`: distinct gold outputs under the task grammar; warns
    when any is rejected (those examples can never be predicted exactly: a grammar or data
    problem)."""
    from grammarrl.tasks.grammar_check import GrammarChecker

    golds = list(dict.fromkeys(ex.target for ex in examples if ex.target))  # unlabelled: none
    if not golds:
        return {"gold_rejected": 0, "gold_total": 0}
    rejected = GrammarChecker(task.grammar(), tokenizer).rejected(golds)
    if rejected:
        log.warning(
            "the %s grammar rejects %d of %d distinct gold outputs of the test sets: those "
            "examples cannot be predicted exactly (first: %r); `mode=prepare` checks every split",
            task.name,
            len(rejected),
            len(golds),
            rejected[0][:200],
        )
    return {"gold_rejected": len(rejected), "gold_total": len(golds)}


def sets_summary(
    spec: TestSetSpec,
    max_new_tokens: int,
    task: Task,
    test_sets: list[list[Example]],
    distinct: int,
) -> dict[str, Any]:
    """How the test sets were drawn and decoded (results fields shared by eval and search):
    the drawing, the output length cap, whether the sets can share examples
    (`test_sets_note`), and every set's example ids, so that results are paired by the
    examples they hold, never by set index."""
    return {
        "num_test_sets": len(test_sets),
        "test_size": len(test_sets[0]) if test_sets else 0,
        "num_examples": sum(map(len, test_sets)),
        "num_unique_examples": distinct,
        "max_new_tokens": max_new_tokens,
        "seed": spec.seed,
        "test_set_drawing": spec.drawing,
        "test_pool_size": len(task.splits().test_pool),
        "test_sets_note": test_sets_note(spec, task),
        "set_ids": [[ex.uid for ex in test_set] for test_set in test_sets],
    }
