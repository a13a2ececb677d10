"""σ resolution order and the calibration file."""

from __future__ import annotations

import json

import pytest
import torch

from grammarrl.calibration import (
    calibration_conditions,
    lookup_sigmas,
    store_sigmas,
    within_group_std,
)
from tests.conftest import compose_config


def _cfg(tmp_path, *overrides):
    return compose_config([f"reward.calibration_file={tmp_path}/calibration.json", *overrides])


def test_within_group_std_is_mean_of_row_stds():
    values = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, 6.0]])
    assert within_group_std(values) == pytest.approx((1.0 + 0.0 + 2.0) / 3)


def test_within_group_std_leaves_out_empty_candidates():
    values = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [2.0, 6.0, 4.0]])
    valid = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    expected = (1.0 + torch.tensor([2.0, 6.0, 4.0]).std(unbiased=False).item()) / 2
    assert within_group_std(values, valid) == pytest.approx(expected)


def test_paper_table_for_llama_and_none_for_smollm2(tmp_path):
    assert lookup_sigmas(_cfg(tmp_path, "task=gloss", "model=1b")) == (
        1.1378,
        0.9731,
        "paper table",
    )
    got = lookup_sigmas(_cfg(tmp_path, "task=conll", "model=1b", "rollout.beam_width=10"))
    assert got[:2] == (0.8378, 0.2745)
    assert lookup_sigmas(_cfg(tmp_path, "model=smollm2")) is None
    assert lookup_sigmas(_cfg(tmp_path, "model=3b", "rollout.num_samples=6")) is None


def test_calibration_file_replaces_paper_and_config_wins(tmp_path):
    cfg = _cfg(tmp_path, "task=wos", "model=1b")
    path = store_sigmas(
        cfg, {"sigma_direct": 0.4, "sigma_reverse": 0.03, **calibration_conditions(cfg)}
    )
    store_sigmas(
        _cfg(tmp_path, "task=conll", "model=1b"), {"sigma_direct": 0.9, "sigma_reverse": 0.2}
    )
    assert set(json.loads(path.read_text())) == {"wos/1b/n3_b3", "conll/1b/n3_b3"}
    assert lookup_sigmas(cfg)[:2] == (0.4, 0.03)
    other_data = _cfg(tmp_path, "task=wos", "model=1b", "data.dir=/elsewhere")
    assert lookup_sigmas(other_data)[2] == "paper table"  # measured on other data: not reused
    explicit = _cfg(
        tmp_path, "task=wos", "model=1b", "reward.sigma_direct=2", "reward.sigma_reverse=3"
    )
    assert lookup_sigmas(explicit) == (2.0, 3.0, "config")


def test_sigmas_measured_with_other_prompts_are_not_reused(tmp_path, caplog):
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    store_sigmas(cfg, {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(cfg)})
    assert lookup_sigmas(cfg)[:2] == (0.6, 0.1)
    assert (
        lookup_sigmas(_cfg(tmp_path, "task=conll", "model=smollm2", "task.num_fewshot=3")) is None
    )
    assert "num_fewshot=10 (this run: 3)" in caplog.text
    assert lookup_sigmas(_cfg(tmp_path, "task=conll", "model=smollm2", "task.num_hints=5")) is None
    legacy = {"sigma_direct": 0.6, "sigma_reverse": 0.1, "data_dir": cfg.data.dir}
    store_sigmas(cfg, legacy)  # written before prompt settings were recorded
    assert lookup_sigmas(cfg) is None
    assert "num_fewshot=unrecorded" in caplog.text


