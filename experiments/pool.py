"""Systems pooled across results files by distinct test set: every selection of every results
file (each file once) measures one system (`system_keys`); a test set is the set of its example
ids, never its index, so sets drawn again under another seed count once; one system's
measurements of one set are pooled as draws (a search method's sampler seeds, or repeated
evaluations of a deterministic decoding). `relabel` renames systems, pooling those renamed
alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.costs import FileCost, file_cost
from experiments.results_files import (
    Grouped,
    checked,
    file_scores,
    grouped_rows,
    read_rows,
    set_counts,
    set_uids,
    source,
)
from experiments.runs import AggregationError, Evaluation
from experiments.system_keys import Key, system_key
from grammarrl.runs.results import mean_std

SEED_PLUS_INDEX = "seed_plus_index"  # the drawing of results files that do not name theirs
SetId = frozenset[str]


@dataclass
class SetDraws:
    """One system's draws on one distinct test set: each draw's score, its per-example
    [tp, fp, fn] in sorted-uid order (None where the metric is not micro-F1), and its origin."""

    scores: list[float] = field(default_factory=list)
    counts: list[np.ndarray | None] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return mean_std(self.scores)[0]

    @property
    def counted(self) -> bool:
        return all(c is not None for c in self.counts)


@dataclass
class PooledSystem:
    """Every measurement of one system, by distinct test set, and each results file's cost."""

    key: Key
    label: str
    sets: dict[SetId, SetDraws] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    drawings: set[str] = field(default_factory=set)
    pooled: list[str] = field(default_factory=list)  # the labels --label pooled into it
    costs: dict[str, FileCost | None] = field(default_factory=dict)  # by results file

    @property
    def deterministic(self) -> bool:
        return dict(self.key)["decoding"] != "search"

    def set_means(self) -> list[float]:
        return [draws.mean for draws in self.sets.values()]


@dataclass
class Pool:
    """The systems found, and where each distinct test set was drawn."""

    systems: dict[Key, PooledSystem] = field(default_factory=dict)
    origins: dict[SetId, set[str]] = field(default_factory=dict)


def _system(pool: Pool, ev: Evaluation, selection: str) -> PooledSystem:
    """The pool's system that this selection of this results file measures."""
    key, label = system_key(ev, selection)
    return pool.systems.setdefault(key, PooledSystem(key, label))


def _add(pool: Pool, ev: Evaluation) -> None:
    """Every selection, draw and test set of one results file, into the pool."""
    rows = read_rows(ev)
    sets = set_uids(ev, rows)
    drawing = str(ev.results.get("test_set_drawing", SEED_PLUS_INDEX))
    seed = ev.results.get("seed", ev.get("seed"))
    for index, uids in enumerate(sets):
        pool.origins.setdefault(frozenset(uids), set()).add(f"{drawing} seed {seed} set {index}")
    scores = file_scores(ev)
    draws = len(next(iter(scores.values())))
    grouped = grouped_rows(ev, rows, sets, draws)
    for selection, per_draw in scores.items():
        if len(per_draw) != draws or any(len(d) != len(sets) for d in per_draw):
            raise AggregationError(
                f"{source(ev)}: {selection}'s scores are not {draws} draws × {len(sets)} sets"
            )
        system = _system(pool, ev, selection)
        system.runs.add(source(ev))
        system.costs[source(ev)] = file_cost(ev)
        system.drawings.add(drawing)
        _measure(system, ev, selection, per_draw, sets, grouped)


