"""Run directories: where a job writes (`run_dir`), and the record of the mode and resolved
settings its outputs were produced with.

`<run dir>/job.json` is written when a job starts there; every later job in the same directory
(a restarted run, a re-run sweep) is compared with it before it may touch the outputs:

- same mode and settings, results present: the job is skipped (`skip_completed=false` runs it
  again); without results (a killed or failed job) it runs and training resumes;
- another mode: refused, whatever `overwrite` says: a directory holds one job's results;
- other settings: refused, naming the keys that differ, unless `overwrite=true` (the outputs
  are then deleted first). The same holds when `device` or `model.dtype` resolve differently on
  this machine than where the outputs were produced (`auto` is bfloat16 on a CPU with native
  bf16, float32 on another). A training run may continue under changed `CONTINUABLE` keys
  (more steps, other evaluation settings): its stale results are removed and it resumes;
- another process running a job there (it holds the directory's lock, `claimed`): refused.

On refusal Hydra has already rewritten `.hydra/` with the refused job's config; the files are
restored from the record, so the directory keeps describing its own outputs.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from grammarrl.config import roles
from grammarrl.config.schema import MOVED
from grammarrl.errors import GrammarRLError
from grammarrl.runs.atomic import write_json
from grammarrl.runs.paths import Roots, local, portable
from grammarrl.runs.results import config_dict

log = logging.getLogger(__name__)

RECORD = "job.json"
LOCK = ".grammarrl.lock"  # held while a job runs in the directory (`claimed`)
COMPLETED = "results.json"  # written last by the modes that score outputs
COMPLETED_BY_MODE = {"diagnose": "diagnosis.json"}  # modes that write another file last
# modes that write into the run dir
RECORDED_MODES = ("train", "eval", "search", "calibrate", "diagnose")
SKIPPABLE_MODES = ("train", "eval", "search", "diagnose")
# Which keys are compared, derived from each key's declared role (`grammarrl.config.roles`).
BOOKKEEPING = roles.bookkeeping()  # change no number a job writes: never compared
# Keys that change no number of a mode's jobs: not compared for it (mode=diagnose decodes and
# scores with the frozen model only: training's, evaluation's and search's keys do not reach it).
MODE_UNUSED = {mode: roles.unused_by(mode) for mode in RECORDED_MODES}
# Keys a training run may change and still continue from its checkpoint (logged when changed).
CONTINUABLE = roles.continuable()
# Trainer arguments a config recorded before `trainer` built the Trainer did not hold: the
# values the Trainer was built with then.
TRAINER_BEFORE = {
    "_target_": "lightning.pytorch.Trainer",
    "check_val_every_n_epoch": None,
    "num_sanity_val_steps": 0,
    "enable_model_summary": False,
    "use_distributed_sampler": False,
}
# Keys added since: the value a config recorded before a key existed was run with.
ADDED = roles.recorded_defaults()
# Keys split off another since (new -> old): a config recorded before ran with the old key's value.
SPLIT_FROM = roles.split_from()
RESULTS = ("results*.json", "predictions*.jsonl")
OUTPUTS = (
    *RESULTS,
    "checkpoints",
    "search_progress",  # a killed search's progress (`grammarrl.search.resume`)
    "adapter",
    "metrics",
    "samples.jsonl",
    "validation.jsonl",
    "calibration.json",
    "timing.json",
    "diagnosis*",
)
HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")


def hydra_run_dir() -> Path | None:
    """The job's output directory when running under Hydra, else None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return Path(HydraConfig.get().runtime.output_dir)


def run_dir(cfg: DictConfig | None = None) -> Path:
    """The run directory: Hydra's output dir when running under Hydra, else a fresh
    `outputs/<date>/<time>_<task>_<model>_<mode>` under the working directory."""
    path = hydra_run_dir()
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        return path
    now = datetime.now()
    parts = [now.strftime("%H-%M-%S")]
    if cfg is not None:
        for key in ("task.name", "model.name", "mode"):
            value = OmegaConf.select(cfg, key, default=None)
            if value is not None:
                parts.append(str(value))
    base = Path("outputs") / now.strftime("%Y-%m-%d") / "_".join(parts)
    base.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):  # two runs in the same second get distinct directories
        path = base if attempt == 0 else base.with_name(f"{base.name}_{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a fresh run directory next to {base}")


