"""Hydra entry point: `python -m grammarrl.run [mode=...] [task=...] [model=...] [overrides]`.

Thin on purpose: validate the config, then hand it to the mode's function in the package.

Reliability (for long runs and sweeps): a job whose run directory already holds `results.json`
(written last by train, eval and search) is skipped (`skip_completed=false` runs it again); a job
that fails writes `failed.json` (error, type, mode) into its run directory, removed once it
succeeds; in a multirun the failure is re-raised so Hydra records it and runs the other jobs.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import hydra
from omegaconf import DictConfig

from grammarrl.config import validate
from grammarrl.errors import GrammarRLError
from grammarrl.results import write_json

log = logging.getLogger("grammarrl")

# mode -> "module:function"; each function takes the composed config.
MODE_HANDLERS = {
    "prepare": "grammarrl.prepare:run_prepare",
    "eval": "grammarrl.evaluate:run_eval",
    "calibrate": "grammarrl.calibration:run_calibrate",
    "train": "grammarrl.train:run_train",
    "search": "grammarrl.search.run:run_search",
}


COMPLETED = "results.json"  # written last by the modes that score outputs
FAILED = "failed.json"
SKIPPABLE_MODES = ("train", "eval", "search")


def dispatch(cfg: DictConfig) -> object:
    """Validate the config and run its mode; raises GrammarRLError on user errors."""
    validate(cfg)
    done = completed_results(cfg)
    if done is not None:
        return done
    module_name, func_name = MODE_HANDLERS[cfg.mode].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise GrammarRLError(f"mode={cfg.mode} is not built yet in this version of GrammarRL")
    started = time.time()
    result = getattr(module, func_name)(cfg)
    record_timing(started)
    return result


TIMING = "timing.json"  # wall time of the job's last complete run (skipped re-runs keep it)


def record_timing(started: float) -> None:
    """Write `timing.json` (start, end, wall seconds) into the job's run directory."""
    out = _hydra_run_dir()
    if out is not None:
        finished = time.time()
        write_json(out / TIMING, {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(finished)),
            "wall_seconds": round(finished - started, 1)})


def _hydra_run_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return Path(HydraConfig.get().runtime.output_dir)


def completed_results(cfg: DictConfig) -> dict | None:
    """The stored results when this job's run directory says it already completed, else None."""
    out = _hydra_run_dir()
    if out is None or cfg.mode not in SKIPPABLE_MODES or not cfg.get("skip_completed", True):
        return None
    path = out / COMPLETED
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # unreadable: run the job again (it is rewritten atomically)
    log.warning("Skipping this job: %s exists (it completed before; skip_completed=false runs it "
                "again)", path)
    return results


def record_failure(cfg: DictConfig, err: BaseException) -> None:
    """Write `<run dir>/failed.json` (best effort: the disk may be what failed)."""
    out = _hydra_run_dir()
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
    out = _hydra_run_dir()
    if out is not None:
        (out / FAILED).unlink(missing_ok=True)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> object:
    try:
        result = dispatch(cfg)
    except GrammarRLError as err:
        log.error("%s", err)
        record_failure(cfg, err)
        if _in_multirun():
            raise  # Hydra records the job as failed and the sweep's other jobs still run
        sys.exit(2)
    except Exception as err:
        record_failure(cfg, err)
        raise
    clear_failure()
    return result


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


if __name__ == "__main__":
    main()
