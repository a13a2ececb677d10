"""The judging half of mode=diagnose, apart from decoding and scoring: from the scored candidate
groups and perturbation pairs, the λ curve, the cross-fitted lift, the per-field table and the
verdict. `run.run_diagnose` judges what it has just decoded; `rejudge` judges a recorded
diagnosis again (other settings, or this version's rules) without a model."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial
from typing import Any

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.concordance import ALL, Pair, concordance, pairs_share
from grammarrl.diagnosis.crossfit import cross_fit
from grammarrl.diagnosis.selection import Sigmas, lambda_curve
from grammarrl.diagnosis.settings import DiagnoseSettings
from grammarrl.diagnosis.verdict import Verdict, make_verdict
from grammarrl.tasks.base import Task

DEV_ROWS = "the dev split, then its reserve"  # where the K dev inputs come from


def judge(
    settings: DiagnoseSettings,
    task: Task,
    groups: list[Group],
    pairs: list[Pair],
    sigmas: Sigmas,
    labelled_golds: list[str],
) -> tuple[dict[str, Any], dict[str, Any] | None, Verdict]:
    """(the λ curve with its cross-fitted lift, the per-field table (None without pairs), the
    verdict); `labelled_golds`: the perturbed rows' gold outputs (the fullness floor's gold
    where the dev inputs have none)."""
    curve = {
        "rows": DEV_ROWS,
        **lambda_curve(task, groups, settings.lambdas, sigmas, labelled_golds),
    }
    table = concordance(pairs, settings.lambdas, sigmas) if pairs else None
    crossfit = cross_fit(
        task,
        groups,
        settings.lambdas,
        sigmas,
        partial(pairs_share, table, ALL),
        settings.bootstrap_draws,
    )
    curve["crossfit"] = asdict(crossfit) if crossfit else None
    verdict = make_verdict(
        curve,
        table,
        task.metric_name,
        settings.lam,
        settings.min_lift,
        settings.blind_below,
        crossfit=curve["crossfit"],
    )
    return curve, table, verdict
