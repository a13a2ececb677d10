"""Compare systems across results files, aware of how their test sets were drawn.

    python -m experiments.aggregate compare DIR [DIR ...] --out OUT [--reference LABEL ...]

A *system* is the weights (frozen, an adapter directory, or a training run), the decoding
(greedy, beam(width)) or search method with its particles and potential, and the selection (a
Sample-Rerank run also selects Full IS on its particles). Every results file, and every paired
selection of a search run, measures one system. A *test set* is the set of its example ids
(normalised by `relative_uid`), never its index: under the old drawing (`seed_plus_index`, set i
of seed s drawn with Random(s + i)) seed 0's set 1 and seed 1's set 0 are the same examples and
count once. One system's measurements of one set are pooled as draws: the sampler draws of a
search method, or repeated evaluations of a deterministic decoding (their spread is
bf16/batching noise). The spread between sets (of the draw-averaged scores) and between draws
(within a set) are reported apart. Differences against reference systems use only the sets both
measured, with a paired bootstrap that resamples examples (the same for both systems) and each
system's draws. Per-set scores are recomputed from the predictions' tp/fp/fn where the metric is
micro-F1, and must agree with the results file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from experiments.intervals import COUNTS, RESAMPLES, SEED, micro_f1
from experiments.runs import BASELINE, AggregationError, Evaluation, format_number
from experiments.table_format import Block, Cell, Row, Table, to_latex, to_markdown
from grammarrl.data.sources import relative_uid
from grammarrl.runs.results import mean_std
from grammarrl.search.potentials import default_potential
from grammarrl.tasks.conll import FIELDS, output_fields
from grammarrl.tasks.metrics import entity_prf

NAME = "comparison"
TOLERANCE = 1e-9
MICRO_F1 = "micro_f1"
SEED_PLUS_INDEX = "seed_plus_index"  # the drawing of results files that do not name theirs
DRAWINGS = {
    SEED_PLUS_INDEX: "seed_plus_index (set i of seed s drawn with Random(s+i): seeds overlap)",
    "disjoint": "disjoint (the sets of different seeds share no example)",
}
SEARCH_NAMES = {"rerank": "Sample-Rerank", "is": "Full IS", "smc": "Full SMC"}
TRAINED_KEYS = (
    "lambda",
    "rollout.num_samples",
    "beta",
    "kl_penalty",
    "trainer.max_steps",
    "train.seed",
    "optim.lr",
)
Key = tuple[tuple[str, Any], ...]
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
class System:
    """Every measurement of one system, by distinct test set."""

    key: Key
    label: str
    sets: dict[SetId, SetDraws] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    drawings: set[str] = field(default_factory=set)
    pooled: list[str] = field(default_factory=list)  # the labels --label pooled into it

    @property
    def deterministic(self) -> bool:
        return dict(self.key)["decoding"] != "search"

    def set_means(self) -> list[float]:
        return [draws.mean for draws in self.sets.values()]


@dataclass
class Pool:
    """The systems found, and where each distinct test set was drawn."""

    systems: dict[Key, System] = field(default_factory=dict)
    origins: dict[SetId, set[str]] = field(default_factory=dict)


# ----- reading one results file --------------------------------------------------------------
def _source(ev: Evaluation) -> str:
    """The results file, relative to the working directory."""
    return os.path.relpath(ev.run.path / f"{ev.name}.json")


def _rows(ev: Evaluation) -> list[dict[str, Any]]:
    """The predictions rows of a results file; an error naming it when they are missing."""
    path = ev.predictions
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except OSError as err:
        raise AggregationError(
            f"{_source(ev)}: cannot read its predictions {os.path.relpath(path)} ({err.strerror})"
        ) from None
    except json.JSONDecodeError as err:
        raise AggregationError(f"{os.path.relpath(path)}: not valid JSON lines ({err})") from None
    if not rows:
        raise AggregationError(f"{_source(ev)}: its predictions {os.path.relpath(path)} are empty")
    return rows


def _uid(ev: Evaluation, uid: str) -> str:
    return relative_uid(str(uid), ev.get("data.dir"))


def _set_uids(ev: Evaluation, rows: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Each test set's normalised uids in order: the results' `set_ids`, else (older files)
    those of the first draw's rows; one per set score, no uid twice in a set."""
    listed = ev.results.get("set_ids")
    if listed is None:
        by_set: dict[int, list[str]] = {}
        for row in rows:
            if int(row.get("draw", 0)) == 0:
                by_set.setdefault(int(row["set"]), []).append(row["uid"])
        listed = [by_set.get(index, []) for index in range(len(ev.scores))]
    sets = [tuple(_uid(ev, uid) for uid in uids) for uids in listed]
    if len(sets) != len(ev.scores):
        raise AggregationError(
            f"{_source(ev)}: {len(sets)} test sets listed, {len(ev.scores)} set scores"
        )
    for index, uids in enumerate(sets):
        if not uids or len(set(uids)) != len(uids):
            raise AggregationError(f"{_source(ev)}: test set {index} is empty or repeats a uid")
    return sets


