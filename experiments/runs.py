"""Find the runs of one or more sweeps and load what they wrote.

A *run* is a job directory: it holds Hydra's `.hydra/config.yaml` and, when the job finished,
one or more results files (`results.json`, `results_beam.json`, `results_baseline.json`, ...,
schema in `grammarrl.runs.results`). Every results file becomes one `Evaluation`: a system
(the frozen baseline, the GrammarRL adapter, or a search method) decoded one way on the seeded
test sets. A run without any results file is kept as *missing* (a failed or unfinished job),
never dropped silently; a job that failed says why in its `failed.json` (`Run.failure`). A
training run with `train.eval_test=false` (a dev-only run) finished without any test
evaluation: its results.json holds no scores and becomes no `Evaluation` (`Run.untested`).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grammarrl.runs.results import has_test_evaluation, mean_std, predictions_name
from grammarrl.runs.rundir import current_names, read_record

RESULTS_GLOB = "results*.json"
BASELINE = "baseline"
GRAMMARRL = "grammarrl"
NO_RESULTS_MODES = ("prepare", "calibrate")  # modes whose output is not a results file
NO_TEST = "no test evaluation (train.eval_test=false)"  # how listings name a dev-only run
METRIC_LABELS = {"micro_f1": "micro-F1", "bleu": "BLEU", "hierarchical_f1": "hier. F1"}


COMPRESSED = ".gz"  # a committed predictions file may be gzip-compressed


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, read through gzip when its name ends in `.gz`."""
    opener = gzip.open if path.suffix == COMPRESSED else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class AggregationError(RuntimeError):
    """A sweep directory that cannot be aggregated (nothing there, conflicting runs)."""


@dataclass(frozen=True)
class Evaluation:
    """One results file of one run: a system decoded one way, scored on each test set."""

    run: Run
    name: str  # results file stem: results, results_beam, results_baseline, ...
    results: dict[str, Any]

    @property
    def task(self) -> str:
        return str(self.results["task"])

    @property
    def model(self) -> str:
        return str(self.results["model"])

    @property
    def decoding(self) -> str:
        return str(self.results["decoding"])

    @property
    def metric(self) -> str:
        return str(self.results["metric"])

    @property
    def scores(self) -> list[float]:
        return [float(s) for s in self.results["scores"]]

    def get(self, key: str, default: Any = None) -> Any:
        """A setting of the job that produced these numbers, from the config stored inside the
        results file (so no later job in the directory can relabel them); the run's config
        for results files that hold none."""
        config = self.results.get("config")
        if not isinstance(config, dict) or not config:
            return self.run.get(key, default)
        value: Any = current_names(config)
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return value

    @property
    def mode(self) -> str:
        return str(self.get("mode", "train"))

    @property
    def system(self) -> str:
        """`baseline` (frozen model), `grammarrl` (trained adapter) or `search/<method>`."""
        if self.name.endswith("_baseline"):
            return BASELINE
        if self.mode == "train":
            return GRAMMARRL
        if self.mode == "search":
            return f"search/{self.get('search.method', 'unknown')}"
        return GRAMMARRL if self.results.get("adapter") or self.get("eval.adapter") else BASELINE

    @property
    def lam(self) -> float | None:
        return self.get("lambda")

    @property
    def num_samples(self) -> int | None:
        return self.get("rollout.num_samples")

    @property
    def beam_width(self) -> int | None:
        """The training-time rollout beam width B (not the decoding beam)."""
        return self.get("rollout.beam_width")

    @property
    def predictions(self) -> Path:
        """The predictions file; its gzip-compressed copy where only that is there (committed
        search runs keep their particles as `predictions.jsonl.gz`)."""
        plain = self.run.path / predictions_name(self.name)
        packed = plain.with_name(plain.name + COMPRESSED)
        return packed if packed.is_file() and not plain.is_file() else plain

    def summary(self, num_sets: int | None = None) -> tuple[float, float]:
        """(mean, std) over the test sets, as in results.json; over the first `num_sets` sets
        only when asked (with seed 0 the first k sets are the same sets whatever the number of
        sets of the run, under both drawings; `experiments.compare` pairs sets by their ids)."""
        scores = self.scores
        if num_sets is None or num_sets >= len(scores):
            return float(self.results["mean"]), float(self.results["std"])
        return mean_std(scores[:num_sets])

    def label(self) -> str:
        """A short human label: `grammarrl λ=0.5 N=3 B=3 greedy`."""
        parts = [self.system]
        if self.system == GRAMMARRL and self.mode == "train":
            parts.append(f"λ={format_number(self.lam)} N={self.num_samples} B={self.beam_width}")
        parts.append(self.decoding)
        return " ".join(parts)


