"""W&B: one run per job, started before the mode runs and finished when it ends.

The run carries the job's own resolved config, its tags (task, model, mode and the settings the
mode sweeps) and the sweep's group (`logger.group`, by default the Hydra sweep directory), so
the jobs of a multirun are separate runs side by side in one group. Training logs its steps
into this run through Lightning's WandbLogger; every mode's results go to the run's summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import netrc
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig

from grammarrl.errors import ConfigError
from grammarrl.runs.paths import Roots, portable
from grammarrl.runs.results import config_dict, has_test_evaluation, predictions_name

TRACKED_MODES = ("train", "eval", "search", "calibrate")
DEFAULT_HOST = "https://api.wandb.ai"

log = logging.getLogger(__name__)


def is_rank_zero() -> bool:
    """Whether this is the job's main process: with DDP, Lightning re-runs the command for the
    other ranks with RANK / LOCAL_RANK / NODE_RANK set."""
    return all(int(os.environ.get(name, "0")) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def has_wandb_credentials() -> bool:
    """Whether W&B finds an API key without asking: WANDB_API_KEY, an identity token file, or
    a netrc entry for the W&B host (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", DEFAULT_HOST)).hostname
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        return path.is_file() and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_logger(cfg: DictConfig) -> None:
    """`logger.mode=online` needs credentials: refuse now rather than prompt or fail later."""
    if cfg.logger.name == "wandb" and cfg.logger.mode == "online" and not has_wandb_credentials():
        raise ConfigError(
            "logger.mode=online: no W&B credentials found (WANDB_API_KEY or `wandb login`); "
            "log in, or use logger.mode=offline and `wandb sync` the run later"
        )


def tags(cfg: DictConfig) -> list[str]:
    """The job's tags: task, model, mode and what the mode varies, then `logger.tags`."""
    found = [f"task={cfg.task.name}", f"model={cfg.model.name}", f"mode={cfg.mode}"]
    rollout = f"N={cfg.rollout.num_samples}", f"B={cfg.rollout.beam_width}"
    if cfg.mode == "train":
        found += [f"lambda={cfg['lambda']}", *rollout]
    elif cfg.mode == "calibrate":
        found += list(rollout)
    elif cfg.mode == "eval":
        found.append(f"decoding={cfg.eval.decoding}")
    elif cfg.mode == "search":
        found += [f"method={cfg.search.method}", f"particles={cfg.search.particles}"]
    if cfg.mode in ("eval", "search"):
        found.append(f"adapter={'yes' if cfg.eval.adapter else 'no'}")
    return [*found, *cfg.logger.tags]


def job_identity() -> tuple[str | None, str | None]:
    """(group, name) of this Hydra job: a multirun's jobs share the sweep directory as group
    and are named `<job number>:<overrides>`; a single run has no group."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None, None
    hydra = HydraConfig.get()
    overrides = hydra.job.override_dirname or Path(hydra.runtime.output_dir).name
    if hydra.mode == RunMode.MULTIRUN:
        return str(hydra.sweep.dir), f"{hydra.job.num}:{overrides}"
    return None, overrides


@contextlib.contextmanager
def job_run(cfg: DictConfig, out: Path | None) -> Iterator[Any]:
    """The job's W&B run (None with `logger=none`, in a mode that logs nothing, or on a DDP
    rank other than 0), finished when the block ends: with exit code 1 when it raised."""
    if cfg.logger.name != "wandb" or cfg.mode not in TRACKED_MODES or not is_rank_zero():
        yield None
        return
    import wandb

    sweep, name = job_identity()
    config = config_dict(cfg)
    roots = Roots.of(config)  # the run's config and group name paths as its records do
    config["logger"]["group"] = group = portable(cfg.logger.group or sweep, roots)
    config = portable(config, roots)
    run = wandb.init(
        project=cfg.logger.project,
        group=group,
        name=name,
        job_type=cfg.mode,
        tags=tags(cfg),
        config=config,
        mode=cfg.logger.mode,
        dir=str(out) if out is not None else None,
        settings=wandb.Settings(silent=True),
    )  # its banner and exit dump: our line below
    log.info("W&B run %s (%s): %s", run.id, cfg.logger.mode, run.dir)
    try:
        yield run
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()


def current_run() -> Any:
    """The W&B run this job started (`job_run`), or None (wandb is not imported for that)."""
    wandb = sys.modules.get("wandb")
    return wandb.run if wandb is not None else None


def results_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """Flat summary values of a mode's return value: `<results name>/<field>` for each results
    record (train returns several, keyed by evaluation), numbers as they are otherwise."""
    records = results_records(result)
    if not records:
        return {k: v for k, v in result.items() if isinstance(v, (int, float, str))}
    summary: dict[str, Any] = {}
    for record in records:
        name = Path(str(record.get("path", "results"))).stem
        for field in (
            "metric",
            "mean",
            "std",
            "scores",
            "validity",
            "truncated",
            "adapter",
            "decoding",
            "examples_per_second",
        ):
            if field in record:
                summary[f"{name}/{field}"] = record[field]
    return summary


def results_records(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The results records of a mode's return value (train returns several, keyed by
    evaluation; eval and search return one; a dev-only training run, which made no test
    evaluation, none: `has_test_evaluation`)."""
    if not has_test_evaluation(result):
        return []
    if "metric" in result:
        return [result]
    return [v for v in result.values() if isinstance(v, Mapping) and "metric" in v]


def predictions_table(results_path: Path) -> tuple[str, Any] | None:
    """(key, wandb.Table) of the predictions file written beside a results file: one row per
    (test set, example), nested fields as JSON text; None when there is no such file."""
    import wandb

    path = results_path.with_name(predictions_name(results_path.stem))
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    data = [[table_cell(row.get(column)) for column in columns] for row in rows]
    return path.stem, wandb.Table(columns=columns, data=data)


def table_cell(value: Any) -> Any:
    """A W&B table cell: numbers, text and booleans as they are, anything else as JSON."""
    return (
        value
        if value is None or isinstance(value, (str, int, float, bool))
        else json.dumps(value, ensure_ascii=False)
    )


def log_results(run: Any, result: object) -> None:
    """Put a mode's results into the run's summary and its predictions into tables (one per
    results file, e.g. `predictions`, `predictions_beam`); nothing without a run."""
    if run is None or not isinstance(result, Mapping):
        return
    run.summary.update(results_summary(result))
    tables = [
        predictions_table(Path(record["path"]))
        for record in results_records(result)
        if record.get("path")
    ]
    run.log(dict(table for table in tables if table is not None))
