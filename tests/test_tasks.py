"""The three tasks on the bundled samples: schema, prompts, grammar, parsing and scoring."""

from __future__ import annotations

import json
import re

import pytest

from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import load_tokenizer
from grammarrl.tasks import load_task
from grammarrl.tasks.conll import FIELDS, bio_spans
from grammarrl.tasks.gloss import suffix_form
from grammarrl.tasks.grammar_check import GrammarChecker
from tests.conftest import BUILTIN_TASKS, compose_config


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    """The SmolLM2 tokenizer (model=tiny uses it)."""
    return load_tokenizer(compose_config(["model=tiny"]).model, cache_dir)


# ----- normalisation ---------------------------------------------------------------------
def test_gloss_suffix_form_and_typo_fixes():
    assert suffix_form("DESC-GOOD") == "GOOD-DESC"
    assert suffix_form("X-IT") == "IT-X"
    assert suffix_form("X-Y") == "Y-X"
    assert suffix_form("DESC-N") == "THAN-DESC"
    assert suffix_form("DESC-RE") == "THERE-DESC"
    assert suffix_form("DESC-REFORE") == "THEREFORE-DESC"
    assert suffix_form("-LRB-") == "-LRB-" and suffix_form("SELF") == "SELF"


def test_bio_spans_handles_iob2_and_iob1_starts():
    tokens = ["New", "York", "and", "Paris", "Ann", "Lee", "Bob"]
    tags = ["B-LOC", "I-LOC", "O", "I-LOC", "B-PER", "I-PER", "B-PER"]
    assert bio_spans(tokens, tags) == [
        ("LOC", "New York"),
        ("LOC", "Paris"),
        ("PER", "Ann Lee"),
        ("PER", "Bob"),
    ]


def test_canonical_targets(sample_tasks):
    for ex in sample_tasks["gloss"].corpus["train"]:
        assert ex.target == " ".join(ex.target.split()) and ex.target.isupper()
    for ex in sample_tasks["wos"].corpus["all"]:
        assert re.fullmatch(r'\{"parent": "[^"]+", "child": "[^"]+"\}', ex.target), ex.target
    for ex in sample_tasks["conll"].corpus["train"]:
        value = json.loads(ex.target)
        assert tuple(value) == FIELDS and ex.target == json.dumps(value)
    first = sample_tasks["conll"].corpus["train"][0]
    assert first.input == "Maria Olsen opened the new Nordvik Bank branch in Bergen on Monday ."
    assert first.target == (
        '{"person": "Maria Olsen", "organization": "Nordvik Bank", '
        '"location": "Bergen", "misc": ""}'
    )


def test_conll_drops_and_counts_unwritable_and_entityless_rows(sample_tasks):
    skipped = sample_tasks["conll"].splits().skipped
    assert skipped["unwritable_span"] == 1  # the sample's 'Peter " The Hammer " Stone'
    assert skipped["no_entity"] == 6
    inputs = {ex.input for pool in sample_tasks["conll"].corpus.values() for ex in pool}
    assert not any("Hammer" in text for text in inputs)


def test_vocabularies(sample_tasks):
    gloss = sample_tasks["gloss"]
    assert "THAN-DESC" in gloss.vocabulary and "DESC-N" not in gloss.vocabulary
    assert gloss.vocab_size() == len(set(gloss.vocabulary))
    assert sample_tasks["wos"].vocab_size() == 145
    conll = sample_tasks["conll"].vocabulary
    assert "Port Kessel" in conll["location"] and "Port Kessel" not in conll["person"]


# ----- few-shot demonstrations ------------------------------------------------------------
def test_fewshot_is_fixed_and_representative(sample_tasks):
    gloss = sample_tasks["gloss"].splits().fewshot
    assert len(gloss) == 20
    words = [set(ex.input.lower().split()) for ex in gloss]
    for i in range(len(words)):
        for j in range(i):
            assert len(words[i] & words[j]) < 0.5 * min(len(words[i]), len(words[j]))
    conll = [json.loads(ex.target) for ex in sample_tasks["conll"].splits().fewshot]
    assert len(conll) == 10
    assert all(any(record[f] for record in conll) for f in FIELDS), "every type appears"
    assert all(any(not v for v in record.values()) for record in conll), "some fields empty"
    assert len(sample_tasks["wos"].splits().fewshot) == 1
    again = load_task(compose_config(["task=conll", "data.dir=null"])).splits().fewshot
    assert again == sample_tasks["conll"].splits().fewshot