def _file_scores(ev: Evaluation) -> dict[str, list[list[float]]]:
    """Per selection, the results' score of each draw on each test set ([draw][set]); a
    results file that is not a search has one selection, its decoding."""
    main = {"scores": ev.scores, "per_draw": ev.results.get("scores_per_draw")}
    selections = ev.results.get("selections") if ev.mode == "search" else None
    return {
        name: [[float(s) for s in draw] for draw in (sel.get("per_draw") or [sel["scores"]])]
        for name, sel in (selections or {ev.decoding: main}).items()
    }


def _grouped(
    ev: Evaluation, rows: Sequence[dict[str, Any]], sets: Sequence[tuple[str, ...]], draws: int
) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    """The rows by (set, draw), then by normalised uid; each (set, draw) must hold exactly
    the examples of its set."""
    grouped: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((int(row["set"]), int(row.get("draw", 0))), []).append(row)
    expected = {(s, d) for s in range(len(sets)) for d in range(draws)}
    if grouped.keys() != expected:
        raise AggregationError(
            f"{_source(ev)}: its rows cover (set, draw) {sorted(grouped)}, its scores "
            f"{len(sets)} sets × {draws} draws"
        )
    by_uid = {where: {_uid(ev, r["uid"]): r for r in group} for where, group in grouped.items()}
    for (index, draw), found in by_uid.items():
        if len(found) != len(grouped[index, draw]) or found.keys() != set(sets[index]):
            raise AggregationError(
                f"{_source(ev)}: the rows of test set {index}, draw {draw} are not the examples "
                "of that set"
            )
    return by_uid


def _rescored(text: str | None, gold: str) -> dict[str, int] | None:
    """A CoNLL output's tp/fp/fn against its gold, over the four fields."""
    if text is None:
        return None
    counts = entity_prf([output_fields(text)], [output_fields(gold)], FIELDS)["micro"]
    return {"tp": counts.tp, "fp": counts.fp, "fn": counts.fn}


def _row_counts(ev: Evaluation, row: dict[str, Any], selection: str) -> np.ndarray | None:
    """A row's [tp, fp, fn] for a selection: its `selection_scores`, its `scores` (for the
    selection it predicts) or, in older CoNLL search files, the selection's text rescored."""
    item = (row.get("selection_scores") or {}).get(selection)
    if item is None and selection == ev.decoding:
        item = row.get("scores")
    if item is None and ev.task == "conll":
        item = _rescored((row.get("selections") or {}).get(selection), row.get("gold", ""))
    if not isinstance(item, dict) or any(k not in item for k in COUNTS):
        return None
    return np.array([item[k] for k in COUNTS], dtype=np.int64)


def _set_counts(
    ev: Evaluation, rows: dict[str, dict[str, Any]], selection: str
) -> np.ndarray | None:
    """One set's per-example [tp, fp, fn] in sorted-uid order where the metric is micro-F1
    (an error when a row lacks them), else None."""
    if ev.metric != MICRO_F1:
        return None
    counts = [_row_counts(ev, rows[uid], selection) for uid in sorted(rows)]
    missing = [uid for uid, c in zip(sorted(rows), counts) if c is None]
    if missing:
        raise AggregationError(
            f"{_source(ev)}: {len(missing)} rows without tp/fp/fn counts for {selection} "
            f"(e.g. {missing[0]})"
        )
    return np.stack(counts)


