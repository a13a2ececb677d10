"""A random model decoded under each task's grammar produces only valid outputs."""

from __future__ import annotations

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.tasks import load_task
from tests.conftest import BUILTIN_TASKS, compose_config
from tests.support.decoding import EndBias, check_validity


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
        prompts,
        num_samples=64,
        beam_width=3,
        generator=torch.Generator().manual_seed(0),
        length_penalty=1.0,
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
        prompts,
        num_samples=50,
        beam_width=3,
        generator=torch.Generator().manual_seed(0),
        length_penalty=1.0,
    )
    gens = [g for grp in groups for g in grp]
    finished = check_validity(task, tok, gens, max_new)
    assert finished >= 0.8 * len(gens)
