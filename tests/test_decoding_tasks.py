"""A random model decoded under each task's grammar produces only valid outputs."""

from __future__ import annotations

from types import SimpleNamespace

import llguidance
import pytest
import torch

from grammarrl.chat import encode_prompt, end_of_turn_id
from grammarrl.decoding import ConstrainedDecoder
from grammarrl.decoding.grammar import ll_tokenizer
from grammarrl.models import kv_cache_name, output_kv_cache
from grammarrl.tasks import load_task
from grammarrl.tasks.grammar_check import GrammarChecker
from tests.conftest import BUILTIN_TASKS, compose_config


class EndBias(torch.nn.Module):
    """The random model with a bonus on the end-of-turn logit, so that open-ended outputs (gloss
    term lists) end at random lengths instead of always running to max_new_tokens."""

    def __init__(self, inner: torch.nn.Module, stop: int, bias: float):
        super().__init__()
        self.inner, self.stop, self.bias = inner, stop, bias

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        logits = out.logits.clone()
        logits[..., self.stop] += self.bias
        return SimpleNamespace(logits=logits, **{kv_cache_name(): output_kv_cache(out)})


def check_validity(task, tok, gens, max_new):
    """Finished outputs: parsed by the task, accepted by an independent checker (re-tokenised
    text) and by a fresh matcher on the generated tokens. Truncated: a valid prefix."""
    stop = end_of_turn_id(tok)
    grammar = task.grammar()
    checker = GrammarChecker(grammar, tok)
    spec = llguidance.LLMatcher.grammar_from_lark(grammar)
    lt = ll_tokenizer(tok, stop)
    finished = 0
    for g in gens:
        matcher = llguidance.LLMatcher(lt, spec, log_level=0)
        assert g.error is None
        if g.finished:
            finished += 1
            assert g.token_ids[-1] == stop and stop not in g.token_ids[:-1]
            assert matcher.consume_tokens(g.token_ids[:-1]) and matcher.is_accepting()
            assert checker.accepts(g.text), g.text
            task.parse(g.text)  # raises ValueError if invalid
        else:
            assert g.truncated and len(g.token_ids) == max_new
            assert matcher.consume_tokens(g.token_ids)
    return finished


@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_random_model_is_valid_on_task_grammar(tiny, name):
    model, tok = tiny
    task = load_task(compose_config([f"task={name}", "data.dir=null"]))
    examples = task.test_sets(1, 3, 0)[0]
    prompts = [encode_prompt(tok, task.forward_messages(ex)) for ex in examples]
    max_new = 64
    biased = EndBias(model, end_of_turn_id(tok), bias=6.0)
    dec = ConstrainedDecoder(biased, tok, task.grammar(), max_new_tokens=max_new)
    groups = dec.rollout(
        prompts, num_samples=64, beam_width=3, generator=torch.Generator().manual_seed(0)
    )
    gens = [g for grp in groups for g in grp] + dec.greedy(prompts)
    assert len(gens) >= 190
    finished = check_validity(task, tok, gens, max_new)
    assert finished >= 0.9 * len(gens)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_random_model_is_valid_on_real_task_grammar(tiny, real_data_dir, name):
    """The full-size grammars (16k gloss terms, 8.8k CoNLL spans, 145 WoS paths)."""
    model, tok = tiny
    # no hints: the grammar is what is tested, and hints for a whole corpus take minutes
    task = load_task(
        compose_config([f"task={name}", f"data.dir={real_data_dir}", "task.num_hints=0"])
    )
    examples = task.test_sets(1, 2, 0)[0]
    prompts = [encode_prompt(tok, task.forward_messages(ex)) for ex in examples]
    max_new = 64
    biased = EndBias(model, end_of_turn_id(tok), bias=8.0)
    dec = ConstrainedDecoder(biased, tok, task.grammar(), max_new_tokens=max_new)
    groups = dec.rollout(
        prompts, num_samples=50, beam_width=3, generator=torch.Generator().manual_seed(0)
    )
    gens = [g for grp in groups for g in grp]
    finished = check_validity(task, tok, gens, max_new)
    assert finished >= 0.8 * len(gens)
