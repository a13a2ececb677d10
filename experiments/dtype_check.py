"""What the dtype alone moves: a deterministic system decoded again in another dtype, against its
recorded run on the same test examples (issue 54, where CoNLL's searches ran in float32 on a CPU
without native bf16 and its greedy systems in bfloat16).

A check is a run folder `CHECKS/<task>/<system>_<dtype>` beside the recorded run
`RUNS/<task>/<system>`; `python -m experiments.frontier_report` reads them from the study's
`dtype_check/` and `runs/` folders and puts one row per check in its outcomes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.paired import counts_by_set, paired_interval
from experiments.results_files import one_evaluation, read_rows, source
from experiments.runs import AggregationError


def dtype_check(check: Path, recorded: Path) -> dict[str, Any]:
    """The check run against the recorded one: both scores, the paired difference (check −
    recorded) with its 95% bootstrap over the examples, and how many outputs differ."""
    mine, theirs = one_evaluation(check), one_evaluation(recorded)
    rows = [read_rows(ev) for ev in (mine, theirs)]
    by_key = [{(r["set"], r["uid"]): r["prediction"] for r in side} for side in rows]
    if by_key[0].keys() != by_key[1].keys():
        raise AggregationError(f"{source(mine)}: decoded other examples than {source(theirs)}")
    observed, low, high, _ = paired_interval(*(counts_by_set(side) for side in rows))
    return {
        "task": mine.task,
        "system": recorded.name,
        "check": source(mine),
        "recorded": source(theirs),
        "dtype": mine.results["dtype"],
        "recorded_dtype": theirs.results["dtype"],
        "score": mine.results["mean"],
        "recorded_score": theirs.results["mean"],
        "difference": (observed, low, high),
        "outputs_differ": sum(by_key[0][k] != by_key[1][k] for k in by_key[0]),
        "examples": len(by_key[0]),
    }


def dtype_checks(checks: Path, runs: Path) -> list[dict[str, Any]]:
    """Every check under `checks/<task>/<system>_<dtype>` against `runs/<task>/<system>`."""
    found = []
    for folder in sorted(p for p in checks.glob("*/*") if p.is_dir()):
        system = folder.name.rsplit("_", 1)[0]
        recorded = runs / folder.parent.name / system
        if "_" not in folder.name or not recorded.is_dir():
            raise AggregationError(f"{folder}: no recorded run {recorded} to check it against")
        found.append(dtype_check(folder, recorded))
    return found
