"""experiments.grammar_mass: within-group slopes, and one run on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.grammar_mass import main, within_group_slope


def test_within_group_slope_compares_candidates_of_one_input_only():
    """y = 2x plus a per-group offset: the slope is 2 whatever the offsets; an invalid
    candidate's values are ignored; x constant within every group has no slope."""
    x = torch.tensor([[0.0, 1.0, 2.0, 9.0], [1.0, 3.0, 0.0, 0.0]])
    y = 2 * x + torch.tensor([[100.0], [-50.0]])
    y[0, 3] = 1e6  # invalid below
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert within_group_slope(x, y, valid) == pytest.approx(2.0)
    flat = torch.tensor([[1.0, 1.0], [4.0, 4.0]])
    assert within_group_slope(flat, torch.randn(2, 2), torch.ones(2, 2, dtype=torch.bool)) is None


def test_grammar_mass_on_the_tiny_model_reports_every_scored_candidate(tmp_path):
    out = tmp_path / "mass.json"
    report = main(
        [
            "model=tiny",
            "task=conll",
            "data.dir=null",
            "task.max_new_tokens=32",
            "task.dev_size=2",
            "optim.batch_size=2",
            "--dev",
            "2",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["candidates"] == report["candidates"]
    kept = [c for group in report["candidates_by_input"] for c in group]
    assert len(kept) == report["candidates"] > 0 and report["left_out_unparsed"] >= 0
    assert all(c["leak"] <= 0 for c in kept)  # a log of a probability mass
    assert report["mean_grammar_kl_at_step_0"] == pytest.approx(
        -sum(c["leak"] for c in kept) / len(kept), abs=1e-2
    )
    assert set(report["within_group_slopes"]) == {
        "grammar_kl_at_step_0_per_field",
        "grammar_kl_at_step_0_per_token",
        "reward_per_field",
        "reward_per_token",
    }
