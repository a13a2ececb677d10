"""Hydra entry point: `python -m grammarrl.run [mode=...] [task=...] [model=...] [overrides]`.

Thin on purpose: check the config and the run directory, then hand the config to the mode's
function in the package, inside the job's W&B run (`grammarrl.runs.tracking`).

Order of a job, all before any model or data is loaded and before the run directory is
touched: the config is validated once (unknown keys, bad values, contradictions; for a single
run and `--cfg` before Hydra starts, and the job runs with the config so checked), the run
directory's record decides whether the job is skipped (its results exist under the same
settings), continues, or is refused (`grammarrl.runs.rundir`), and the environment is checked (W&B
credentials, device, the model's files, the adapter, the calibration file, a checkpoint to
resume: found once, handed to the mode's function). A job that fails writes `failed.json` (error,
type, mode) into its run directory, removed once it succeeds; in a multirun the failure is
re-raised (one line, no traceback) so Hydra records it and runs the other jobs.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.errors import CompactHydraException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from grammarrl.config.checks import missing_option_error
from grammarrl.errors import ConfigError, GrammarRLError
from grammarrl.job import compose_job_config, validate
from grammarrl.runs import rundir, tracking
from grammarrl.runs.atomic import write_json
from grammarrl.runs.logs import quiet_third_party
from grammarrl.runs.rundir import hydra_run_dir
from grammarrl.tasks.custom_spec import run_task_name

log = logging.getLogger("grammarrl")
OmegaConf.register_new_resolver("grammarrl.task_name", run_task_name, replace=True)

# mode -> "module:function"; each function takes the composed config, and what the pre-flight
# check found for it as keywords (`preflight`: train's `resume`).
MODE_HANDLERS = {
    "prepare": "grammarrl.prepare:run_prepare",
    "eval": "grammarrl.evaluation.evaluate:run_eval",
    "calibrate": "grammarrl.rl.calibration:run_calibrate",
    "train": "grammarrl.training.train:run_train",
    "search": "grammarrl.search.run:run_search",
    "diagnose": "grammarrl.diagnosis.run:run_diagnose",
    "export": "grammarrl.export:run_export",
}

FAILED = "failed.json"
TIMING = "timing.json"  # wall time of the job's last complete run (skipped re-runs keep it)


def preflight(cfg: DictConfig, out: Path | None, plan: rundir.Plan) -> dict[str, Any]:
    """Checks of the environment a job needs, before any model or data is loaded and before
    its run directory is touched (they change nothing): W&B credentials, the device, the
    model's files, the adapter to evaluate, the reward class, the calibration file, and (train)
    the checkpoint the run would resume from, unless the plan deletes it. Returns what the mode's function takes
    from them, so that it does not find it again: `resume` (train)."""
    from grammarrl.models.loading import check_adapter_dir, check_model_source, resolve_device
    from grammarrl.rl.calibration import CalibrationSettings, check_calibration_file
    from grammarrl.rl.reward import reward_class

    tracking.check_logger(cfg)
    resolve_device(cfg.device)
    check_model_source(cfg.model)
    if cfg.eval.adapter:
        check_adapter_dir(cfg.eval.adapter)
    reward_class(cfg.reward._target_)  # importable, and a Reward
    check_calibration_file(CalibrationSettings.from_config(cfg), cfg.mode)
    if cfg.mode == "train" and out is not None and out / "checkpoints" not in plan.remove:
        from grammarrl.runs.results import config_dict
        from grammarrl.training.resume import resolve_resume

        resume = resolve_resume(out, cfg.train.resume, cfg.trainer.max_steps, config_dict(cfg))
        return {"resume": resume}
    return {}


def dispatch(cfg: DictConfig, validated: bool = False) -> object:
    """Validate the config (unless `validated`: the command line's check did) and run its mode;
    raises GrammarRLError on user errors."""
    quiet_third_party()
    if not validated:
        validate(cfg)
    out = hydra_run_dir()
    owner = out is not None and tracking.is_rank_zero()  # DDP's other ranks share its directory
    with rundir.claimed(out) if owner else contextlib.nullcontext():
        plan = rundir.plan_job(cfg, out) if out is not None else rundir.Plan()
        if plan.done is not None:
            return plan.done
        found = preflight(cfg, out, plan)
        if owner:
            rundir.commit(cfg, out, plan)
        module_name, func_name = MODE_HANDLERS[cfg.mode].split(":")
        handler = getattr(importlib.import_module(module_name), func_name)
        started = time.time()
        with tracking.job_run(cfg, out) as run:
            result = handler(cfg, **found)
            tracking.log_results(run, result)
        record_timing(started)
    return result


def record_timing(started: float) -> None:
    """Write `timing.json` (start, end, wall seconds) into the job's run directory."""
    out = hydra_run_dir()
    if out is not None:
        finished = time.time()
        write_json(
            out / TIMING,
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(finished)),
                "wall_seconds": round(finished - started, 1),
            },
        )


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """Write `<run dir>/failed.json` (best effort: the disk may be what failed)."""
    out = hydra_run_dir()
    if out is None:
        return

    record = {
        "error": str(err),
        "type": type(err).__name__,
        "mode": cfg.get("mode"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if not isinstance(err, GrammarRLError):  # a bug or a crash: keep where it happened
        record["traceback"] = traceback.format_exception(err)[-12:]
    try:
        write_json(out / FAILED, record)
    except (OSError, GrammarRLError) as write_err:
        log.error("could not record the failure in %s: %s", out / FAILED, write_err)


def clear_failure() -> None:
    out = hydra_run_dir()
    if out is not None:
        (out / FAILED).unlink(missing_ok=True)


# The single run's config as `check_command_line` composed and validated it: the job runs
# with it instead of validating Hydra's copy of the same composition again.
CHECKED: list[DictConfig] = []


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> object:
    checked = CHECKED.pop() if CHECKED and not _in_multirun() else None
    cfg = checked if checked is not None else cfg
    try:
        result = dispatch(cfg, validated=checked is not None)
    except GrammarRLError as err:
        log.error("%s", err)
        if not isinstance(err, rundir.RunDirConflict):  # the directory's own job did not fail
            record_failure(cfg, err)
        if _in_multirun():  # Hydra records the job as failed; the sweep's other jobs still run
            raise JobFailed(f"job {_job_num()}: {err}") from err
        sys.exit(2)
    except Exception as err:
        record_failure(cfg, err)
        raise
    clear_failure()
    return result


class JobFailed(CompactHydraException):
    """A multirun job stopped by a GrammarRLError: Hydra prints its one line, no traceback."""


def _job_num() -> int:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().job.num


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def check_command_line(argv: list[str]) -> DictConfig | None:
    """Refuse a single run's (or `--cfg`'s) bad config before Hydra starts: an unknown key,
    with or without `+`, a config group option that does not exist, and every value `validate`
    checks. Exits 2 with one line naming the key; returns the validated config (None where it
    checks nothing). Sweeps (`-m`) are checked job by job in `dispatch`; custom config paths
    by Hydra."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    custom = args.config_path or args.config_name or args.config_dir
    if (
        args.multirun
        or custom
        or args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
    ):
        return None
    try:
        return checked_config(args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, ValueError):
        return None  # Hydra reports its own composition errors (an ambiguous value, ...)


def checked_config(overrides: list[str]) -> DictConfig:
    """The job's config composed from `overrides` and validated (`python -m grammarrl.plan`
    checks its config so too); a ConfigError names the bad key, or the group whose option
    does not exist (`model=13b`) with its options."""
    try:
        cfg = compose_job_config(overrides)
    except MissingConfigException as err:
        raise missing_option_error(err) from None
    validate(cfg)
    return cfg


def cli() -> None:
    """`python -m grammarrl.run`: the command-line check, then Hydra's main (which runs the
    job with the config the check validated)."""
    checked = check_command_line(sys.argv[1:])
    if checked is not None:
        CHECKED.append(checked)
    main()


if __name__ == "__main__":
    cli()
