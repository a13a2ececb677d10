"""The test evaluations after training: a run interrupted between them evaluates, when
restarted, only what it had not written yet (with the same adapter), everything again under
`skip_completed=false`."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

import grammarrl.evaluation.evaluate
from grammarrl.runs.results import adapter_name
from grammarrl.training.trained_eval import TrainedEvalSettings, evaluate_trained
from tests.conftest import compose_config


class FakePolicy(torch.nn.Module):
    """What `evaluate_trained` asks of a PEFT model, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def load_adapter(self, path: str, adapter_name: str) -> None:
        self.calls.append(f"load {adapter_name}")

    def set_adapter(self, name: str) -> None:
        self.calls.append(f"set {name}")

    def delete_adapter(self, name: str) -> None:
        self.calls.append(f"delete {name}")

    @contextlib.contextmanager
    def disable_adapter(self):
        self.calls.append("disable")
        yield


@pytest.fixture
def evaluated(monkeypatch):
    """The names `evaluate` was called for; each call writes `<name>.json` as it would."""
    names: list[str] = []

    def fake_evaluate(
        settings, model, tokenizer, task, decoding, out, name="results", adapter=None
    ):
        names.append(name)
        record = {"decoding": decoding, "adapter": adapter_name(adapter), "fresh": True}
        (Path(out) / f"{name}.json").write_text(json.dumps(record))
        return {**record, "path": str(Path(out) / f"{name}.json")}

    monkeypatch.setattr(grammarrl.evaluation.evaluate, "evaluate", fake_evaluate)
    return names


def interrupted_run(out: Path) -> dict:
    """A run dir whose job wrote its dev-best and frozen evaluations, not results.json; the
    dev-best record it evaluated."""
    best_dev_adapter = out / "adapter-best-dev"
    best_dev_adapter.mkdir(parents=True)
    (best_dev_adapter / "adapter_config.json").write_text("{}")
    stored = {"adapter": adapter_name(best_dev_adapter), "scores": [0.4]}
    (out / "results_best_dev.json").write_text(json.dumps(stored))
    (out / "results_baseline.json").write_text(json.dumps({"adapter": None, "scores": [0.2]}))
    return {"step": 2, "adapter": str(best_dev_adapter), "value": 0.5}


def run(out: Path, best: dict, *overrides: str) -> tuple[dict, FakePolicy]:
    cfg = compose_config(["model=tiny", "train.eval_baseline=true", *overrides])
    policy = FakePolicy()
    settings = TrainedEvalSettings.from_config(cfg)
    results = evaluate_trained(
        settings, policy, None, None, out, out / "adapter", best, final_step=3
    )
    return results, policy


def test_a_restarted_run_keeps_the_evaluations_it_wrote(tmp_path, evaluated):
    best = interrupted_run(tmp_path)
    results, policy = run(tmp_path, best)
    assert evaluated == ["results"]  # only the one it had not written
    assert results["best_dev"]["scores"] == [0.4] and results["baseline"]["scores"] == [0.2]
    assert results["best_dev"]["path"] == str(tmp_path / "results_best_dev.json")
    assert policy.calls == []  # no adapter loaded, the reference never run


def test_a_stored_evaluation_of_another_adapter_is_made_again(tmp_path, evaluated):
    best = interrupted_run(tmp_path)
    (tmp_path / "results_best_dev.json").write_text(json.dumps({"adapter": "/elsewhere"}))
    results, _ = run(tmp_path, best)
    assert evaluated == ["results_best_dev", "results"]
    assert results["best_dev"]["fresh"]


def test_skip_completed_false_evaluates_everything_again(tmp_path, evaluated):
    best = interrupted_run(tmp_path)
    results, policy = run(tmp_path, best, "skip_completed=false")
    assert evaluated == ["results_best_dev", "results_baseline", "results"]
    assert results["best_dev"]["fresh"] and results["baseline"]["fresh"]
    assert "disable" in policy.calls and "load best_dev" in policy.calls