def _measure(
    system: PooledSystem,
    ev: Evaluation,
    selection: str,
    per_draw: list[list[float]],
    sets: Sequence[tuple[str, ...]],
    grouped: Grouped,
) -> None:
    """One selection's score of each draw on each test set, checked, into its system."""
    seeds = ev.results.get("sampler_seeds") or [ev.results.get("seed", ev.get("seed"))]
    for draw, draw_scores in enumerate(per_draw):
        for index, uids in enumerate(sets):
            counts = set_counts(ev, grouped[index, draw], selection)
            where = f"test set {index}, draw {draw}"
            score = checked(ev, selection, where, counts, draw_scores[index])
            sampler = "" if system.deterministic else f" (sampler seed {seeds[draw]})"
            entry = system.sets.setdefault(frozenset(uids), SetDraws())
            entry.scores.append(score)
            entry.counts.append(counts)
            entry.origins.append(f"{source(ev)} set {index}{sampler}")


def one_metric(evals: Sequence[Evaluation]) -> str:
    """The metric all results share; an error naming the files otherwise."""
    by_metric: dict[str, list[str]] = {}
    for ev in evals:
        by_metric.setdefault(str(ev.results.get("metric")), []).append(source(ev))
    if len(by_metric) > 1:
        listing = "; ".join(f"{m}: {', '.join(files)}" for m, files in by_metric.items())
        raise AggregationError(f"results of different metrics cannot share one table: {listing}")
    return next(iter(by_metric))


def _disambiguate(systems: Sequence[PooledSystem]) -> None:
    """Systems that share a label get the key fields they differ in appended."""
    groups: dict[str, list[PooledSystem]] = {}
    for system in systems:
        groups.setdefault(system.label, []).append(system)
    for group in (g for g in groups.values() if len(g) > 1):
        keys = [dict(s.key) for s in group]
        names = sorted({k for key in keys for k in key})
        differing = [k for k in names if len({repr(key.get(k)) for key in keys}) > 1]
        for system, key in zip(group, keys):
            system.label += " [" + ", ".join(f"{k}={key.get(k)}" for k in differing) + "]"


def collect(evals: Sequence[Evaluation]) -> Pool:
    """Every selection of every results file (each file once), pooled by system and by
    distinct test set."""
    pool = Pool()
    seen: set[Path] = set()
    for ev in evals:
        path = (ev.run.path / f"{ev.name}.json").resolve()
        if path not in seen:
            seen.add(path)
            try:
                _add(pool, ev)
            except (KeyError, IndexError, TypeError, ValueError) as err:
                raise AggregationError(
                    f"{source(ev)}: malformed results or predictions ({type(err).__name__}: {err})"
                ) from None
    _disambiguate(list(pool.systems.values()))
    return pool


def _overrides(specs: Sequence[str], labels: set[str]) -> dict[str, str]:
    """`--label LABEL=TEXT` as {label: text}; LABEL (which may hold "=") must be a system's."""
    found = {}
    for spec in specs:
        splits = [i for i, ch in enumerate(spec) if ch == "=" and spec[:i] in labels]
        if len(splits) != 1:
            raise AggregationError(
                f"--label {spec!r}: expected LABEL=TEXT, LABEL one of the systems' labels: "
                + ", ".join(map(repr, sorted(labels)))
            )
        found[spec[: splits[0]]] = spec[splits[0] + 1 :]
    return found


def relabel(systems: Sequence[PooledSystem], specs: Sequence[str]) -> list[PooledSystem]:
    """The systems under the labels `--label` gives them; systems given one label are one
    system (the same weights run twice, say), their measurements of a set pooled as draws."""
    overrides = _overrides(specs, {s.label for s in systems})
    merged: dict[str, PooledSystem] = {}
    for system in systems:
        label = overrides.get(system.label, system.label)
        target = merged.setdefault(label, PooledSystem(system.key, label))
        if target.deterministic != system.deterministic:
            raise AggregationError(
                f"--label {label!r}: cannot pool a search method with a deterministic decoding"
            )
        target.pooled.append(system.label)
        target.runs |= system.runs
        target.costs |= system.costs
        target.drawings |= system.drawings
        for uids, draws in system.sets.items():
            entry = target.sets.setdefault(uids, SetDraws())
            entry.scores += draws.scores
            entry.counts += draws.counts
            entry.origins += draws.origins
    return list(merged.values())
