"""σ resolution order and the calibration file."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from grammarrl.rl.calibration import (
    CalibrationSettings,
    calibration_conditions,
    check_calibration_file,
    lookup_sigmas,
    store_sigmas,
    within_group_std,
)
from tests.conftest import compose_config


def _cfg(tmp_path, *overrides):
    return compose_config([f"reward.calibration_file={tmp_path}/calibration.json", *overrides])


settings_of = CalibrationSettings.from_config


def test_within_group_std_is_mean_of_row_stds():
    values = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, 6.0]])
    assert within_group_std(values) == pytest.approx((1.0 + 0.0 + 2.0) / 3)


def test_within_group_std_leaves_out_empty_candidates():
    values = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [2.0, 6.0, 4.0]])
    valid = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    expected = (1.0 + torch.tensor([2.0, 6.0, 4.0]).std(unbiased=False).item()) / 2
    assert within_group_std(values, valid) == pytest.approx(expected)


def test_paper_table_for_llama_and_none_for_smollm2(tmp_path):
    assert lookup_sigmas(settings_of(_cfg(tmp_path, "task=gloss", "model=1b"))) == (
        1.1378,
        0.9731,
        "paper table",
    )
    got = lookup_sigmas(
        settings_of(_cfg(tmp_path, "task=conll", "model=1b", "rollout.beam_width=10"))
    )
    assert got[:2] == (0.8378, 0.2745)
    assert lookup_sigmas(settings_of(_cfg(tmp_path, "model=smollm2"))) is None
    assert lookup_sigmas(settings_of(_cfg(tmp_path, "model=3b", "rollout.num_samples=6"))) is None


def test_calibration_file_replaces_paper_and_config_wins(tmp_path):
    cfg = _cfg(tmp_path, "task=wos", "model=1b")
    path = store_sigmas(
        settings_of(cfg),
        {"sigma_direct": 0.4, "sigma_reverse": 0.03, **calibration_conditions(cfg)},
    )
    store_sigmas(
        settings_of(_cfg(tmp_path, "task=conll", "model=1b")),
        {"sigma_direct": 0.9, "sigma_reverse": 0.2},
    )
    assert set(json.loads(path.read_text())) == {"wos/1b/n3_b3", "conll/1b/n3_b3"}
    assert lookup_sigmas(settings_of(cfg))[:2] == (0.4, 0.03)
    other_data = _cfg(tmp_path, "task=wos", "model=1b", "data.dir=/elsewhere")
    assert (
        lookup_sigmas(settings_of(other_data))[2] == "paper table"
    )  # measured on other data: not reused
    explicit = _cfg(
        tmp_path, "task=wos", "model=1b", "reward.sigma_direct=2", "reward.sigma_reverse=3"
    )
    assert lookup_sigmas(settings_of(explicit)) == (2.0, 3.0, "config")


def test_sigmas_measured_with_other_prompts_are_not_reused(tmp_path, caplog):
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    store_sigmas(
        settings_of(cfg), {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(cfg)}
    )
    assert lookup_sigmas(settings_of(cfg))[:2] == (0.6, 0.1)
    assert (
        lookup_sigmas(
            settings_of(_cfg(tmp_path, "task=conll", "model=smollm2", "task.num_fewshot=3"))
        )
        is None
    )
    assert "num_fewshot=10 (this run: 3)" in caplog.text
    assert (
        lookup_sigmas(
            settings_of(_cfg(tmp_path, "task=conll", "model=smollm2", "task.num_hints=5"))
        )
        is None
    )
    legacy = {"sigma_direct": 0.6, "sigma_reverse": 0.1, "data_dir": cfg.data.dir}
    store_sigmas(settings_of(cfg), legacy)  # written before prompt settings were recorded
    assert lookup_sigmas(settings_of(cfg)) is None
    assert "num_fewshot=unrecorded" in caplog.text


def test_entries_are_keyed_by_dev_size_and_kept_side_by_side(tmp_path, caplog):
    small = _cfg(tmp_path, "task=conll", "model=smollm2", "task.dev_size=16")
    store_sigmas(
        settings_of(small),
        {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(small)},
    )
    assert (
        lookup_sigmas(
            settings_of(_cfg(tmp_path, "task=conll", "model=smollm2", "task.dev_size=100"))
        )
        is None
    )
    assert "dev_size=16 (this run: 100)" in caplog.text
    short = _cfg(
        tmp_path, "task=conll", "model=smollm2", "task.dev_size=16", "task.max_new_tokens=32"
    )
    path = store_sigmas(
        settings_of(short),
        {"sigma_direct": 0.7, "sigma_reverse": 0.2, **calibration_conditions(short)},
    )
    assert lookup_sigmas(settings_of(small))[:2] == (0.6, 0.1) and lookup_sigmas(
        settings_of(short)
    )[:2] == (0.7, 0.2)
    store_sigmas(
        settings_of(small),
        {"sigma_direct": 0.65, "sigma_reverse": 0.15, **calibration_conditions(small)},
    )  # measured again: replaces its own
    assert lookup_sigmas(settings_of(small))[:2] == (0.65, 0.15)
    assert len(json.loads(path.read_text())["conll/smollm2/n3_b3"]) == 2


def test_calibration_log_states_the_real_number_of_inputs(tiny, tmp_path, caplog):
    import logging

    from grammarrl.rl.calibration import calibrate
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
        entry = calibrate(settings_of(cfg), model, tok, task)
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
    store_sigmas(
        settings_of(cfg), {"sigma_direct": 0.5, "sigma_reverse": 0.2, **calibration_conditions(cfg)}
    )
    again = _cfg(tmp_path, "task=custom", spec, "model=tiny")
    resolve_spec(again)
    assert lookup_sigmas(settings_of(again))[:2] == (0.5, 0.2)
    other = _cfg(tmp_path, "task=custom", spec, "model=tiny", "task.instruction=Answer briefly.")
    resolve_spec(other)
    assert other.task.name == cfg.task.name and lookup_sigmas(settings_of(other)) is None


def test_a_custom_task_on_another_test_file_or_budget_reuses_its_sigmas(tmp_path, caplog):
    """A custom task's test file, metric and training defaults do not move its σ's (dev is drawn
    before the test pool): a run that changes only those reuses the stored entry, also one
    stored with the whole task configuration; a changed dev size is named key by key."""
    from grammarrl.tasks.custom_spec import resolve_spec

    spec = "task.spec=examples/support_tickets/triage.yaml"
    cfg = _cfg(tmp_path, "task=custom", spec, "model=tiny")
    resolve_spec(cfg)
    whole = {**calibration_conditions(cfg), "task": dict(cfg.task)}  # as stored before
    assert whole["task"]["test"] != calibration_conditions(cfg)["task"].get("test")
    store_sigmas(settings_of(cfg), {"sigma_direct": 0.5, "sigma_reverse": 0.2, **whole})
    moved = ["task.test=examples/support_tickets/test_fresh.jsonl", "task.max_steps=120"]
    again = _cfg(tmp_path, "task=custom", spec, "model=tiny", *moved, "task.lr=1e-5")
    resolve_spec(again)
    assert lookup_sigmas(settings_of(again))[:2] == (0.5, 0.2)
    other = _cfg(tmp_path, "task=custom", spec, "model=tiny", "task.dev_size=8")
    resolve_spec(other)
    assert lookup_sigmas(settings_of(other)) is None
    assert "task.dev_size=16 (this run: 8)" in caplog.text and "task.spec" not in caplog.text


def test_runs_on_other_test_sets_or_training_seeds_share_the_sigmas(tmp_path, caplog):
    """The σ's depend on `reward.calibration_seed`, not on `seed` (which draws the test sets) or
    `train.seed`: evaluating on other test sets or repeating training reuses one calibration."""
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    store_sigmas(
        settings_of(cfg), {"sigma_direct": 0.6, "sigma_reverse": 0.1, **calibration_conditions(cfg)}
    )
    other_sets = _cfg(tmp_path, "task=conll", "model=smollm2", "seed=1", "train.seed=2")
    assert lookup_sigmas(settings_of(other_sets))[:2] == (0.6, 0.1)
    other_stream = _cfg(tmp_path, "task=conll", "model=smollm2", "reward.calibration_seed=1")
    assert lookup_sigmas(settings_of(other_stream)) is None
    assert "seed=0 (this run: 1)" in caplog.text


def test_calibration_samples_follow_the_calibration_seed(tiny, tmp_path):
    from grammarrl.rl.calibration import calibrate
    from grammarrl.tasks import load_task

    model, tok = tiny
    base = ["model=tiny", "task=conll", "data.dir=null", "task.max_new_tokens=8"]

    def sigmas(*overrides: str) -> tuple[float, float]:
        cfg = _cfg(tmp_path, *base, *overrides)
        entry = calibrate(settings_of(cfg), model, tok, load_task(cfg))
        return entry["sigma_direct"], entry["sigma_reverse"]

    assert sigmas("seed=0") == sigmas("seed=5")
    assert sigmas("reward.calibration_seed=1") != sigmas("reward.calibration_seed=0")


def _calibrate_on(monkeypatch, cfg, direct, reverse, valid=None):
    """`calibrate` on dev rollouts with these rewards (one group per row), no model."""
    from grammarrl.rl.calibration import calibrate

    direct, reverse = torch.tensor(direct), torch.tensor(reverse)
    valid = torch.ones_like(direct, dtype=torch.bool) if valid is None else torch.tensor(valid)
    batch = SimpleNamespace(direct=direct, reverse=reverse, valid=valid)
    monkeypatch.setattr("grammarrl.rl.calibration.dev_rollouts", lambda *args: [batch])
    task = SimpleNamespace(splits=lambda: SimpleNamespace(dev=list(range(len(direct)))))
    return calibrate(settings_of(cfg), None, None, task)


def test_a_sigma_of_zero_or_nan_is_refused_saying_why_and_nothing_is_stored(tmp_path, monkeypatch):
    from grammarrl.rl.calibration import CalibrationError
    from grammarrl.training.train import resolve_sigmas

    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    spread = [[1.0, 2.0, 4.0], [0.0, 1.0, 3.0]]
    same = [[-3.0, -3.0, -3.0], [-5.0, -5.0, -5.0]]  # every group's candidates score alike
    with pytest.raises(CalibrationError) as err:
        _calibrate_on(monkeypatch, cfg, spread, same)
    message = str(err.value)
    assert message.startswith("calibrating conll/smollm2/n3_b3: σ_reverse would be 0: 0 of 2 ")
    for advice in ("task.dev_size", "rollout.temperature (now 1.0)", "reward.sigma_reverse"):
        assert advice in message
    alone = [[True, False, False], [False, True, False]]  # no group has two valid candidates
    with pytest.raises(CalibrationError, match="σ_direct would be nan: 0 of 0 "):
        _calibrate_on(monkeypatch, cfg, spread, spread, alone)
    with pytest.raises(CalibrationError):  # in training: calibrated, refused, not stored
        resolve_sigmas(
            settings_of(cfg),
            None,
            None,
            SimpleNamespace(splits=lambda: SimpleNamespace(dev=[0, 1])),
        )
    assert not (tmp_path / "calibration.json").exists()


def test_a_stored_sigma_of_null_or_zero_is_not_reused(tmp_path, caplog):
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    for bad in (None, 0.0):
        store_sigmas(
            settings_of(cfg),
            {"sigma_direct": 0.5, "sigma_reverse": bad, **calibration_conditions(cfg)},
        )
        assert lookup_sigmas(settings_of(cfg)) is None
        assert f"not reusing σ_direct=0.5 σ_reverse={bad}" in caplog.text


def test_sigmas_are_logged_with_their_standard_error_and_few_inputs_warned(
    tmp_path, monkeypatch, caplog
):
    import logging

    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    groups = [[0.0, 1.0], [0.0, 3.0], [0.0, 2.0], [0.0, 6.0]]  # group stds 0.5, 1.5, 1, 3
    with caplog.at_level(logging.INFO):
        entry = _calibrate_on(monkeypatch, cfg, groups, groups)
    stderr = torch.tensor([0.5, 1.5, 1.0, 3.0]).std().item() / 2
    assert entry["sigma_direct"] == pytest.approx(1.5)
    assert entry["sigma_direct_stderr"] == pytest.approx(stderr)
    assert f"σ_direct=1.5000 ± {stderr:.4f}" in caplog.text and "over 4 dev inputs" in caplog.text
    warned = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        (
            f"σ_direct ±{stderr / 1.5:.0%}, σ_reverse ±{stderr / 1.5:.0%}: calibrated on 4 dev "
            "inputs, the σ's are this uncertain (and with them the reward's scale); more dev "
            "inputs (task.dev_size, task.dev) measure them better"
        )
    ]


def test_a_corrupt_calibration_file_is_named_before_any_model_loads_and_kept(tmp_path, monkeypatch):
    from grammarrl.errors import ConfigError
    from grammarrl.run import dispatch

    path = tmp_path / "calibration.json"
    path.write_text('{"conll/smollm2/n3_b3": [{"sigma_direct": 0.5,')  # a write cut short
    cfg = _cfg(tmp_path, "task=conll", "model=smollm2")
    with pytest.raises(ConfigError, match=rf"^reward.calibration_file={path} is not a calib"):
        lookup_sigmas(settings_of(cfg))
    with pytest.raises(ConfigError, match="repair it, or move it away"):
        store_sigmas(settings_of(cfg), {"sigma_direct": 0.6, "sigma_reverse": 0.1})

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the calibration file was read")

    monkeypatch.setattr("grammarrl.models.loading.load_model", loaded)
    monkeypatch.setattr("grammarrl.training.train.load_model", loaded)
    monkeypatch.chdir(tmp_path)  # a run that got through would write its outputs here
    for mode in ("train", "calibrate", "diagnose"):
        job = _cfg(tmp_path, "model=tiny", "logger=none", f"mode={mode}")
        with pytest.raises(ConfigError, match="^reward.calibration_file=") as err:
            dispatch(job)
        assert "\n" not in str(err.value)
    sigmas = _cfg(tmp_path, "model=tiny", "reward.sigma_direct=1", "reward.sigma_reverse=1")
    check_calibration_file(
        settings_of(sigmas), sigmas.mode
    )  # a run that does not read the file is not stopped by it
    assert path.read_text() == '{"conll/smollm2/n3_b3": [{"sigma_direct": 0.5,'
