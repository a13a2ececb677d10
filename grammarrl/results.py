"""The results schema shared by every mode that scores outputs (eval, train, search), written
atomically into the run directory.

`<name>.json` (default `results.json`) holds at least:
  task, model, decoding, metric, scores (one per test set), mean, std, validity, truncated,
  examples_per_second, config
and `predictions<suffix>.jsonl` one line per (test set, example): input, gold, prediction and
the task's per-example scores. `std` is the sample standard deviation over test sets (ddof=1;
0 for a single set). `validity` is the fraction of outputs that ended with end-of-turn in an
accepting grammar state and parse under the task; `truncated` the fraction cut at
max_new_tokens.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grammarrl.errors import GrammarRLError

REQUIRED_KEYS = (
    "task",
    "model",
    "decoding",
    "metric",
    "scores",
    "mean",
    "std",
    "validity",
    "truncated",
    "examples_per_second",
    "config",
)


class ResultsWriteError(GrammarRLError):
    """A results file could not be written (e.g. disk full); the previous file is intact."""


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


def atomic_write(path: str | Path, write, binary: bool = False) -> Path:
    """Write `path` through `write(handle)` into a temp file beside it, fsync, rename over it:
    a kill or a full disk mid-write leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):  # disk full, quota, permissions: one clear message
            kept = f"the previous {path.name} is unchanged" if path.exists() else "nothing written"
            raise ResultsWriteError(
                f"cannot write {path}: {err.strerror or err}; {kept}") from err
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file in the same directory + os.replace)."""
    return atomic_write(
        Path(path), lambda h: h.write(json.dumps(_jsonable(obj), indent=2, ensure_ascii=False))
    )


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write JSON lines atomically."""

    def write(handle):
        for row in rows:
            handle.write(json.dumps(_jsonable(row), ensure_ascii=False) + "\n")

    return atomic_write(Path(path), write)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, DictConfig) or OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for fewer than two values)."""
    values = [float(v) for v in values]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var)


def config_dict(cfg: DictConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    """The resolved config as plain data (hydra internals left out)."""
    if cfg is None:
        return {}
    if OmegaConf.is_config(cfg):
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    else:
        data = dict(cfg)
    data.pop("hydra", None)
    return data


def adapter_name(adapter: str | Path | None) -> str | None:
    """How results name the adapter that produced them: its absolute directory, None for the
    frozen base model."""
    return str(Path(adapter).absolute()) if adapter else None


def build_results(
    *,
    task: str,
    model: str,
    decoding: str,
    metric: str,
    scores: Sequence[float],
    validity: float,
    truncated: float,
    examples_per_second: float,
    config: DictConfig | Mapping[str, Any] | None,
    **extra: Any,
) -> dict[str, Any]:
    """A results record with the required keys (plus any extra keys, kept after them)."""
    mean, std = mean_std(scores)
    record: dict[str, Any] = {
        "task": task,
        "model": model,
        "decoding": decoding,
        "metric": metric,
        "scores": [float(s) for s in scores],
        "mean": mean,
        "std": std,
        "validity": float(validity),
        "truncated": float(truncated),
        "examples_per_second": float(examples_per_second),
    }
    record.update(extra)
    record.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
    record["config"] = config_dict(config)
    return record


def predictions_name(name: str) -> str:
    """`results` -> `predictions.jsonl`; `results_beam` -> `predictions_beam.jsonl`."""
    suffix = name[len("results") :] if name.startswith("results") else f"_{name}"
    return f"predictions{suffix}.jsonl"


def write_results(
    out: str | Path,
    results: Mapping[str, Any],
    predictions: Iterable[Mapping[str, Any]] | None = None,
    name: str = "results",
) -> Path:
    """Write `<out>/<name>.json` (and `<out>/predictions*.jsonl`) atomically; returns the JSON
    path. Raises ValueError if a required key is missing."""
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise ValueError(f"results lack required keys: {missing}")
    out = Path(out)
    if predictions is not None:
        write_jsonl(out / predictions_name(name), predictions)
    return write_json(out / f"{name}.json", results)
