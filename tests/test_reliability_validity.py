"""Validity property: whatever the (random) weights, every output of every decoding method is
accepted by the task grammar when it ends, and an output that does not end in an accepting
state is flagged truncated (a valid prefix of exactly max_new_tokens tokens), never an error.

Each (task, method) case draws its own random-weight model (init seed), a bias on end-of-turn
(none: long open outputs run into max_new_tokens; large: early endings) and test inputs from a
seed of its own; a second seed is one edit of SEEDS away.
"""

from __future__ import annotations

import random

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.models.loading import build_tiny
from tests.conftest import BUILTIN_TASKS, compose_config
from tests.support.decoding import EndBias, check_validity

METHODS = ("greedy", "sample", "beam", "rollout")
SEEDS = (1,)
MAX_NEW = 32


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", BUILTIN_TASKS)
def test_every_output_is_valid_or_flagged_truncated(tiny, sample_tasks, name, method, seed):
    _, tok = tiny
    rng = random.Random(f"{name}/{method}/{seed}")
    init_seed = 1000 * seed + 10 * BUILTIN_TASKS.index(name) + METHODS.index(method)
    cfg = compose_config(["model=tiny", f"model.init_seed={init_seed}"])
    model = build_tiny(cfg.model, vocab_size=len(tok)).eval()
    bias = rng.choice([0.0, 4.0, 8.0])
    task = sample_tasks[name]
    examples = rng.sample(task.splits().test_pool, 2)
    prompts = [encode_prompt(tok, task.forward_messages(ex)) for ex in examples]
    decoder = ConstrainedDecoder(
        EndBias(model, end_of_turn_id(tok), bias), tok, task.grammar(), max_new_tokens=MAX_NEW
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if method == "greedy":
            gens = decoder.greedy(prompts)
        elif method == "sample":
            gens = [g for group in decoder.sample(prompts, 4, generator=generator) for g in group]
        elif method == "beam":
            results = decoder.beam(prompts, 3, length_penalty=1.0)
            gens = [r.top for r in results] + [g for r in results for g in r.finished]
        else:
            groups = decoder.rollout(
                prompts, num_samples=3, beam_width=3, generator=generator, length_penalty=1.0
            )
            gens = [g for group in groups for g in group]
    assert gens and all(g.kind in (method, "beam", "sample", "greedy") for g in gens)
    check_validity(task, tok, gens, MAX_NEW)  # finished => accepted and parsed; else truncated
    for g in gens:
        assert g.finished != g.truncated  # every output is exactly one of the two
