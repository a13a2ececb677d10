"""Evidence IV's dev pilot (conf/experiment/evidence4_pilot_cpu.yaml): the routes it runs, each
changed from Evidence II's RLOO run in one place, and its rule that stops a run that empties."""

from __future__ import annotations

import csv
import json

import pytest
from omegaconf import OmegaConf

from experiments import jobs
from tests.conftest import REPO, compose_config, train_in

LENGTH_NORMALISED = "grammarrl.rl.length_normalised.LengthNormalisedReward"


def _calibrated() -> dict:
    (entry,) = json.loads((REPO / "experiments/results/evidence4/calibration.json").read_text())[
        "conll/smollm2/n3_b3"
    ]
    assert entry["reward"] == LENGTH_NORMALISED
    return entry


def _pilot() -> dict[str, object]:
    found = {}
    for job in jobs.expand(["+experiment=evidence4_pilot_cpu"]):
        cfg = jobs.compose_job(job)
        route = next(o for o in job if "evidence4_route" in o).split("=")[1]
        found[route] = (
            cfg["lambda"],
            cfg.train.seed,
            cfg.train.pairwise_weight,
            cfg.reward._target_,
        )
        assert (cfg.trainer.max_steps, cfg.trainer.val_check_interval) == (360, 120)
        assert (cfg.train.val_size, cfg.train.eval_test, cfg.kl_penalty) == (200, False, "reward")
        assert cfg.callbacks.stop_if_empty.monitor == "val/dev_empty_field_rate"
        if cfg.reward._target_ == LENGTH_NORMALISED:  # its own σ's: those its diagnosis calibrated
            assert cfg.reward.sigma_direct == pytest.approx(_calibrated()["sigma_direct"])
        else:
            assert (cfg.reward.sigma_direct, cfg.reward.sigma_reverse) == (0.7079, 0.2268)
    return found


def test_the_pilot_runs_each_route_changed_in_one_place():
    bidirectional = "grammarrl.rl.reward.BidirectionalReward"
    assert _pilot() == {
        "balanced": (0.625, 0, 0.0, bidirectional),
        "balanced_seed1": (0.625, 1, 0.0, bidirectional),
        "pairwise": (0.75, 0, 0.1, bidirectional),
        "length_normalised": (0.75, 0, 0.0, LENGTH_NORMALISED),
    }


def test_a_run_whose_dev_outputs_empty_stops_at_that_validation(tmp_path):
    """The pilot's stop rule on tiny, its threshold lowered below any empty-field rate: training
    ends at the first validation (step 1 of 3)."""
    pilot = compose_config(["+experiment=evidence4_pilot_cpu"])
    stop = OmegaConf.to_container(pilot.callbacks.stop_if_empty)
    stop["divergence_threshold"] = -1.0
    cfg = compose_config(
        [
            "model=tiny",
            "task=conll",
            "data.dir=null",
            "logger=none",
            "task.max_new_tokens=16",
            "rollout.num_samples=2",
            "rollout.beam_width=1",
            "optim.batch_size=1",
            "reward.sigma_direct=1",
            "reward.sigma_reverse=1",
            "trainer.max_steps=3",
            "trainer.val_check_interval=1",
            "train.val_size=2",
            "train.val_at_start=false",
            "train.val_train_slice=false",
            "train.eval_test=false",
        ]
    )
    cfg.callbacks = {"stop_if_empty": stop}
    out, _ = train_in(tmp_path, cfg)
    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").open()))
    trained = {float(r["val/dev_trained_steps"]) for r in rows if r.get("val/dev_trained_steps")}
    assert trained == {1.0}