def _checked(
    ev: Evaluation, selection: str, where: str, counts: np.ndarray | None, expected: float
) -> float:
    """The score recomputed from the counts (the results' own where there are none); an error
    when the two disagree."""
    if counts is None:
        return expected
    score = float(micro_f1(counts.sum(0)))
    if abs(score - expected) > TOLERANCE:
        raise AggregationError(
            f"{_source(ev)}: {selection} on {where}: micro-F1 {score:.12f} from the predictions' "
            f"counts, {expected:.12f} in the results file"
        )
    return score


# ----- systems ---------------------------------------------------------------------------------
def _adapter_name(adapter: str) -> str:
    """An adapter directory's name; a training run's `adapter` folder with its run's name."""
    path = Path(adapter)
    return (
        f"{path.parent.name}/{path.name}"
        if path.name in ("adapter", "adapter-best-dev")
        else path.name
    )


def _weights(ev: Evaluation) -> tuple[Key, str]:
    """Which weights produced the outputs: frozen, an adapter directory, or a training run."""
    if ev.mode == "train" and ev.system != BASELINE:
        values = {key: ev.get(key) for key in TRAINED_KEYS}
        checkpoint = "best-dev" if "best_dev" in ev.name else "last"
        label = (
            f"trained λ={format_number(values['lambda'])} N={values['rollout.num_samples']} "
            f"β={format_number(values['beta'])} ({values['kl_penalty']}) "
            f"{values['trainer.max_steps']} steps seed {values['train.seed']}"
        )
        key = (("weights", "trained"), *values.items(), ("checkpoint", checkpoint))
        return key, label + (", best-dev checkpoint" if checkpoint == "best-dev" else "")
    adapter = ev.get("eval.adapter") or ev.results.get("adapter")
    if ev.system == BASELINE or not adapter:
        return (("weights", "frozen"),), "frozen"
    name = _adapter_name(str(adapter))
    return (("weights", "adapter"), ("adapter", name)), f"adapter {name}"


def _decoding(ev: Evaluation, selection: str) -> tuple[Key, str]:
    """How the outputs were decoded and selected: greedy, beam(width), or a search method's
    selection among its particles."""
    if ev.mode != "search":
        if ev.decoding != "beam":
            return (("decoding", ev.decoding),), ev.decoding
        width = ev.results.get("beam_width") or ev.get("eval.beam_width")
        return (("decoding", "beam"), ("beam_width", width)), f"beam({width})"
    method = ev.decoding
    particles = ev.results.get("particles", ev.get("search.particles"))
    potential = (
        ev.results.get("potential") or ev.get("search.potential") or default_potential(method)
    )
    label = f"{SEARCH_NAMES.get(selection, selection)}({particles})"
    if selection != method:
        label += f" on {SEARCH_NAMES.get(method, method)} particles"
    if potential != default_potential(method):
        label += f", potential {potential}"
    key = (
        ("decoding", "search"),
        ("method", method),
        ("particles", particles),
        ("potential", potential),
        ("selection", selection),
    )
    return key, label


def _system(pool: Pool, ev: Evaluation, selection: str) -> System:
    """The pool's system that this selection of this results file measures."""
    weights, weights_label = _weights(ev)
    decoding, decoding_label = _decoding(ev, selection)
    key = (("task", ev.task), ("model", ev.model), *weights, *decoding)
    if ev.mode == "search":
        label = decoding_label if weights_label == "frozen" else f"{weights_label} {decoding_label}"
    else:
        label = f"{weights_label} {decoding_label}"
    return pool.systems.setdefault(key, System(key, label))


