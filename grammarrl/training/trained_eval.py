"""The test evaluations at the end of a training run: the last step's adapter greedily
(results.json, written last: it marks the run complete), optionally with beam search, the
frozen model, and the adapter of the step with the best dev metric. A run interrupted between
them evaluates, when restarted, only what it had not written yet. A dev-only run
(`train.eval_test=false`) draws no test set: its results.json marks it complete and says that
no test evaluation was run (`record_untested`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.evaluation.settings import EvalSettings
from grammarrl.models.loading import reference_mode, resolve_device
from grammarrl.runs.atomic import write_json
from grammarrl.runs.paths import Roots, local
from grammarrl.runs.results import adapter_name, untested_results
from grammarrl.training.callbacks import BEST_DEV_RECORD

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedEvalSettings:
    """Which test evaluations a training run ends with, and how each decodes and records."""

    evaluation: EvalSettings
    device: str  # device: where the policy evaluates (Lightning's teardown leaves it on the CPU)
    test: bool  # train.eval_test: evaluate on the test sets at all (false: a dev-only run)
    beam: bool  # train.eval_beam: also with beam search (results_beam.json)
    baseline: bool  # train.eval_baseline: also the frozen model (results_baseline.json)
    skip_completed: bool  # keep the evaluations a restarted run wrote before (`stored_result`)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> TrainedEvalSettings:
        """The settings of a composed config, after `load_task` (`EvalSettings.from_config`)."""
        return cls(
            evaluation=EvalSettings.from_config(cfg),
            device=cfg.device,
            test=bool(cfg.train.eval_test),
            beam=bool(cfg.train.eval_beam),
            baseline=bool(cfg.train.eval_baseline),
            skip_completed=bool(cfg.skip_completed),
        )


def evaluate_trained(
    settings: TrainedEvalSettings,
    policy: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    out: Path,
    adapter: Path,
    best_dev: dict[str, Any] | None = None,
    final_step: int = 0,
) -> dict[str, dict[str, Any]]:
    """The trained adapter greedily (results.json), and with beam search and the frozen model
    (adapter disabled) when `settings.beam` / `settings.baseline` ask for them, and the
    dev-best step's adapter when `best_dev` (`BestDevAdapter.best`) names another step. Only
    for `settings.test` (a dev-only run writes `record_untested` instead)."""
    from grammarrl.evaluation.evaluate import evaluate

    evaluation, skip = settings.evaluation, settings.skip_completed
    # Lightning's teardown after `fit` leaves the module on the CPU: back to the run's device.
    policy.to(resolve_device(settings.device)).eval()
    # results.json (greedy) is written last: its presence marks the run as complete (a sweep
    # re-run skips the job); a restart after a crash before it keeps what was written.
    results = evaluate_best_dev(
        evaluation, skip, policy, tokenizer, task, out, best_dev, final_step
    )
    if settings.beam:
        results["beam"] = stored_result(out, "results_beam", adapter, skip) or evaluate(
            evaluation, policy, tokenizer, task, "beam", out, name="results_beam", adapter=adapter
        )
    if settings.baseline:
        results["baseline"] = stored_result(out, "results_baseline", None, skip)
        if results["baseline"] is None:
            with reference_mode(policy):
                results["baseline"] = evaluate(
                    evaluation, policy, tokenizer, task, "greedy", out, name="results_baseline"
                )
    greedy = evaluate(
        evaluation, policy, tokenizer, task, "greedy", out, name="results", adapter=adapter
    )
    return {"greedy": greedy, **results}


def record_untested(
    settings: TrainedEvalSettings,
    task: Any,
    out: Path,
    adapter: Path,
    best_dev: dict[str, Any] | None,
    final_step: int,
) -> dict[str, Any]:
    """results.json of a dev-only run (`train.eval_test=false`), written in place of every test
    evaluation: it marks the run complete (a re-run is skipped) and records that no test
    evaluation was run (`untested_results`), with the last step, its adapter and the dev-best
    step (`best_dev`: `BestDevAdapter.best`, None when no validation after a step kept one)."""
    record = untested_results(
        task=task.name,
        model=settings.evaluation.model,
        config=settings.evaluation.config,
        final_step=final_step,
        adapter=adapter_name(adapter),
        best_dev=best_dev,
    )
    path = write_json(out / "results.json", record)
    log.info("train.eval_test=false: no test evaluation; wrote %s", path)
    return {**record, "path": str(path)}


def evaluate_best_dev(
    evaluation: EvalSettings,
    skip_completed: bool,
    policy: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    out: Path,
    best: dict[str, Any] | None,
    final: int,
) -> dict[str, dict[str, Any]]:
    """The adapter of the step with the best dev metric, greedily (`results_best_dev.json`;
    its step and dev value in `best_dev.json` beside it), unless that step is the last (`final`:
    results.json is that evaluation) or no validation after a trained step kept one.
    `skip_completed`: keep the evaluation a restarted run wrote before (`stored_result`)."""
    from grammarrl.evaluation.evaluate import evaluate

    if best is None:
        return {}
    if int(best["step"]) == final:
        log.info("train.eval_best_dev: the best dev step is the last (%d); nothing more", final)
        return {}
    adapter = Path(local(best["adapter"], Roots.here()))  # recorded as results name it
    if not (adapter / "adapter_config.json").exists():
        log.warning(
            "train.eval_best_dev: %s (step %s) is not there; skipped", adapter, best["step"]
        )
        return {}
    write_json(out / BEST_DEV_RECORD, best)
    stored = stored_result(out, "results_best_dev", adapter, skip_completed)
    if stored is not None:
        return {"best_dev": stored}
    policy.load_adapter(str(adapter), adapter_name="best_dev")
    policy.set_adapter("best_dev")
    try:
        result = evaluate(
            evaluation,
            policy,
            tokenizer,
            task,
            "greedy",
            out,
            name="results_best_dev",
            adapter=adapter,
        )
    finally:
        policy.set_adapter("default")
        policy.delete_adapter("best_dev")
    return {"best_dev": result}


def stored_result(
    out: Path, name: str, adapter: Path | None, skip_completed: bool
) -> dict[str, Any] | None:
    """`<out>/<name>.json` when this run already wrote it with the same adapter (None: the
    frozen model) before it was interrupted, else None. The run directory's plan removed the
    results of other settings or fewer steps, so what is left came from these weights;
    `skip_completed=false` evaluates everything again."""
    path = out / f"{name}.json"
    if not skip_completed:
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if stored.get("adapter") != adapter_name(adapter):
        return None
    log.info("%s is already there (this run wrote it before it was interrupted): kept", path)
    return {**stored, "path": str(path)}
