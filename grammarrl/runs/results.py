"""The results schema shared by every mode that scores outputs (eval, train, search), written
atomically (`grammarrl.runs.atomic`) into the run directory.

`<name>.json` (default `results.json`) holds at least:
  task, model, decoding, metric, scores (one per test set), mean, std, validity, truncated,
  examples_per_second, config
and `predictions<suffix>.jsonl` one line per (test set, example): input, gold, prediction and
the task's per-example scores. `std` is the sample standard deviation over test sets (ddof=1;
0 for a single set). `validity` is the fraction of outputs that ended with end-of-turn in an
accepting grammar state and parse under the task; `truncated` the fraction cut at
max_new_tokens.

A training run with `train.eval_test=false` (a dev-only run) makes no test evaluation: its
`results.json` (`untested_results`) still marks it complete, and holds task, model,
`eval_test: false`, an empty `evaluations`, a `note` saying so, the run's own fields and config,
but no metric or scores; `has_test_evaluation` tells such a record apart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grammarrl.runs.atomic import write_json, write_jsonl
from grammarrl.runs.paths import Roots, portable

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
    """How results name the adapter that produced them: its directory relative to the working
    directory (the repository), `<data>` or `<cache>` (`grammarrl.runs.paths`) when it lies
    inside one, else its absolute directory; None for the frozen base model."""
    if not adapter:
        return None
    return portable(str(Path(adapter).absolute()), Roots.here())


def dtype_name(model: Any) -> str:
    """How results name the dtype of the weights that produced them (`bfloat16`, `float32`)."""
    return str(getattr(model, "dtype", "")).removeprefix("torch.")


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
    return _stamped(record, config)


def _stamped(record: dict[str, Any], config: DictConfig | Mapping[str, Any] | None) -> dict:
    """The record with its creation time (unless given) and the run's config, last."""
    record.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
    record["config"] = config_dict(config)
    return record


NO_TEST_NOTE = "no test evaluation was run (train.eval_test=false): no test set was drawn"


def untested_results(
    *, task: str, model: str, config: DictConfig | Mapping[str, Any] | None, **extra: Any
) -> dict[str, Any]:
    """The results record of a run that made no test evaluation (module docstring), as it is
    written (`as_written`): `extra` (a training run's last step, adapter, dev-best step) kept
    after the fixed keys."""
    record: dict[str, Any] = {
        "task": task,
        "model": model,
        "eval_test": False,
        "evaluations": {},
        "note": NO_TEST_NOTE,
        **extra,
    }
    return as_written(_stamped(record, config))


def as_written(record: Mapping[str, Any]) -> dict[str, Any]:
    """A results record as it is written: its paths relative to the repository, `<data>` and
    `<cache>` of its config (`grammarrl.runs.paths`)."""
    return portable(record, Roots.of(record.get("config") or {}))


def has_test_evaluation(record: Mapping[str, Any]) -> bool:
    """Whether a results record holds a test evaluation (false: `untested_results`)."""
    return record.get("eval_test", True) is not False


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
    path; the record is written `as_written`. Raises ValueError if a required key is missing."""
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise ValueError(f"results lack required keys: {missing}")
    out = Path(out)
    if predictions is not None:
        write_jsonl(out / predictions_name(name), predictions)
    return write_json(out / f"{name}.json", as_written(results))