def test_entries_are_keyed_by_dev_size_and_kept_side_by_side(tmp_path, caplog):
    small = _cfg(tmp_path, "task=conll", "model=smollm2", "task.dev_size=16")
    store_sigmas(
        small, {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(small)}
    )
    assert lookup_sigmas(_cfg(tmp_path, "task=conll", "model=smollm2", "task.dev_size=100")) is None
    assert "dev_size=16 (this run: 100)" in caplog.text
    short = _cfg(
        tmp_path, "task=conll", "model=smollm2", "task.dev_size=16", "task.max_new_tokens=32"
    )
    path = store_sigmas(
        short, {"sigma_direct": 0.7, "sigma_reverse": 0.2, **calibration_conditions(short)}
    )
    assert lookup_sigmas(small)[:2] == (0.6, 0.1) and lookup_sigmas(short)[:2] == (0.7, 0.2)
    store_sigmas(
        small, {"sigma_direct": 0.65, "sigma_reverse": 0.15, **calibration_conditions(small)}
    )  # measured again: replaces its own
    assert lookup_sigmas(small)[:2] == (0.65, 0.15)
    assert len(json.loads(path.read_text())["conll/smollm2/n3_b3"]) == 2


def test_calibration_log_states_the_real_number_of_inputs(tiny, tmp_path, caplog):
    import logging

    from grammarrl.calibration import calibrate
    from grammarrl.tasks import load_task

    model, tok = tiny
    cfg = _cfg(
        tmp_path,
        "model=tiny",
        "task=conll",
        "data.dir=null",
        "task.dev_size=100",
        "task.max_new_tokens=8",
        "rollout.num_samples=2",
        "rollout.beam_width=1",
    )
    task = load_task(cfg)
    held = len(task.splits().dev)
    with caplog.at_level(logging.INFO):
        entry = calibrate(cfg, model, tok, task)
    assert (
        f"calibrating conll/tiny/n2_b1 on {held} dev inputs (task.dev_size=100; the dev "
        f"split holds {held})"
    ) in caplog.text
    assert held < 100 and entry["num_inputs"] == held and entry["dev_size"] == 100


def test_custom_tasks_sharing_a_name_do_not_share_sigmas(tmp_path):
    """A custom task is its configuration: σ's measured for one spec are not reused for another
    spec under the same task name (here: another instruction)."""
    from grammarrl.tasks.custom_spec import resolve_spec

    spec = "task.spec=examples/support_tickets/task.yaml"
    cfg = _cfg(tmp_path, "task=custom", spec, "model=tiny")
    resolve_spec(cfg)
    store_sigmas(cfg, {"sigma_direct": 0.5, "sigma_reverse": 0.2, **calibration_conditions(cfg)})
    again = _cfg(tmp_path, "task=custom", spec, "model=tiny")
    resolve_spec(again)
    assert lookup_sigmas(again)[:2] == (0.5, 0.2)
    other = _cfg(tmp_path, "task=custom", spec, "model=tiny", "task.instruction=Answer briefly.")
    resolve_spec(other)
    assert other.task.name == cfg.task.name and lookup_sigmas(other) is None


def test_runs_on_other_test_sets_or_training_seeds_share_the_sigmas(tmp_path, caplog):
    """The σ's depend on `reward.calibration_seed`, not on `seed` (which draws the test sets) or
    `train.seed`: evaluating on other test sets or repeating training reuses one calibration."""
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    store_sigmas(cfg, {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(cfg)})
    other_sets = _cfg(tmp_path, "task=conll", "model=smollm2", "seed=1", "train.seed=2")
    assert lookup_sigmas(other_sets)[:2] == (0.6, 0.1)
    other_stream = _cfg(tmp_path, "task=conll", "model=smollm2", "reward.calibration_seed=1")
    assert lookup_sigmas(other_stream) is None
    assert "seed=0 (this run: 1)" in caplog.text


def test_calibration_samples_follow_the_calibration_seed(tiny, tmp_path):
    from grammarrl.calibration import calibrate
    from grammarrl.tasks import load_task

    model, tok = tiny
    base = ["model=tiny", "task=conll", "data.dir=null", "task.max_new_tokens=8"]

    def sigmas(*overrides: str) -> tuple[float, float]:
        cfg = _cfg(tmp_path, *base, *overrides)
        entry = calibrate(cfg, model, tok, load_task(cfg))
        return entry["sigma_direct"], entry["sigma_reverse"]

    assert sigmas("seed=0") == sigmas("seed=5")
    assert sigmas("reward.calibration_seed=1") != sigmas("reward.calibration_seed=0")
