"""Evidence II, training seeds: a setting trained again with other seeds (`train.seed`), every
seed evaluated on the same test sets. Does its gain over frozen greedy (and its gap to
Sample-Rerank) hold across seeds, or was the reported run a lucky one?"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.evidence_mechanism import System, by_role
from experiments.evidence_training import TrainingRun, metric_label
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.runs.results import mean_std


def seeds_table(runs: Sequence[TrainingRun], systems: Sequence[System]) -> Table | None:
    """One block per setting with finished runs of two or more training seeds: a row per seed
    (its test scores, its paired per-set differences to frozen greedy and to Sample-Rerank, and
    on how many sets it is above them), then the mean ± std over seeds. None when no setting was
    repeated."""
    greedy, rerank = by_role(systems, "greedy"), by_role(systems, "rerank")
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
            Row(f"training seed {run.training_seed}", _cells([scores], greedy, rerank))
            for run, scores in zip(same, per_seed)
        ]
        rows.append(Row(f"mean over {len(same)} seeds", _cells(per_seed, greedy, rerank)))
        blocks.append(Block(rows, title=same[0].setting_label))
    if not blocks:
        return None
    metric = metric_label(runs[0].metric)
    return Table(
        "training_seeds",
        f"Evidence II, training seeds: GrammarRL greedy {metric} of each training seed on the "
        "same test sets (mean ± std over sets), its paired per-set difference to frozen greedy "
        "and to Sample-Rerank (mean ± std over sets) and the sets where it is above; the last "
        "row of a setting: mean ± std over seeds of each seed's mean, and the sets above over "
        "all seeds.",
        [
            "training seed",
            metric,
            "diff. vs frozen greedy",
            "sets above",
            f"diff. vs {rerank.label}",
            "sets above",
        ],
        blocks,
        best=None,
    )


def _cells(per_seed: list[list[float]], greedy: System, rerank: System) -> list[Cell]:
    """Cells of one seed (`per_seed` of length 1: spread over sets) or of several (spread over
    the seeds' means)."""
    cells = [_spread(per_seed)]
    for reference in (greedy, rerank):
        if not reference.present:
            cells += [Cell(), Cell()]
            continue
        diffs = [[a - b for a, b in zip(s, reference.scores)] for s in per_seed]
        above = sum(d > 0 for seed in diffs for d in seed)
        cells += [
            _spread(diffs),
            Cell(text=f"{above}/{sum(map(len, diffs))}"),
        ]
    return cells


def _spread(per_seed: list[list[float]]) -> Cell:
    """Mean ± std over the sets of one seed, or over the means of several."""
    if len(per_seed) == 1:
        return Cell(*mean_std(per_seed[0]))
    return Cell(*mean_std([mean_std(values)[0] for values in per_seed]))