class RunDirConflict(GrammarRLError):
    """The run directory holds outputs of another mode or other settings, or another process
    runs a job in it."""


@contextlib.contextmanager
def claimed(out: Path) -> Iterator[None]:
    """Hold `<out>/.grammarrl.lock`, an exclusive lock the system releases when this process
    ends, even by a kill, while the job runs. A second process in the same directory (the same
    command started twice, or restarted before the stopped one has exited) is refused with
    RunDirConflict, its `.hydra/` files put back, before it writes a checkpoint or a metric."""
    with open(out / LOCK, "a+") as handle:  # "a+": the holder's line stays readable
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            _refuse(
                out,
                read_record(out) or {},
                f"{out} is in use: {handle.read().strip() or 'a process'} runs a job there; "
                "wait for it to end (or stop it and let it exit), then run this again",
            )
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})")
        handle.flush()
        yield


@dataclass
class Plan:
    """What a job does with its run directory."""

    done: dict[str, Any] | None = None  # the stored results: the job is skipped
    remove: list[Path] = field(default_factory=list)  # outputs deleted before the job runs


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (lists are values)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def current_names(config: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config (nested dicts) under the key names of now (`MOVED`, `TRAINER_BEFORE`,
    `ADDED`, `SPLIT_FROM`): a run recorded before a key moved or was added still compares, resumes,
    aggregates and exports."""
    config = copy.deepcopy(dict(config))
    for old, new in MOVED.items():
        *parents, leaf = old.split(".")
        node = reduce(lambda n, part: n.get(part) if isinstance(n, dict) else None, parents, config)
        if isinstance(node, dict) and leaf in node:
            value = node.pop(leaf)
            *parents, leaf = new.split(".")
            reduce(lambda n, part: n.setdefault(part, {}), parents, config).setdefault(leaf, value)
    trainer = config.get("trainer")
    if isinstance(trainer, dict) and "_target_" not in trainer:
        config["trainer"] = {**TRAINER_BEFORE, **trainer}
    for key, value in ADDED.items():
        *parents, leaf = key.split(".")
        node = reduce(lambda n, part: n.setdefault(part, {}), parents, config)
        if isinstance(node, dict):
            node.setdefault(leaf, value)
    for new, old in SPLIT_FROM.items():
        *parents, leaf = new.split(".")
        node = reduce(lambda n, part: n.setdefault(part, {}), parents, config)
        if isinstance(node, dict) and leaf not in node and old in config:
            node[leaf] = config[old]
    return config


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def differing_keys(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = BOOKKEEPING
) -> list[str]:
    """Dotted keys whose values differ between two resolved configs, sorted; a key one of them
    lacks (added or removed since) counts as null."""
    a, b = flatten(old), flatten(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not _under(k, ignore))


def describe(old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]) -> str:
    """`lambda=0.0 (now 0.25), rollout.num_samples=3 (now 2)`."""
    a, b = flatten(old), flatten(new)
    return ", ".join(f"{k}={a.get(k)} (now {b.get(k)})" for k in keys)


def read_record(out: Path) -> dict[str, Any] | None:
    """The directory's record: `job.json`, else (a directory written before records existed)
    the mode and config stored in its `results.json`; None when neither is readable. Its
    `<data>` and `<cache>` paths are read as this machine's directories (`Roots.here`)."""
    for path in (out / RECORD, out / COMPLETED):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        config = data.get("config")
        if isinstance(config, dict):
            return {
                "mode": data.get("mode", config.get("mode")),
                "config": current_names(local(config, Roots.here())),
                "hydra_files": data.get("hydra_files", {}),
                "resolved": data.get("resolved", {}),
            }
    return None


def outputs(out: Path, patterns: Sequence[str] = OUTPUTS) -> list[Path]:
    """The outputs present in a run directory."""
    return sorted({p for pattern in patterns for p in out.glob(pattern)})


def stored_results(out: Path, name: str = COMPLETED) -> dict[str, Any] | None:
    """The directory's readable `results.json` (or the file `name`), else None."""
    try:
        return json.loads((out / name).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def plan_job(cfg: DictConfig, out: Path) -> Plan:
    """Decide what this job does with its run directory (module docstring); raises
    RunDirConflict (after restoring `.hydra/`) when it must not run there."""
    if cfg.mode not in RECORDED_MODES:
        return Plan()
    config = config_dict(cfg)
    roots = Roots.of(config)
    record, present = read_record(out), outputs(out)
    if record is None or not present:
        return Plan()
    # compared as records are written: a path relative to the repository is the same path
    old, new = portable(record["config"], roots), portable(config, roots)
    if record["mode"] != cfg.mode:
        _refuse(
            out,
            record,
            f"{out} holds the outputs of a mode={record['mode']} run; "
            f"mode={cfg.mode} would write its results on top of them: give this job its own "
            "directory (hydra.run.dir=... or hydra.sweep.dir=...)",
        )
    changed = differing_keys(old, new, (*BOOKKEEPING, *MODE_UNUSED.get(cfg.mode, ())))
    machine = machine_differences(record, stored_results(out), resolved_settings(cfg))
    if not changed and not machine:
        completed = COMPLETED_BY_MODE.get(cfg.mode, COMPLETED)
        done = stored_results(out, completed) if cfg.mode in SKIPPABLE_MODES else None
        if done is not None and cfg.skip_completed:
            log.warning(
                "Skipping this job: %s holds its results under the same settings "
                "(skip_completed=false runs it again)",
                out,
            )
            return Plan(done=done)
        return Plan()
    what = ", ".join(filter(None, [describe(old, new, changed), *machine]))
    if cfg.mode == "train" and not machine and all(_under(k, CONTINUABLE) for k in changed):
        log.warning(
            "Continuing the training run in %s with %s; results made before are "
            "removed and made again",
            out,
            what,
        )
        return Plan(remove=outputs(out, RESULTS))
    if cfg.overwrite:
        log.warning(
            "overwrite=true: deleting the outputs of %s (%s) before this job runs", out, what
        )
        return Plan(remove=present)
    _refuse(
        out,
        record,
        f"{out} holds outputs produced with other settings: {what}; use a new "
        "directory (hydra.run.dir=... or hydra.sweep.dir=...), or overwrite=true to delete "
        "them and run here",
    )


def resolved_settings(cfg: DictConfig) -> dict[str, str]:
    """What `device` and `model.dtype` resolve to on this machine (`auto` is bfloat16 on a
    CPU with native bf16, float32 on another): outputs depend on it, the config does not say."""
    from grammarrl.models.loading import resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    return {
        "device": device.type,
        "dtype": str(resolve_dtype(cfg.model.dtype, device)).removeprefix("torch."),
    }


def machine_differences(
    record: Mapping[str, Any], results: Mapping[str, Any] | None, here: Mapping[str, str]
) -> list[str]:
    """`dtype=bfloat16 (this machine: float32)` for each resolved setting the directory's
    outputs were produced under (its record, else its results) that differs here."""
    there = dict(record.get("resolved") or {})
    if not there and results:  # a record written before resolved settings were recorded
        there = {k: str(results[k]).split(":")[0] for k in ("device", "dtype") if results.get(k)}
    return [
        f"{key}={there[key]} (this machine: {value})"
        for key, value in here.items()
        if key in there and there[key] != value
    ]


def _refuse(out: Path, record: Mapping[str, Any], message: str) -> NoReturn:
    """Put back the `.hydra/` files of the recorded job, then raise RunDirConflict."""
    for name, text in record.get("hydra_files", {}).items():
        (out / ".hydra" / name).write_text(text)
    raise RunDirConflict(message)


def commit(cfg: DictConfig, out: Path, plan: Plan) -> None:
    """Delete what the plan removes and record this job's mode and settings (its paths
    relative to the repository, `<data>` and `<cache>`: `grammarrl.runs.paths`)."""
    if cfg.mode not in RECORDED_MODES:
        return
    for path in plan.remove:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    hydra_dir = out / ".hydra"
    config = config_dict(cfg)
    record = portable(
        {
            "mode": cfg.mode,
            "config": config,
            "resolved": resolved_settings(cfg),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "hydra_files": {
                name: (hydra_dir / name).read_text()
                for name in HYDRA_FILES
                if (hydra_dir / name).is_file()
            },
        },
        Roots.of(config),
    )
    for name, text in record["hydra_files"].items():  # Hydra's copies, portable like the record
        (hydra_dir / name).write_text(text)
    write_json(out / RECORD, record)