# ----- prompts ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_forward_and_reverse_prompts(sample_tasks, name):
    task = sample_tasks[name]
    example = task.splits().test_pool[0]
    forward = task.forward_messages(example)
    k = len(task.splits().fewshot)
    assert [m["role"] for m in forward] == ["system"] + ["user", "assistant"] * k + ["user"]
    assert forward[-1]["content"] == example.input
    system = forward[0]["content"]
    assert system.startswith(task.instruction) and system.endswith(task.output_format)
    for i, demo in enumerate(task.splits().fewshot):
        assert forward[1 + 2 * i]["content"] == demo.input
        assert forward[2 + 2 * i]["content"] == demo.target

    candidate = task.splits().test_pool[1].target
    reverse = task.reverse_messages(candidate)
    assert reverse[0] == {"role": "system", "content": task.inverse_instruction}
    assert [m["role"] for m in reverse] == [m["role"] for m in forward]
    for i in range(k):  # the same demonstrations, swapped
        assert reverse[1 + 2 * i]["content"] == forward[2 + 2 * i]["content"]
        assert reverse[2 + 2 * i]["content"] == forward[1 + 2 * i]["content"]
    assert reverse[-1] == {"role": "user", "content": candidate}


def test_context_blocks(sample_tasks):
    gloss, conll, wos = sample_tasks["gloss"], sample_tasks["conll"], sample_tasks["wos"]
    example = gloss.splits().test_pool[0]
    block = gloss.context(example)
    assert block.startswith("Similar gloss terms: ")
    terms = block.removeprefix("Similar gloss terms: ").split(" ")
    assert len(terms) == min(50, gloss.vocab_size()) and set(terms) <= set(gloss.vocabulary)
    lines = conll.context(conll.splits().test_pool[0]).splitlines()
    assert lines[0] == "Similar entity spans:"
    assert [line.split(":")[0] for line in lines[1:]] == list(FIELDS)
    hierarchy = wos.context(wos.splits().test_pool[0])
    assert "CS: Symbolic computation; Computer vision;" in hierarchy
    assert len(hierarchy.splitlines()) == 1 + 7
    for task in sample_tasks.values():  # the reverse prompt carries no hints / hierarchy
        reverse_text = json.dumps(task.reverse_messages("x"))
        assert "Similar" not in reverse_text and "Label hierarchy" not in reverse_text


def test_no_hints_when_num_hints_is_zero():
    task = load_task(compose_config(["task=conll", "data.dir=null", "task.num_hints=0"]))
    system = task.forward_messages(task.splits().dev[0])[0]["content"]
    assert system == f"{task.instruction}\n\n{task.output_format}"


def test_prompts_render_with_the_chat_template(sample_tasks, tokenizer):
    task = sample_tasks["conll"]
    ids = encode_prompt(tokenizer, task.forward_messages(task.splits().dev[0]))
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nExtract named entities")
    assert text.endswith("<|im_start|>assistant\n")


# ----- grammar ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_grammar_accepts_every_gold_output(sample_tasks, tokenizer, name):
    task = sample_tasks[name]
    checker = GrammarChecker(task.grammar(), tokenizer)
    golds = [ex.target for pool in task.corpus.values() for ex in pool]
    assert golds and checker.rejected(golds) == []
    print(f"{name}: {len(golds)}/{len(golds)} sample gold outputs accepted")


NEAR_MISSES = {
    "gloss": [
        "COMMITTEE WILL MEET FOOBARTERM .",  # unknown term
        "COMMITTEE  WILL MEET .",  # double space
        " COMMITTEE WILL MEET .",  # leading space
        "COMMITTEE WILL MEET . ",  # trailing space
        "committee WILL MEET .",  # not the vocabulary's spelling
        "DESC-AGAIN COMMITTEE",  # prefix form instead of the suffix form
    ],
    "wos": [
        '{"parent": "CS", "child": "Diabetes"}',  # child under the wrong parent
        '{"child": "Machine learning", "parent": "CS"}',  # keys out of order
        '{"parent":"CS","child":"Machine learning"}',  # not the canonical separators
        '{"parent": "CS", "child": "Deep learning"}',  # unknown child
        '{"parent": "cs", "child": "Machine learning"}',  # unknown parent
    ],
    "conll": [
        '{"organization": "", "person": "", "location": "Bergen", "misc": ""}',  # key order
        '{"person": "", "organization": "", "location": "Atlantis", "misc": ""}',  # unknown span
        '{"person": "Bergen", "organization": "", "location": "", "misc": ""}',  # wrong type
        '{"person": "", "organization": "", "location": "Bergen"}',  # missing key
        '{"person": "", "organization": "", "location": "Bergen", "misc": ""} ',  # trailing
    ],
}
VALID = {
    "gloss": "COMMITTEE WILL MEET AGAIN-DESC .",
    "wos": '{"parent": "CS", "child": "Machine learning"}',
    "conll": '{"person": "", "organization": "", "location": "Bergen", "misc": ""}',
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))  # the paper's tasks: hand-written cases
def test_grammar_rejects_near_misses(sample_tasks, tokenizer, name):
    task = sample_tasks[name]
    checker = GrammarChecker(task.grammar(), tokenizer)
    assert checker.accepts(VALID[name])
    assert checker.rejected(NEAR_MISSES[name]) == NEAR_MISSES[name]
    assert task.try_parse(VALID[name]) is not None
    for text in NEAR_MISSES[name][:2]:  # the parser agrees with the grammar
        assert task.try_parse(text) is None


