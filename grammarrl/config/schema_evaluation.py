"""The schema of the groups that score and use a model: test decoding (`eval`), inference-time
search, the merged-model export and mode=diagnose (`grammarrl.config.keys` says what a declaration
holds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarrl.config.keys import (
    CONTINUABLE,
    NOT_DIAGNOSE,
    PARTICLES,
    SEARCHING,
    TEST_SETS,
    UNRECORDED,
    key,
)

ADAPTER_MODES = ("eval", "search", "export")  # modes that load eval.adapter
DECODINGS = ("greedy", "beam")
TEST_SET_DRAWINGS = ("disjoint", "seed_plus_index")
SEARCH_METHODS = ("rerank", "is", "smc")  # grammarrl/search/registry.py BUILTIN (a test checks)
SEARCH_POTENTIALS = ("reverse", "task", "none")


# A training run evaluates after training: it may change how, and continue (every key of eval
# is continuable).
@dataclass
class EvalSchema:
    decoding: str = key(
        "Test decoding of mode=eval and after training.",
        choices=DECODINGS,
        role=CONTINUABLE,
        modes=("eval", *UNRECORDED),
    )
    beam_width: int = key(
        "Beam width of eval.decoding=beam.", at_least=1, role=CONTINUABLE, modes=TEST_SETS
    )
    length_penalty: float = key(
        "Beam ranks finished outputs by sum log-prob / length^length_penalty (0: plain sum).",
        role=CONTINUABLE,
        modes=TEST_SETS,
    )
    num_test_sets: int = key(
        "Test sets drawn from the test pool.", at_least=1, role=CONTINUABLE, modes=TEST_SETS
    )
    test_size: int = key(
        "Examples per test set (capped by the pool).",
        at_least=1,
        role=CONTINUABLE,
        modes=TEST_SETS,
    )
    batch_size: int = key("Inputs decoded together.", at_least=1, role=CONTINUABLE, modes=TEST_SETS)
    adapter: Any = key(
        "The PEFT adapter that mode=eval, search and export load; null: the frozen base model.",
        role=CONTINUABLE,
        modes=NOT_DIAGNOSE,
    )
    score_rewards: bool = key(
        "Also score every test output with the frozen reference's rewards.",
        role=CONTINUABLE,
        modes=TEST_SETS,
    )
    test_set_drawing: str = key(
        "`disjoint`: sets of different seeds share no example; `seed_plus_index`: the drawing "
        "before 2026-11-27.",
        choices=TEST_SET_DRAWINGS,
        role=CONTINUABLE,
        modes=TEST_SETS,
        recorded_default="seed_plus_index",
    )
    sampler_seeds: list[int] = key(
        "mode=search: one draw of a stochastic method per seed, on the same test sets.",
        at_least=0,
        unique=True,
        role=CONTINUABLE,
        modes=("search",),
        recorded_default=None,  # one draw, seeded with `seed`
    )


@dataclass
class ExportSchema:
    dir: Any = key(
        "Where mode=export writes the merged model folder; null: <run dir>/model.",
        modes=NOT_DIAGNOSE,
    )


@dataclass
class SearchSchema:
    method: str = key(
        "mode=search: Sample-Rerank, Full IS or Full SMC.",
        choices=SEARCH_METHODS,
        modes=SEARCHING,
    )
    particles: int = key("Particles (samples) per input.", at_least=1, modes=PARTICLES)
    potential: str | None = key(
        "The expensive potential Φ; null: the paper's pairing (rerank/is: reverse, smc: task).",
        choices=SEARCH_POTENTIALS,
        modes=PARTICLES,
    )
    ess_threshold: float = key(
        "smc resamples when ESS < ess_threshold · particles.",
        at_least=0,
        at_most=1,
        modes=SEARCHING,
    )
    temperature: float = key(
        "Proposal temperature (the weights stay exact: p/q).", above=0, modes=PARTICLES
    )
    batch_size: int = key(
        "Prompts decoded together, each with `particles` rows.", at_least=1, modes=SEARCHING
    )
    posterior_draws: int = key(
        "Draws for the posterior-weighted metric; 0: skip.", at_least=0, modes=SEARCHING
    )
    greedy_baseline: bool = key(
        "Also decode the same examples greedily: the cost relative to one greedy pass.",
        modes=SEARCHING,
    )


DIAGNOSE = ("diagnose",)  # the diagnose group's keys change mode=diagnose's numbers alone


@dataclass
class DiagnoseSchema:
    num_inputs: int = key(
        "K dev inputs decoded, greedy plus num_samples constrained samples each.",
        at_least=1,
        modes=DIAGNOSE,
    )
    num_labelled: int = key(
        "Labelled rows whose gold output is perturbed field by field (dev rows with gold, else "
        "training rows).",
        at_least=1,
        modes=DIAGNOSE,
    )
    num_samples: int = key(
        "M constrained samples per dev input, at rollout.temperature.", at_least=1, modes=DIAGNOSE
    )
    lambdas: list[float] = key(
        "The reward mixings compared: the argmax of (1-λ)·R_direct/σ_d + λ·R_reverse/σ_r per input.",
        at_least=0,
        at_most=1,
        unique=True,
        modes=DIAGNOSE,
    )
    batch_size: int = key(
        "Dev inputs decoded together (each with 1 + num_samples rows).", at_least=1, modes=DIAGNOSE
    )
    min_lift: float = key(
        "A lift of the dev metric by reranking below this is called within noise.",
        at_least=0,
        modes=DIAGNOSE,
    )
    blind_below: float = key(
        "A field is one the reward cannot see when the 95% interval of the share of its pairs "
        "the reverse reward prefers gold in lies below this (undecided when it straddles it).",
        at_least=0,
        at_most=1,
        modes=DIAGNOSE,
    )
    bootstrap_draws: int = key(
        "Resamples of the labelled dev inputs for the cross-fitted lift's 95% interval "
        "(fixed seed).",
        at_least=1,
        modes=DIAGNOSE,
    )
