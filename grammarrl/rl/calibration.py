"""σ constants: mean within-group standard deviation of each reward term under the frozen model.

Resolution order for a run: `reward.sigma_*` set explicitly > a calibration file entry for
(task, model, N, B) measured under the run's conditions (`calibration_conditions`: data, dev
inputs, weights and dtype, prompts, candidates, sampling stream, a reward other than the paper's)
> the paper's table (`task.sigmas[model][nN_bB]`, the paper's reward only) > calibrate now. The
σ's are measured on the terms of the run's reward (`reward._target_`).

The calibration file maps each key `task/model/nN_bB` to a list of entries, one per set of
conditions, so runs that alternate settings reuse their own σ's instead of recalibrating.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from filelock import FileLock
from omegaconf import DictConfig
from tqdm import tqdm

from grammarrl.config.checks import rollout_key
from grammarrl.config.schema_training import DEFAULT_REWARD
from grammarrl.errors import ConfigError, GrammarRLError
from grammarrl.models.loading import resolve_device, resolve_dtype
from grammarrl.rl.settings import RolloutSettings
from grammarrl.runs.atomic import write_json
from grammarrl.runs.paths import Roots, portable
from grammarrl.runs.results import config_dict
from grammarrl.runs.rundir import hydra_run_dir, run_dir

if TYPE_CHECKING:
    from grammarrl.rl.rollout import RolloutBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationSettings:
    """What looking up, measuring and storing a run's σ's reads from its config (`from_config`)."""

    key: str  # task/model/nN_bB (`calibration_key`)
    file: Path  # reward.calibration_file: the σ's of every key
    conditions: dict[str, Any]  # `calibration_conditions`: an entry is reused under these only
    given: tuple[float | None, float | None]  # reward.sigma_direct, reward.sigma_reverse
    paper: tuple[float, float] | None  # the task's σ table entry for (model, N, B)
    dev_size: int  # task.dev_size: dev inputs measured
    batch_size: int  # optim.batch_size: inputs rolled out together
    seed: int  # reward.calibration_seed: the sampling stream
    reward: str  # reward._target_: the reward whose terms are measured
    rollout: RolloutSettings
    max_new_tokens: int

    @classmethod
    def from_config(cls, cfg: DictConfig) -> CalibrationSettings:
        """The settings of a composed config."""
        rollout = RolloutSettings.from_config(cfg.rollout)
        paper = cfg.task.sigmas.get(cfg.model.name, {}).get(
            rollout_key(rollout.num_samples, rollout.beam_width)
        )
        if cfg.reward._target_ != DEFAULT_REWARD:
            paper = None  # the paper's σ's scale the paper's reward only
        return cls(
            key=calibration_key(
                cfg.task.name, cfg.model.name, rollout.num_samples, rollout.beam_width
            ),
            file=Path(cfg.reward.calibration_file),
            conditions=calibration_conditions(cfg),
            given=(cfg.reward.sigma_direct, cfg.reward.sigma_reverse),
            paper=None if paper is None else (float(paper[0]), float(paper[1])),
            dev_size=cfg.task.dev_size,
            batch_size=cfg.optim.batch_size,
            seed=cfg.reward.calibration_seed,
            reward=cfg.reward._target_,
            rollout=rollout,
            max_new_tokens=cfg.task.max_new_tokens,
        )


def calibration_key(task: str, model: str, num_samples: int, beam_width: int) -> str:
    """The key of a run's σ's: task/model/nN_bB."""
    return f"{task}/{model}/{rollout_key(num_samples, beam_width)}"


def calibration_conditions(cfg: DictConfig) -> dict[str, Any]:
    """Everything the σ's depend on beyond the key: the data and dev inputs, the model's weights
    and dtype, how prompts and candidates are built, and the sampling stream (its seed,
    `reward.calibration_seed`, and the batches it is drawn in). An entry measured under other
    conditions is not reused. The run's `seed` (test sets) and `train.seed` are not among them:
    runs that differ only in those share their σ's, hence their reward. A reward other than the
    paper's is a condition too (entries stored before rewards were selectable lack it)."""
    from grammarrl.tasks.custom import is_custom

    model = {k: v for k, v in config_dict(cfg.model).items() if k not in ("name", "dtype")}
    # A custom task is defined by its configuration (files, constraint, prompts): two specs
    # sharing a name must not share σ's. Built-in tasks are fixed by name and the keys below.
    # Its test file and training defaults do not move the σ's (dev is drawn before the test pool).
    task = {"task": _calibrated_task(config_dict(cfg.task))} if is_custom(cfg.task) else {}
    conditions = {
        **task,
        "data_dir": cfg.data.dir,
        "data_source": cfg.data.source,
        "split_seed": cfg.data.split_seed,
        "embedder": cfg.data.embedder,
        "dev_size": cfg.task.dev_size,
        "num_fewshot": cfg.task.num_fewshot,
        "num_hints": cfg.task.num_hints,
        "max_new_tokens": cfg.task.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "length_penalty": cfg.rollout.length_penalty,
        "model": model,
        "dtype": str(resolve_dtype(cfg.model.dtype, resolve_device(cfg.device))).removeprefix(
            "torch."
        ),
        "seed": cfg.reward.calibration_seed,  # named before reward.calibration_seed existed
        "batch_size": cfg.optim.batch_size,
    }
    if cfg.reward._target_ != DEFAULT_REWARD:
        conditions["reward"] = cfg.reward._target_
    return portable(conditions, Roots.of(config_dict(cfg)))  # paths as run records name them


