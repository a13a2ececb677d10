"""Training seeds: a setting trained again with other seeds (`train.seed`), every seed evaluated
on the same test sets. Does its gain over a reference row hold across seeds, or was the reported
run a lucky one?"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.paired import differences
from experiments.runs import metric_label
from experiments.systems import System
from experiments.table_format import Block, Cell, Row, Table
from experiments.training_runs import TrainingRun
from grammarrl.runs.results import mean_std


def seeds_table(
    runs: Sequence[TrainingRun], references: Sequence[System], title: str
) -> Table | None:
    """One block per setting with finished runs of two or more training seeds: a row per seed
    (its test scores, its paired per-set differences to each reference, and on how many sets it
    is above it), then the mean ± std over seeds. None when no setting was repeated."""
    groups: dict[tuple, list[TrainingRun]] = {}
    for run in runs:
        if run.finished:
            groups.setdefault(run.setting(), []).append(run)
    blocks = []
    for same in groups.values():
        if len({run.training_seed for run in same}) < 2:
            continue
        same = sorted(same, key=lambda run: run.training_seed)
        per_seed = [list(run.greedy.scores) for run in same]
        rows = [
            Row(f"training seed {run.training_seed}", _cells([scores], references))
            for run, scores in zip(same, per_seed)
        ]
        rows.append(Row(f"mean over {len(same)} seeds", _cells(per_seed, references)))
        blocks.append(Block(rows, title=same[0].setting_label))
    if not blocks:
        return None
    metric = metric_label(runs[0].metric)
    header = ["training seed", metric]
    for reference in references:
        header += [f"diff. vs {reference.label}", "sets above"]
    return Table(
        "training_seeds",
        f"{title}, training seeds: GrammarRL greedy {metric} of each training seed on the "
        "same test sets (mean ± std over sets), its paired per-set difference to "
        + " and to ".join(_short(ref.label) for ref in references)
        + " (mean ± std over sets) and the sets where it is above; the last "
        "row of a setting: mean ± std over seeds of each seed's mean, and the sets above over "
        "all seeds.",
        header,
        blocks,
        best=None,
    )


def _short(label: str) -> str:
    """A reference's name in prose: `Sample-Rerank(10)` → `Sample-Rerank`."""
    return label.split("(")[0]


def _cells(per_seed: list[list[float]], references: Sequence[System]) -> list[Cell]:
    """Cells of one seed (`per_seed` of length 1: spread over sets) or of several (spread over
    the seeds' means)."""
    cells = [_spread(per_seed)]
    for reference in references:
        if not reference.present:
            cells += [Cell(), Cell()]
            continue
        diffs = [differences(s, reference.scores) for s in per_seed]
        above = sum(d > 0 for seed in diffs for d in seed)
        cells += [_spread(diffs), Cell(text=f"{above}/{sum(map(len, diffs))}")]
    return cells


def _spread(per_seed: list[list[float]]) -> Cell:
    """Mean ± std over the sets of one seed, or over the means of several."""
    if len(per_seed) == 1:
        return Cell(*mean_std(per_seed[0]))
    return Cell(*mean_std([mean_std(values)[0] for values in per_seed]))