def _add(pool: Pool, ev: Evaluation) -> None:
    """Every selection, draw and test set of one results file, into the pool."""
    rows = _rows(ev)
    sets = _set_uids(ev, rows)
    drawing = str(ev.results.get("test_set_drawing", SEED_PLUS_INDEX))
    seed = ev.results.get("seed", ev.get("seed"))
    for index, uids in enumerate(sets):
        pool.origins.setdefault(frozenset(uids), set()).add(f"{drawing} seed {seed} set {index}")
    scores = _file_scores(ev)
    draws = len(next(iter(scores.values())))
    grouped = _grouped(ev, rows, sets, draws)
    for selection, per_draw in scores.items():
        if len(per_draw) != draws or any(len(d) != len(sets) for d in per_draw):
            raise AggregationError(
                f"{_source(ev)}: {selection}'s scores are not {draws} draws × {len(sets)} sets"
            )
        system = _system(pool, ev, selection)
        system.runs.add(_source(ev))
        system.drawings.add(drawing)
        _measure(system, ev, selection, per_draw, sets, grouped)


def _measure(
    system: System,
    ev: Evaluation,
    selection: str,
    per_draw: list[list[float]],
    sets: Sequence[tuple[str, ...]],
    grouped: dict[tuple[int, int], dict[str, dict[str, Any]]],
) -> None:
    """One selection's score of each draw on each test set, checked, into its system."""
    seeds = ev.results.get("sampler_seeds") or [ev.results.get("seed", ev.get("seed"))]
    for draw, draw_scores in enumerate(per_draw):
        for index, uids in enumerate(sets):
            counts = _set_counts(ev, grouped[index, draw], selection)
            where = f"test set {index}, draw {draw}"
            score = _checked(ev, selection, where, counts, draw_scores[index])
            sampler = "" if system.deterministic else f" (sampler seed {seeds[draw]})"
            entry = system.sets.setdefault(frozenset(uids), SetDraws())
            entry.scores.append(score)
            entry.counts.append(counts)
            entry.origins.append(f"{_source(ev)} set {index}{sampler}")


def _one_metric(evals: Sequence[Evaluation]) -> str:
    """The metric all results share; an error naming the files otherwise."""
    by_metric: dict[str, list[str]] = {}
    for ev in evals:
        by_metric.setdefault(str(ev.results.get("metric")), []).append(_source(ev))
    if len(by_metric) > 1:
        listing = "; ".join(f"{m}: {', '.join(files)}" for m, files in by_metric.items())
        raise AggregationError(f"results of different metrics cannot share one table: {listing}")
    return next(iter(by_metric))


def _disambiguate(systems: Sequence[System]) -> None:
    """Systems that share a label get the key fields they differ in appended."""
    groups: dict[str, list[System]] = {}
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
                    f"{_source(ev)}: malformed results or predictions ({type(err).__name__}: {err})"
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


def relabel(systems: Sequence[System], specs: Sequence[str]) -> list[System]:
    """The systems under the labels `--label` gives them; systems given one label are one
    system (the same weights run twice, say), their measurements of a set pooled as draws."""
    overrides = _overrides(specs, {s.label for s in systems})
    merged: dict[str, System] = {}
    for system in systems:
        label = overrides.get(system.label, system.label)
        target = merged.setdefault(label, System(system.key, label))
        if target.deterministic != system.deterministic:
            raise AggregationError(
                f"--label {label!r}: cannot pool a search method with a deterministic decoding"
            )
        target.pooled.append(system.label)
        target.runs |= system.runs
        target.drawings |= system.drawings
        for uids, draws in system.sets.items():
            entry = target.sets.setdefault(uids, SetDraws())
            entry.scores += draws.scores
            entry.counts += draws.counts
            entry.origins += draws.origins
    return list(merged.values())


# ----- statistics ------------------------------------------------------------------------------
def between_draw_std(system: System) -> float | None:
    """Root of the mean, over the sets drawn more than once, of the within-set sample variance
    over draws; None when no set was drawn twice."""
    variances = [mean_std(d.scores)[1] ** 2 for d in system.sets.values() if len(d.scores) > 1]
    return math.sqrt(sum(variances) / len(variances)) if variances else None


