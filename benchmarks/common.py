"""Shared plumbing of the benchmarks: configs, models, real prompts, timing and results."""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.evaluation.costs import machine as recorded_machine
from grammarrl.job import compose_job_config, validate
from grammarrl.models.chat import encode_prompt
from grammarrl.runs.timing import synchronize


@dataclass
class BenchResult:
    """One benchmark's verdict: `ratio` against `goal` (`at_most` or at least), with details."""

    name: str
    ratio: float
    goal: float
    at_most: bool
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return self.ratio <= self.goal if self.at_most else self.ratio >= self.goal

    def record(self, judged: bool = True) -> dict[str, Any]:
        """The bench.json entry: name, ratio, goal, holds (None when not judged), details."""
        data = asdict(self)
        goal = f"<= {self.goal}" if self.at_most else f">= {self.goal}"
        return {
            "name": self.name,
            "ratio": round(self.ratio, 4),
            "goal": goal,
            "holds": self.holds if judged else None,
            "details": data["details"],
        }

    def line(self, judged: bool = True) -> str:
        """One console line; an unjudged ratio (the random tiny model) is shown, not graded."""
        mark = ("holds" if self.holds else "MISSED") if judged else "not judged"
        goal = f"<= {self.goal}" if self.at_most else f">= {self.goal}"
        return f"{self.name:<40} {self.ratio:8.3f}  (goal {goal:<7}) {mark}"


@dataclass
class Bench:
    """What every benchmark shares: the model choice, config overrides and repeat count."""

    model: str = "smollm2"
    overrides: list[str] = field(default_factory=list)  # e.g. data.dir=..., device=cuda
    repeats: int = 3
    quick: bool = False  # tiny random model, bundled samples: the plumbing, goals not judged

    def config(self, *extra: str) -> DictConfig:
        """The composed, validated project config for this bench plus `extra` overrides."""
        cfg = compose_job_config([f"model={self.model}", "logger=none", *self.overrides, *extra])
        validate(cfg)
        return cfg

    def load(self, cfg: DictConfig) -> tuple[torch.nn.Module, Any]:
        """A fresh (model, tokenizer) for `cfg` (fresh: LoRA wraps a model in place)."""
        from grammarrl.models.loading import load_model

        model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
        return model.eval(), tokenizer


def real_prompts(cfg: DictConfig, tokenizer: Any, count: int) -> tuple[Any, list[list[int]]]:
    """(task, forward prompts of the first `count` examples of test set 0), as training and
    evaluation build them (few-shot demonstrations, hints)."""
    from grammarrl.tasks import load_task

    task = load_task(cfg)
    examples = task.test_sets(1, count, cfg.seed)[0]
    return task, [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    """(median seconds, all timings, last result) of `repeats` calls of `fn`."""
    times, result = [], None
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        result = fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), [round(t, 4) for t in times], result


def interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: bool = True
) -> dict[str, dict[str, Any]]:
    """Median seconds per variant, variants alternating within each repeat (so drifting load
    on a noisy machine hits both alike); one untimed warm-up call each first if `warmup`."""
    for fn in fns.values() if warmup else ():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            seconds, _, results[name] = timed(fn, 1)
            times[name].append(seconds)
    return {
        name: {
            "median_s": round(statistics.median(ts), 4),
            "times_s": [round(t, 4) for t in ts],
            "result": results[name],
        }
        for name, ts in times.items()
    }


def release_memory() -> None:
    """Free what the last benchmark left (models, trainers) and hand glibc's free heap back to
    the OS, so one benchmark's fragmentation does not crowd the next on a small machine."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def machine() -> dict[str, Any]:
    """Where the numbers come from: the machine evaluations record, and the load beside them."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {**recorded_machine(), "load_average": load}
