"""The custom-task examples on the real data (GRAMMARRL_DATA_DIR): examples/wos_parent and
examples/conll_persons load, give their stated splits (at least 100 labelled test rows, drawn as
disjoint sets), and every gold output is accepted by the grammar with SmolLM2's tokenizer.

Skipped, with the reason shown, when the real data is not there.
"""

from __future__ import annotations

import pytest

from grammarrl.job import validate
from grammarrl.models.loading import load_tokenizer
from grammarrl.tasks import load_task
from grammarrl.tasks.grammar_check import GrammarChecker
from tests.conftest import REPO, compose_config
from tests.test_custom_task import load_make_data

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
SPLITS = {  # train, dev, few-shot, test pool; then every row of the files, all labelled
    "wos_parent": ((1175, 100, 3, 1175), 2453),
    "conll_persons": ((10113, 100, 6, 2756), 11132 + 2605 + 2756),
}


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    return load_tokenizer(compose_config(["model=tiny"]).model, cache_dir)


@pytest.fixture(scope="module")
def example_tasks(real_data_dir, tmp_path_factory):
    """Both examples' tasks; conll_persons' rows written by its make_data.py to a fresh cache."""
    cache = tmp_path_factory.mktemp("cache")
    data = [f"data.dir={real_data_dir}", f"cache_dir={cache}"]
    load_make_data(EXAMPLES / "conll_persons").main(data)
    tasks = {}
    for name in SPLITS:
        cfg = compose_config(["task=custom", f"task.spec={EXAMPLES / name / 'task.yaml'}", *data])
        validate(cfg)
        tasks[name] = load_task(cfg)
    return tasks


@pytest.mark.parametrize("name", list(SPLITS))
def test_real_example_splits_and_gold_acceptance(example_tasks, tokenizer, name):
    task = example_tasks[name]
    sizes, rows = SPLITS[name]
    s = task.splits()
    assert (len(s.train), len(s.dev), len(s.fewshot), len(s.test_pool)) == sizes
    assert all(ex.target for ex in s.test_pool)
    first, second = (task.test_sets(1, 100, seed)[0] for seed in (0, 1))
    assert len(first) == len(second) == 100
    assert not {ex.uid for ex in first} & {ex.uid for ex in second}  # a fresh, disjoint set
    golds = [ex.target for pool in task.corpus.values() for ex in pool]
    assert len(golds) == rows
    assert GrammarChecker(task.grammar(), tokenizer).rejected(golds) == []