def _example_weights(rng: np.random.Generator, size: int, resamples: int) -> np.ndarray:
    """How often each example is drawn in each resample (examples drawn with replacement)."""
    drawn = rng.integers(0, size, size=(resamples, size)) + size * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * size).reshape(resamples, size)


def _draw_f1(weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Micro-F1 of each draw (counts: draws × examples × [tp, fp, fn]) in each resample."""
    return micro_f1(np.tensordot(weights.astype(float), counts.astype(float), axes=([1], [1])))


def _resampled_draws(rng: np.random.Generator, f1: np.ndarray) -> np.ndarray:
    """Each resample's mean F1 over its draws drawn with replacement (resamples × draws)."""
    picked = rng.integers(0, f1.shape[1], size=f1.shape)
    return np.take_along_axis(f1, picked, axis=1).mean(1)


def _interval(observed: float, values: np.ndarray) -> dict[str, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return {
        "observed": observed,
        "low": float(low),
        "high": float(high),
        "p_above_zero": float((values > 0).mean()),
    }


def paired_bootstrap(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, dict[str, float]]:
    """The mean over shared sets of F1(system) − F1(reference), each set given as (system's,
    reference's) counts, draws × examples × [tp, fp, fn], examples in the same order. Each
    resample draws every set's examples with replacement, the same for both systems, and each
    system's draws with replacement ("examples_and_draws") or keeps them ("examples"); a set's
    F1 is the mean over draws of the micro-F1 of the resampled examples' summed counts."""
    rng = np.random.default_rng(seed)
    both, examples = np.zeros(resamples), np.zeros(resamples)
    observed = 0.0
    for system, reference in pairs:
        observed += float(micro_f1(system.sum(1)).mean() - micro_f1(reference.sum(1)).mean())
        weights = _example_weights(rng, system.shape[1], resamples)
        f1_system, f1_reference = _draw_f1(weights, system), _draw_f1(weights, reference)
        examples += f1_system.mean(1) - f1_reference.mean(1)
        both += _resampled_draws(rng, f1_system) - _resampled_draws(rng, f1_reference)
    count = len(pairs)
    return {
        "examples_and_draws": _interval(observed / count, both / count),
        "examples": _interval(observed / count, examples / count),
    }


def _set_order(pool: Pool) -> dict[SetId, str]:
    """Short names S1, S2, ... of the distinct test sets, in order of their first drawing."""
    ordered = sorted(pool.origins, key=lambda s: (sorted(pool.origins[s]), sorted(s)))
    return {uids: f"S{index}" for index, uids in enumerate(ordered, start=1)}


def _paired(system: System, reference: System, names: dict[SetId, str]) -> dict[str, Any]:
    """The per-set differences (system − reference) on the sets both measured, their mean and
    std, the sets ahead and, where both have counts, the paired bootstrap."""
    shared = sorted(system.sets.keys() & reference.sets.keys(), key=names.__getitem__)
    diffs = {names[s]: system.sets[s].mean - reference.sets[s].mean for s in shared}
    mean, std = mean_std(list(diffs.values())) if diffs else (None, None)
    std = std if len(diffs) > 1 else None
    found: dict[str, Any] = {
        "reference": reference.label,
        "shared_sets": len(shared),
        "per_set": diffs,
        "mean": mean,
        "std": std,
        "sets_ahead": sum(d > 0 for d in diffs.values()),
        "bootstrap": None,
    }
    if shared and all(system.sets[s].counted and reference.sets[s].counted for s in shared):
        pairs = [
            (np.stack(system.sets[s].counts), np.stack(reference.sets[s].counts)) for s in shared
        ]
        found["bootstrap"] = paired_bootstrap(pairs)
    return found


def _summary(system: System, names: dict[SetId, str]) -> dict[str, Any]:
    """A system's numbers: sets, examples, draws, mean and the two spreads."""
    means = system.set_means()
    draws = [len(d.scores) for d in system.sets.values()]
    return {
        "label": system.label,
        "key": dict(system.key),
        "pooled_from": system.pooled,
        "deterministic": system.deterministic,
        "drawings": sorted(system.drawings),
        "runs": sorted(system.runs),
        "num_sets": len(means),
        "num_examples": len(set().union(*system.sets)),
        "draws_min": min(draws),
        "draws_max": max(draws),
        "mean": mean_std(means)[0],
        "between_set_std": mean_std(means)[1] if len(means) > 1 else None,
        "between_draw_std": between_draw_std(system),
        "sets": {
            names[s]: {"draws": d.scores, "mean": d.mean, "origins": d.origins}
            for s, d in sorted(system.sets.items(), key=lambda item: names[item[0]])
        },
    }


def _default_reference(system: System) -> bool:
    """Frozen greedy, and Sample-Rerank with the frozen proposal."""
    key = dict(system.key)
    if key["weights"] != "frozen":
        return False
    return key["decoding"] == "greedy" or key.get("method") == key.get("selection") == "rerank"


def _references(systems: Sequence[System], wanted: Sequence[str]) -> list[System]:
    """The systems named by label, else the default references present."""
    if not wanted:
        return [s for s in systems if _default_reference(s)]
    by_label = {s.label: s for s in systems}
    unknown = [label for label in wanted if label not in by_label]
    if unknown:
        raise AggregationError(
            f"no system labelled {', '.join(map(repr, unknown))}; the systems: "
            + ", ".join(map(repr, by_label))
        )
    return [by_label[label] for label in wanted]


def _overlaps(pool: Pool, names: dict[SetId, str]) -> list[dict[str, Any]]:
    """Pairs of distinct test sets that share examples, and how many."""
    ordered = sorted(names, key=names.__getitem__)
    return [
        {"sets": [names[a], names[b]], "shared_examples": len(a & b)}
        for i, a in enumerate(ordered)
        for b in ordered[i + 1 :]
        if a & b
    ]


def _order(system: System) -> tuple[bool, bool, str]:
    """Frozen weights first, deterministic decoding before search, then by label."""
    return dict(system.key)["weights"] != "frozen", not system.deterministic, system.label


def comparison(
    evals: Sequence[Evaluation], references: Sequence[str] = (), labels: Sequence[str] = ()
) -> dict[str, Any]:
    """Every number of the comparison, as plain data (comparison.json)."""
    metric = _one_metric(evals)
    pool = collect(evals)
    names = _set_order(pool)
    systems = sorted(relabel(list(pool.systems.values()), labels), key=_order)
    refs = _references(systems, references)
    summaries = []
    for system in systems:
        summary = _summary(system, names)
        summary["versus"] = [_paired(system, ref, names) for ref in refs if ref is not system]
        summaries.append(summary)
    return {
        "metric": metric,
        "num_sets": len(names),
        "num_examples": len(set().union(*names)),
        "drawings": sorted({d for s in systems for d in s.drawings}),
        "resamples": RESAMPLES,
        "seed": SEED,
        "references": [ref.label for ref in refs],
        "sets": {
            name: {"size": len(uids), "origins": sorted(pool.origins[uids]), "uids": sorted(uids)}
            for uids, name in sorted(names.items(), key=lambda item: item[1])
        },
        "overlaps": _overlaps(pool, names),
        "systems": summaries,
    }


# ----- the table ------------------------------------------------------------------------------
def _number(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def _versus_cells(system: dict[str, Any], reference: str) -> list[Cell]:
    """The difference and bootstrap cells of one system against one reference."""
    found = next((v for v in system["versus"] if v["reference"] == reference), None)
    if found is None:
        return [Cell(text="–"), Cell(text="–")]
    if not found["shared_sets"]:
        return [Cell(text="no shared set"), Cell(text="–")]
    spread = "" if found["std"] is None else f" ± {_number(found['std'])}"
    diff = (
        f"{_number(found['mean'], sign=True)}{spread} "
        f"({found['sets_ahead']}/{found['shared_sets']})"
    )
    boot = found["bootstrap"]
    if boot is None:
        return [Cell(text=diff), Cell(text="–")]
    both = boot["examples_and_draws"]
    interval = (
        f"[{_number(both['low'], True)}, {_number(both['high'], True)}] "
        f"P(>0)={both['p_above_zero']:.3f}"
    )
    return [Cell(text=diff), Cell(text=interval)]


def _row(system: dict[str, Any], references: Sequence[str]) -> Row:
    draws = f"{system['draws_min']}" + (
        f"–{system['draws_max']}" if system["draws_max"] != system["draws_min"] else ""
    )
    cells = [
        Cell(system["mean"]),
        Cell(text=_number(system["between_set_std"])),
        Cell(text=_number(system["between_draw_std"])),
        Cell(text=f"{system['num_sets']} × {draws}"),
        Cell(text=", ".join(system["drawings"])),
    ]
    for reference in references:
        cells += _versus_cells(system, reference)
    return Row(system["label"], cells)


def _caption(data: dict[str, Any]) -> str:
    drawings = "; ".join(DRAWINGS.get(d, d) for d in data["drawings"])
    overlaps = ", ".join(
        f"{'/'.join(o['sets'])} share {o['shared_examples']}" for o in data["overlaps"]
    )
    return (
        f"{data['metric']} on {data['num_sets']} distinct test sets ({data['num_examples']} "
        f"distinct examples), drawing: {drawings}. A set is its examples, never its index. "
        "Mean: over a system's sets of the set's score averaged over its draws; the between-set "
        "std (ddof=1, of those per-set scores) and the between-draw std (root mean within-set "
        "variance over draws, sets drawn more than once) are separate columns. diff: paired "
        "per-set difference (row - reference) on the sets both measured, mean ± std (sets "
        f"ahead/shared sets); bootstrap: 95% interval and P(>0) over {data['resamples']:,} "
        f"resamples (seed {data['seed']}) of each shared set's examples (the same for both) and of "
        "each system's draws." + (f" Partially overlapping sets: {overlaps}." if overlaps else "")
    )


def _notes(data: dict[str, Any]) -> list[str]:
    """The sets' origins, each system's pooled runs, and what the empty cells mean."""
    notes = [
        "Test sets: "
        + "; ".join(
            f"{name} ({s['size']}): {', '.join(s['origins'])}" for name, s in data["sets"].items()
        )
        + ".",
        "",
        (
            "Deterministic systems (greedy, beam) evaluated more than once on a set count the "
            "evaluations as draws: their spread is bf16/batching noise, not sampling."
        ),
    ]
    if any(
        v["bootstrap"] is None and v["shared_sets"] for s in data["systems"] for v in s["versus"]
    ):
        notes += [
            "",
            "Bootstrap cells are empty where the predictions hold no per-example tp/fp/fn.",
        ]
    for system in data["systems"]:
        pooled = system["pooled_from"]
        by_label = f" (--label pooled {'; '.join(pooled)})" if len(pooled) > 1 else ""
        notes += ["", f"- {system['label']}{by_label}: " + ", ".join(system["runs"])]
    return notes


def comparison_table(data: dict[str, Any]) -> Table:
    """comparison.md / .tex: one row per system, the differences against each reference."""
    header = ["system", f"{data['metric']} mean", "between-set std", "between-draw std"]
    header += ["sets × draws", "drawing"]
    for reference in data["references"]:
        header += [f"diff vs {reference}", f"bootstrap 95% vs {reference}"]
    rows = [_row(system, data["references"]) for system in data["systems"]]
    return Table(
        NAME, _caption(data), header, [Block(rows)], best="max", notes=_notes(data)
    ).mark_best()


def report(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    """`<out>/comparison.md`, `.tex` and `.json`."""
    data = comparison(
        evals, getattr(args, "reference", None) or (), getattr(args, "label", None) or ()
    )
    table = comparison_table(data)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{NAME}.md", out / f"{NAME}.tex", out / f"{NAME}.json"]
    paths[0].write_text(to_markdown(table), encoding="utf-8")
    paths[1].write_text(to_latex(table), encoding="utf-8")
    paths[2].write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return paths