@pytest.mark.parametrize("value", [["Bergen"], {"span": "Bergen"}, 3, None])
def test_conll_outputs_with_a_field_that_is_not_a_string_are_invalid(sample_tasks, value):
    text = json.dumps({"person": "", "organization": "", "location": value, "misc": ""})
    assert sample_tasks["conll"].try_parse(text) is None


@pytest.mark.parametrize("value", [["Psychology"], {"label": "Psychology"}, 3, None])
def test_wos_outputs_with_a_label_that_is_not_a_string_are_invalid(sample_tasks, value):
    wos = sample_tasks["wos"]
    assert wos.try_parse(json.dumps({"parent": value, "child": "False memories"})) is None
    assert wos.try_parse(json.dumps({"parent": "Psychology", "child": value})) is None
    gold = wos.splits().test_pool[0]
    assert wos.score([json.dumps({"parent": value, "child": "x"})], [gold]).validity == 0.0


def test_grammar_keeps_separators_inside_terminals(sample_tasks):
    assert 'SPACED_TERM: " " TERM' in sample_tasks["gloss"].grammar()
    assert 'PERSON: " \\"\\""' in sample_tasks["conll"].grammar()
    assert re.search(r"^start: .* path ", sample_tasks["wos"].grammar(), re.MULTILINE)


def test_grammar_escapes_json_strings(tokenizer):
    lark = "start: VALUE\nVALUE: " + json.dumps(json.dumps('a "quoted" \\ word')) + "\n"
    checker = GrammarChecker(lark, tokenizer)
    assert checker.accepts(json.dumps('a "quoted" \\ word'))
    assert not checker.accepts('"a "quoted" \\ word"')


# ----- parsing and scoring ---------------------------------------------------------------
@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_gold_scores_perfectly_and_garbage_is_invalid(sample_tasks, name):
    task = sample_tasks[name]
    examples = task.splits().test_pool[:6]
    perfect = task.score([ex.target for ex in examples], examples)
    assert perfect.metric == task.metric_name
    assert perfect.value == pytest.approx(1.0) and perfect.validity == 1.0
    garbage = task.score(["not an output"] + [ex.target for ex in examples[1:]], examples)
    assert garbage.validity == pytest.approx(5 / 6)
    assert garbage.per_example[0]["valid"] is False and garbage.value < 1.0


def test_conll_score_by_hand(sample_tasks):
    task = sample_tasks["conll"]
    examples = [
        ex for ex in task.splits().test_pool if "Tarvik" in ex.input or "Vienna" in ex.input
    ]
    assert len(examples) == 2  # Helios Air / Tarvik; Nora Quist / Ostrian / Vienna
    golds = [json.loads(ex.target) for ex in examples]
    first = dict(golds[0], location="")  # one miss: fn 1
    second = dict(golds[1], person="Lucia Ferri")  # one wrong: fp 1, fn 1
    scores = task.score([json.dumps(first), json.dumps(second)], examples)
    tp = sum(bool(v) for g in golds for v in g.values()) - 2
    assert scores.details["micro"]["tp"] == tp
    assert (scores.details["micro"]["fp"], scores.details["micro"]["fn"]) == (1, 2)
    assert scores.value == pytest.approx(2 * tp / (2 * tp + 1 + 2))
    assert scores.details["person"]["fp"] == 1


def test_wos_score_by_hand(sample_tasks):
    task = sample_tasks["wos"]
    examples = task.splits().test_pool[:2]
    parent = json.loads(examples[0].target)["parent"]
    other_child = next(
        c for c in task.hierarchy[parent] if c != json.loads(examples[0].target)["child"]
    )
    preds = [json.dumps({"parent": parent, "child": other_child}), "{}"]
    scores = task.score(preds, examples)
    # 1 tp (parent), 1 fp (wrong path), 1 + 2 fn: P = 1/2, R = 1/4.
    assert scores.value == pytest.approx(2 * 0.5 * 0.25 / 0.75)
    assert scores.validity == 0.5
