"""Search quality against particle count from recorded particles (experiments.particle_subsets)."""

import json
from pathlib import Path
from statistics import fmean
from types import SimpleNamespace

import pytest

from experiments.particle_subsets import (
    curve,
    curves_markdown,
    first_reaching,
    main,
    particle_curves,
    pick,
    read_reference,
)
from experiments.results_files import one_evaluation
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


def test_a_reference_is_a_label_and_a_run():
    run = "experiments/results/frontier/runs/conll/frozen_greedy"
    assert read_reference(f"frozen greedy={run}") == ("frozen greedy", Path(run))
    with pytest.raises(SystemExit, match="LABEL=RUN"):
        read_reference(run)


TRIAGE = Path("experiments/results/frontier/runs/triage")


def test_particle_curves_end_at_the_recorded_search_and_reference_means():
    """On triage's committed Full IS(10) draws, m = 10 is the recorded Full IS(10) and
    Sample-Rerank(10) (their results files' means, over the three draws); a reference carries
    its run's recorded mean and the first m each curve reaches it."""
    runs = [TRIAGE / f"is10_s{seed}" for seed in range(3)]
    result = particle_curves(runs, {"frozen greedy": TRIAGE / "frozen_greedy"})
    recorded = [json.loads((run / "results.json").read_text()) for run in runs]
    for method, selection in (("Full IS", "is"), ("Sample-Rerank", "rerank")):
        means = [r["selections"][selection]["mean"] for r in recorded]
        assert result["curves"][method][-1] == pytest.approx(fmean(means), abs=1e-9), method
    ref = result["references"]["frozen greedy"]
    assert ref["mean"] == json.loads((TRIAGE / "frozen_greedy/results.json").read_text())["mean"]
    full, first = result["curves"]["Full IS"], ref["first_m_reaching"]["Full IS"]
    assert full[first - 1] >= ref["mean"] > max(full[: first - 1])
    assert (result["examples"], result["draws"]) == (200, 3)


def test_a_reference_names_one_results_file_of_a_training_run():
    """WoS's training run records two evaluations (its last and its dev-best adapter's): its
    folder alone is refused with a hint, and each of its results files reads as its own."""
    train = Path("experiments/results/frontier/runs/wos/train")
    with pytest.raises(AggregationError, match=r"found 2 \(name one of its results files\)"):
        one_evaluation(train)
    for name in ("results", "results_best_dev"):
        recorded = json.loads((train / f"{name}.json").read_text())
        evaluation = one_evaluation(train / f"{name}.json")
        assert (evaluation.name, evaluation.results) == (name, recorded)


def test_the_curves_table_has_a_row_per_task_and_says_never():
    result = {
        "examples": 4,
        "draws": 2,
        "curves": {"Full IS": [0.1, 0.2, 0.3], "Sample-Rerank": [0.1, 0.15, 0.2]},
        "references": {
            "greedy": {"mean": 0.25, "first_m_reaching": {"Full IS": 3, "Sample-Rerank": None}}
        },
    }
    table = curves_markdown({"toy": result})
    assert "| greedy | Full IS reaches it at m | Sample-Rerank reaches it at m |" in table
    assert (
        table.splitlines()[-1]
        == "| toy (4 × 2) | 0.100 | 0.250 | 3 | never | 0.300 / 0.300 (K = 3) |"
    )


def test_the_command_names_a_run_without_particles():
    with pytest.raises(SystemExit, match="no search particles"):
        main([str(TRIAGE / "frozen_greedy")])