# A custom task's keys its σ's do not depend on: the dev inputs are drawn before the test pool,
# the metric only scores, and the training defaults reach calibration as optim.batch_size.
UNCALIBRATED = ("test", "test_fraction", "metric", "max_steps", "lr", "batch_size")


def _calibrated_task(task: Any) -> Any:
    """A custom task's configuration less the keys its σ's do not depend on (`UNCALIBRATED`)."""
    if not isinstance(task, dict):
        return task
    return {k: v for k, v in task.items() if k not in UNCALIBRATED}


def read_table(path: Path) -> dict[str, Any]:
    """The calibration table in `path` ({} when there is no file); a ConfigError naming the
    file when it is not one (it is never overwritten then)."""
    if not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        table = err
    if not isinstance(table, dict):
        reason = str(table) if isinstance(table, ValueError) else "not a JSON object"
        raise ConfigError(
            f"reward.calibration_file={path} is not a calibration file ({reason}); it holds "
            "the calibrated σ's of every task and model: repair it, or move it away (the σ's "
            "are then calibrated again), or set reward.calibration_file to another file"
        )
    return table


def check_calibration_file(settings: CalibrationSettings, mode: str) -> None:
    """Pre-flight: a job that will read the calibration file (mode=calibrate, or train and
    diagnose without both `reward.sigma_*`) finds it readable before any model loads."""
    wanted = mode in ("train", "diagnose") and None in settings.given
    if wanted or mode == "calibrate":
        read_table(settings.file)