@dataclass(frozen=True)
class Run:
    """One job directory of a sweep, with its (unresolved) Hydra job config."""

    path: Path
    config: DictConfig
    choices: dict[str, str] = field(default_factory=dict)  # Hydra's config group choices
    results_files: tuple[Path, ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        """A config value by dotted key, interpolations resolved; `default` when absent."""
        try:
            value = OmegaConf.select(self.config, key, default=default)
        except OmegaConfBaseException:  # an interpolation unresolvable here (${hydra:...})
            return default
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    @property
    def mode(self) -> str:
        return str(self.get("mode", "train"))

    @property
    def lam(self) -> float | None:
        return self.get("lambda")

    @property
    def variant(self) -> str | None:
        return self.choices.get("experiment/variant")

    @property
    def finished(self) -> bool:
        """Its results files exist; for `prepare` and `calibrate` (which write none), it wrote
        `timing.json` (only a job that completed does) and no `failed.json`."""
        if self.mode in NO_RESULTS_MODES:
            return (self.path / "timing.json").is_file() and not (
                self.path / "failed.json"
            ).exists()
        return bool(self.results_files)

    @property
    def failure(self) -> str | None:
        """The error a failed job recorded in `failed.json` (`Type: message`), else None."""
        path = self.path / "failed.json"
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return "unreadable failed.json"
        return f"{record.get('type', 'Error')}: {record.get('error', '')}".strip()

    def evaluations(self) -> list[Evaluation]:
        """Its results files that hold a test evaluation (not a dev-only run's results.json)."""
        records = ((p.stem, _read_json(p)) for p in self.results_files)
        return [
            Evaluation(self, stem, record)
            for stem, record in records
            if has_test_evaluation(record)
        ]

    @property
    def untested(self) -> bool:
        """It finished without a test evaluation (`train.eval_test=false`: a dev-only run)."""
        path = self.path / "results.json"
        return path in self.results_files and not has_test_evaluation(_read_json(path))

    @property
    def wall_seconds(self) -> float | None:
        """The job's wall time (model loading, calibration, training, every evaluation) from
        the `timing.json` a completed job writes; None when unknown."""
        path = self.path / "timing.json"
        if not self.finished or not path.is_file():
            return None
        try:
            return float(json.loads(path.read_text())["wall_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        """Task, model and the swept keys, for listings of missing runs."""
        keys = (
            "task.name",
            "model.name",
            "mode",
            "lambda",
            "rollout.num_samples",
            "rollout.beam_width",
            "eval.decoding",
        )
        values = [f"{k.split('.')[0] if k.endswith('.name') else k}={self.get(k)}" for k in keys]
        if self.variant:
            values.append(f"variant={self.variant}")
        return " ".join(values)


@dataclass
class Sweep:
    """All runs found under some directories."""

    roots: list[Path]
    runs: list[Run]

    @property
    def missing(self) -> list[Run]:
        return [run for run in self.runs if not run.finished]

    def evaluations(self) -> list[Evaluation]:
        return [ev for run in self.runs for ev in run.evaluations()]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AggregationError(f"{path}: not valid JSON ({err})") from None


def load_run(path: Path) -> Run:
    """A run from its directory. Its config is the record of the job that wrote its outputs
    (`job.json`, else the config inside results.json); Hydra's `.hydra/` only for a job that
    left neither (a failed or unfinished one), since a later job in the same directory
    rewrites `.hydra/` before it starts."""
    results_files = tuple(sorted(path.glob(RESULTS_GLOB)))
    record = read_record(path)
    hydra_dir = path / ".hydra"
    hydra_text = (record or {}).get("hydra_files", {}).get("hydra.yaml")
    if hydra_text is None and (hydra_dir / "hydra.yaml").is_file():
        hydra_text = (hydra_dir / "hydra.yaml").read_text()
    if record is not None:
        config = OmegaConf.create(record["config"])
    elif (hydra_dir / "config.yaml").is_file():
        config = OmegaConf.create(
            current_names(OmegaConf.to_container(OmegaConf.load(hydra_dir / "config.yaml")))
        )
    else:
        raise AggregationError(f"{path}: neither .hydra/config.yaml nor {RESULTS_GLOB}")
    runtime = (yaml.safe_load(hydra_text or "") or {}).get("hydra", {}).get("runtime", {})
    choices = {k: str(v) for k, v in (runtime.get("choices") or {}).items()}
    return Run(path=path, config=config, choices=choices, results_files=results_files)


def _run_dirs(root: Path) -> list[Path]:
    """Every directory under root (root included) that is a job: it has .hydra/ or results."""
    found = {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
    found |= {p.parent for p in root.rglob(RESULTS_GLOB)}
    return sorted(p for p in found if "wandb" not in p.relative_to(root).parts)


def load_sweep(roots: list[str | Path]) -> Sweep:
    """Load every run under the given sweep directories; raise naming a directory that holds
    no run at all."""
    runs: list[Run] = []
    paths = [Path(r) for r in roots]
    for root in paths:
        if not root.is_dir():
            raise AggregationError(f"{root}: no such directory")
        dirs = _run_dirs(root)
        if not dirs:
            raise AggregationError(
                f"{root}: no runs found (no .hydra/config.yaml or {RESULTS_GLOB} below it)"
            )
        runs.extend(load_run(d) for d in dirs)
    return Sweep(roots=paths, runs=runs)


def metric_label(metric: str) -> str:
    """A metric's name in tables: `micro_f1` → `micro-F1`."""
    return METRIC_LABELS.get(metric, metric)


def format_number(value: float | None) -> str:
    """0.5 -> '0.5', 1.0 -> '1', None -> '-'."""
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or not value.is_integer()):
        return f"{value:g}"
    return str(int(value))


Predicate = Callable[[Evaluation], bool]


def where(
    system: str | None = None,
    decoding: str | None = None,
    lam: float | None = None,
    rollout: tuple[int, int] | None = None,
    **fixed: Any,
) -> Predicate:
    """A predicate on evaluations; `fixed` compares attributes (task=..., model=...)."""

    def test(ev: Evaluation) -> bool:
        if system is not None and ev.system != system:
            return False
        if decoding is not None and ev.decoding != decoding:
            return False
        if lam is not None and (ev.lam is None or abs(float(ev.lam) - lam) > 1e-9):
            return False
        if rollout is not None and (ev.num_samples, ev.beam_width) != rollout:
            return False
        return all(getattr(ev, key) == value for key, value in fixed.items())

    return test


def pick(evals: Iterable[Evaluation], predicate: Predicate) -> Evaluation | None:
    """The one evaluation matching; duplicates with identical scores collapse, others raise."""
    found = [ev for ev in evals if predicate(ev)]
    if not found:
        return None
    if any(ev.scores != found[0].scores for ev in found[1:]):
        paths = "\n  ".join(str(ev.run.path / ev.name) for ev in found)
        raise AggregationError(
            f"several runs fill the same table cell ({found[0].label()}):\n  "
            f"{paths}\naggregate one sweep at a time, or remove the stale runs"
        )
    return found[0]
