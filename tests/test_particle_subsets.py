"""Search quality against particle count from recorded particles (experiments.particle_subsets)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.particle_subsets import curve, first_reaching, pick, read_reference
from experiments.runs import AggregationError


def particle(text, log_weight, potential, finished=True):
    return {
        "text": text,
        "finished": finished,
        "log_weight": log_weight,
        "potential": potential,
        "logp_unconstrained": -1.0,
        "num_tokens": 3,
    }


# Full IS keeps the heaviest weight, Sample-Rerank the highest potential: they part at m = 2 and 3.
PARTICLES = [particle("a", 0.0, 3.0), particle("b", 5.0, 0.0), particle("c", 1.0, 9.0)]


class ExactMatch:
    """A task whose metric is the share of outputs equal to their gold."""

    def score(self, texts, examples):
        hits = [t == ex.target for t, ex in zip(texts, examples)]
        return SimpleNamespace(value=sum(hits) / len(hits))


def row(uid, gold, particles, seed=0, set_idx=0, resamples=0):
    return {
        "uid": uid,
        "input": uid,
        "gold": gold,
        "particles": particles,
        "sampler_seed": seed,
        "set": set_idx,
        "resamples": resamples,
    }


def test_pick_reads_only_the_first_m_particles():
    assert [pick(PARTICLES, "is", m) for m in (1, 2, 3)] == ["a", "b", "b"]
    assert [pick(PARTICLES, "rerank", m) for m in (1, 2, 3)] == ["a", "a", "c"]


def test_a_vanished_weight_is_never_the_posterior_mode():
    particles = [particle("cut", None, None, finished=False), particle("ok", -50.0, -2.0)]
    assert pick(particles, "is", 2) == "ok"
    assert pick(particles, "rerank", 2) == "ok"


def test_curve_averages_draws_within_a_set_then_sets():
    rows = [
        row("x", "c", PARTICLES, seed=0, set_idx=0),  # rerank finds c at m = 3
        row("x", "b", PARTICLES, seed=1, set_idx=0),  # IS finds b from m = 2
        row("y", "a", PARTICLES, seed=0, set_idx=1),  # both pick a at m = 1
    ]
    points = curve(rows, ExactMatch(), ["is", "rerank"])
    # set 0: mean over its two draws; set 1: one draw; then the mean of the two sets
    assert points["is"] == [0.5, 0.25, 0.25]
    assert points["rerank"] == [0.5, 0.5, 0.25]


def test_greedy_rows_resampled_or_unequal_particles_are_refused():
    with pytest.raises(AggregationError, match="resampled"):
        curve([row("x", "a", PARTICLES, resamples=1)], ExactMatch(), ["is"])
    with pytest.raises(AggregationError, match="no search particles"):
        curve([{"uid": "x", "prediction": "a"}], ExactMatch(), ["is"])
    with pytest.raises(AggregationError, match="particle counts"):
        curve([row("x", "a", PARTICLES), row("y", "a", PARTICLES[:2])], ExactMatch(), ["is"])


def test_first_reaching_is_the_smallest_m_at_or_above_the_level():
    assert first_reaching([0.1, 0.3, 0.2, 0.4], 0.3) == 2
    assert first_reaching([0.1, 0.2], 0.3) is None


def test_a_reference_reads_the_runs_recorded_mean():
    run = "experiments/results/frontier/runs/conll/frozen_greedy"
    label, ref = read_reference(f"frozen greedy={run}")
    assert (label, ref["run"]) == ("frozen greedy", run)
    assert ref["mean"] == json.loads(Path(run, "results.json").read_text())["mean"]
    with pytest.raises(SystemExit, match="LABEL=RUN"):
        read_reference(run)
