"""The three tasks on the real data (GRAMMARRL_DATA_DIR): sizes, vocabularies, 100% gold acceptance.

Skipped, with the reason shown, when the real data is not there.
"""

from __future__ import annotations

import csv
import json

import pytest

from grammarrl.models.loading import load_tokenizer
from grammarrl.tasks import load_task
from grammarrl.tasks.conll import FIELDS
from grammarrl.tasks.gloss import suffix_form
from grammarrl.tasks.grammar_check import GrammarChecker
from tests.conftest import compose_config

pytestmark = pytest.mark.slow

EXPECTED = {  # source split sizes, policy split sizes, vocabulary size
    "gloss": (
        {"train": 83619, "dev": 2045, "test": 2046},
        {"train": 2000, "dev": 100, "fewshot": 20, "test_pool": 2046},
        16120,
    ),
    "conll": (
        {"train": 11132, "dev": 2604, "test": 2756},
        {"train": 4000, "dev": 100, "fewshot": 10, "test_pool": 2756},
        8804,
    ),
    "wos": ({"all": 2453}, {"train": 1176, "dev": 100, "fewshot": 1, "test_pool": 1176}, 145),
}


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    return load_tokenizer(compose_config(["model=tiny"]).model, cache_dir)


@pytest.fixture(scope="module")
def real_tasks(real_data_dir):
    return {
        name: load_task(compose_config([f"task={name}", f"data.dir={real_data_dir}"]))
        for name in EXPECTED
    }


@pytest.mark.parametrize("name", list(EXPECTED))
def test_real_splits_vocabulary_and_gold_acceptance(real_tasks, tokenizer, name):
    task = real_tasks[name]
    corpus_sizes, split_sizes, vocab_size = EXPECTED[name]
    splits = task.splits()
    sizes = {
        "train": len(splits.train),
        "dev": len(splits.dev),
        "fewshot": len(splits.fewshot),
        "test_pool": len(splits.test_pool),
    }
    golds = [ex.target for pool in task.corpus.values() for ex in pool]
    rejected = GrammarChecker(task.grammar(), tokenizer).rejected(golds)
    accepted = (
        len(golds) - sum(target in set(rejected) for target in golds) if rejected else len(golds)
    )
    print(
        f"\n{name}: corpus { ({k: len(v) for k, v in task.corpus.items()}) }, splits {sizes}, "
        f"vocab {task.vocab_size()}, skipped {splits.skipped}, "
        f"gold accepted {accepted}/{len(golds)}"
    )
    assert {k: len(v) for k, v in task.corpus.items()} == corpus_sizes
    assert sizes == split_sizes
    assert task.vocab_size() == vocab_size
    assert rejected == [], rejected[:5]


def test_real_gloss_vocabulary_is_the_corpus_term_list(real_tasks, real_data_dir):
    listed = (real_data_dir / "aslg_pc12" / "gloss_vocab.txt").read_text(encoding="utf-8")
    assert real_tasks["gloss"].vocabulary == sorted(
        {suffix_form(t) for t in listed.split("\n") if t}
    )


def test_real_conll_matches_the_authors_reference(real_tasks, real_data_dir):
    task = real_tasks["conll"]
    reference = real_data_dir / "conll2003" / "reference"
    taxonomy = json.loads((reference / "taxonomy.json").read_text())
    assert {f: set(v) for f, v in task.vocabulary.items()} == {f: set(taxonomy[f]) for f in FIELDS}
    with open(reference / "test.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ours = [(ex.input, json.loads(ex.target)) for ex in task.splits().test_pool]
    assert ours == [(row["sentence"], {f: row[f] for f in FIELDS}) for row in rows]
    assert task.splits().skipped["unwritable_span"] == 1


def test_real_wos_label_space_and_fewshot(real_tasks):
    task = real_tasks["wos"]
    assert len(task.hierarchy) == 7
    assert sum(map(len, task.hierarchy.values())) == 145
    assert task.splits().skipped == {}
    demo = task.splits().fewshot[0]
    assert 80 <= len(demo.input.split()) <= 200


def test_real_fewshot_never_from_test(real_tasks):
    for task in real_tasks.values():
        test_inputs = {ex.input for ex in task.splits().test_pool}
        assert not test_inputs & {ex.input for ex in task.splits().fewshot}
        assert not test_inputs & {ex.input for ex in task.splits().dev}