def entries(table: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The calibration entries stored under a key (a file written before several entries per
    key were kept holds one entry as a plain object), their paths read as run records name them
    (an entry stored with this machine's absolute data directory still matches)."""
    found = table.get(key, [])
    return [portable(e, Roots.here()) for e in ([found] if isinstance(found, dict) else found)]


def differences(entry: dict[str, Any], conditions: dict[str, Any]) -> list[str]:
    """`name=stored (this run: value)` for each condition an entry was not measured under; a
    custom task's keys one by one (`task.test=...`), those its σ's do not depend on left out
    (entries stored before they were left out still match)."""
    found = []
    for name, value in conditions.items():
        stored = entry.get(name, "unrecorded")
        if name == "task" and isinstance(stored, dict) and isinstance(value, dict):
            stored = _calibrated_task(stored)
            found += [
                f"task.{k}={stored.get(k, 'unrecorded')} (this run: {value.get(k, 'unset')})"
                for k in sorted(stored.keys() | value.keys())
                if stored.get(k) != value.get(k)
            ]
        elif stored != value:
            found.append(f"{name}={stored} (this run: {value})")
    return found


def store_sigmas(settings: CalibrationSettings, entry: dict[str, Any]) -> Path:
    """Add one calibration entry under the run's key, replacing the one measured under the same
    conditions (atomically; the other entries and keys are kept)."""
    path, key = settings.file, settings.key
    path.parent.mkdir(parents=True, exist_ok=True)
    # Parallel sweep jobs share one file: read-modify-write under a lock, so none is lost.
    with FileLock(str(path) + ".lock"):
        table = read_table(path)
        kept = [e for e in entries(table, key) if differences(e, settings.conditions)]
        table[key] = [*kept, entry]
        return write_json(path, dict(sorted(table.items())))


def lookup_sigmas(settings: CalibrationSettings) -> tuple[float, float, str] | None:
    """(σ_direct, σ_reverse, where they came from), or None when calibration is needed."""
    direct, reverse = settings.given
    if direct is not None and reverse is not None:
        return float(direct), float(reverse), "config"
    conditions, key, path = settings.conditions, settings.key, settings.file
    stored = entries(read_table(path), key)
    for entry in stored:
        if not differences(entry, conditions):
            found = entry.get("sigma_direct"), entry.get("sigma_reverse")
            if all(isinstance(s, (int, float)) and s > 0 for s in found):  # not null, NaN or 0
                return *found, str(path)
            log.warning(
                "not reusing σ_direct=%s σ_reverse=%s of %s in %s: not usable; calibrating again",
                *found,
                key,
                path,
            )
            return None
    if stored:
        closest = min((differences(e, conditions) for e in stored), key=len)
        log.warning(
            "not reusing the %d calibrated entries of %s in %s: the closest was measured with %s",
            len(stored),
            key,
            path,
            ", ".join(closest),
        )
    if settings.paper is not None:
        return *settings.paper, "paper table"
    return None


def group_stds(values: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The population standard deviation within each group (row) over its `valid` candidates
    (empty candidates are dropped), for the groups with at least two: the others have no
    spread to measure and are left out."""
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    count = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = values.masked_fill(~valid, 0.0).sum(dim=-1, keepdim=True) / count
    spread = ((values - mean) ** 2).masked_fill(~valid, 0.0)
    std = (spread.sum(dim=-1, keepdim=True) / count).sqrt().squeeze(-1)
    return std[valid.sum(dim=-1) >= 2]


def within_group_std(values: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """Mean over groups of `group_stds` (NaN when no group has two valid candidates)."""
    return group_stds(values, valid).mean().item()


class CalibrationError(GrammarRLError):
    """The dev rollouts give no usable σ (0 or NaN): nothing is stored."""


def measured_sigma(
    settings: CalibrationSettings, term: str, stds: torch.Tensor
) -> tuple[float, float]:
    """(σ, its standard error over the groups) of one reward term from its `group_stds`; a
    CalibrationError saying why and what to do when σ is 0 or NaN (no group had spread)."""
    sigma = stds.mean().item() if len(stds) else math.nan
    if not sigma > 0:  # 0, or NaN
        raise CalibrationError(
            f"calibrating {settings.key}: σ_{term} would be {sigma:g}: "
            f"{int((stds > 0).sum())} of {len(stds)} dev rollout groups with two valid "
            f"candidates had different {term} rewards, so there is no spread to scale the "
            f"reward by (nothing stored in {settings.file}); use more dev inputs "
            f"(task.dev_size, task.dev), a higher rollout.temperature "
            f"(now {settings.rollout.temperature}), or set reward.sigma_{term}"
        )
    stderr = (stds.std() / math.sqrt(len(stds))).item() if len(stds) > 1 else math.inf
    return sigma, stderr


def dev_rollouts(
    settings: CalibrationSettings,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    dev: list,
    desc: str,
) -> list[RolloutBatch]:
    """The rollout groups calibration measures: `model`'s N samples + beam top-1 per dev input
    (`settings.rollout`), scored with the run's reward by `model` as the reference, in batches of
    `settings.batch_size`
    from a generator seeded with `settings.seed`, without gradient; one `RolloutBatch` per batch."""
    from grammarrl.decoding import ConstrainedDecoder
    from grammarrl.rl.reward import make_reward
    from grammarrl.rl.rollout import collect_rollouts

    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), settings.max_new_tokens)
    reward = make_reward(settings.reward, model, tokenizer, task)
    generator = torch.Generator().manual_seed(settings.seed)
    size, rollout = settings.batch_size, settings.rollout
    with torch.no_grad():
        return [
            collect_rollouts(
                decoder, reward, tokenizer, task, dev[i : i + size], rollout, generator
            )
            for i in tqdm(range(0, len(dev), size), desc=desc)
        ]


def calibrate(
    settings: CalibrationSettings, model: torch.nn.Module, tokenizer: Any, task: Any
) -> dict[str, Any]:
    """Roll out the frozen model on the dev inputs with the run's (N, B) and measure the σ's."""
    dev = task.splits().dev[: settings.dev_size]
    short = (
        f" (task.dev_size={settings.dev_size}; the dev split holds {len(dev)})"
        if len(dev) < settings.dev_size
        else ""
    )
    log.info("calibrating %s on %d dev inputs%s", settings.key, len(dev), short)
    batches = dev_rollouts(settings, model, tokenizer, task, dev, f"calibrate {settings.key}")
    direct_t = torch.cat([b.direct for b in batches])
    reverse_t = torch.cat([b.reverse for b in batches])
    valid_t = torch.cat([b.valid for b in batches])
    sigma_direct, stderr_direct = measured_sigma(settings, "direct", group_stds(direct_t, valid_t))
    sigma_reverse, stderr_reverse = measured_sigma(
        settings, "reverse", group_stds(reverse_t, valid_t)
    )
    report_uncertainty(
        {"direct": (sigma_direct, stderr_direct), "reverse": (sigma_reverse, stderr_reverse)},
        len(dev),
    )
    measured_in = hydra_run_dir()
    return {
        "sigma_direct": sigma_direct,
        "sigma_reverse": sigma_reverse,
        "sigma_direct_stderr": stderr_direct,
        "sigma_reverse_stderr": stderr_reverse,
        "num_inputs": len(dev),
        "mean_direct": direct_t[valid_t].mean().item(),
        "mean_reverse": reverse_t[valid_t].mean().item(),
        "measured_in": portable(str(measured_in), Roots.here()) if measured_in else None,
        **settings.conditions,
    }


def run_sigmas(
    settings: CalibrationSettings, model: torch.nn.Module, tokenizer: Any, task: Any
) -> tuple[float, float, str]:
    """(σ_direct, σ_reverse, where they came from) as a training run with this config would use
    them: from config, calibration file or paper table (`lookup_sigmas`); otherwise calibrated
    now on the dev inputs and stored."""
    found = lookup_sigmas(settings)
    if found is None:
        log.info("No σ's for %s under this run's settings: calibrating first", settings.key)
        entry = calibrate(settings, model, tokenizer, task)
        store_sigmas(settings, entry)
        found = entry["sigma_direct"], entry["sigma_reverse"], "calibrated now"
    return found


UNCERTAIN = 0.1  # a σ whose standard error exceeds this share of it is warned about


def report_uncertainty(measured: dict[str, tuple[float, float]], inputs: int) -> None:
    """Log each σ with its standard error over the dev inputs; warn when one is uncertain."""
    parts = [f"σ_{term}={sigma:.4f} ± {stderr:.4f}" for term, (sigma, stderr) in measured.items()]
    log.info("%s (standard errors over %d dev inputs)", ", ".join(parts), inputs)
    shaky = [f"σ_{t} ±{e / s:.0%}" for t, (s, e) in measured.items() if e > UNCERTAIN * s]
    if shaky:
        log.warning(
            "%s: calibrated on %d dev inputs, the σ's are this uncertain (and with them the "
            "reward's scale); more dev inputs (task.dev_size, task.dev) measure them better",
            ", ".join(shaky),
            inputs,
        )


def run_calibrate(cfg: DictConfig) -> dict[str, Any]:
    """mode=calibrate: measure and store the σ's for (task, model, N, B)."""
    from grammarrl.models.loading import load_model
    from grammarrl.tasks import load_task

    settings = CalibrationSettings.from_config(cfg)
    task = load_task(cfg)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    entry = calibrate(settings, model, tokenizer, task)
    path = store_sigmas(settings, entry)
    write_json(run_dir(cfg) / "calibration.json", {settings.key: entry})
    log.info(
        "σ_direct=%.4f σ_reverse=%.4f -> %s [%s]",
        entry["sigma_direct"],
        entry["sigma_reverse"],
        path,
        settings.key,
    )
    print(json.dumps({"key": settings.key, **entry}))
    return entry
