"""A saved W&B report comparing the runs of one sweep side by side (W&B Reports API).

    pip install -e '.[report]'              # the Reports API (wandb-workspaces; `make venv` does)
    python -m experiments.wandb_report --entity ME --group multirun/2025-01-01/12-00-00 --save

The runs of a sweep share the W&B group `logger.group` (by default the sweep directory) and
carry tags task=, model=, mode= (plus lambda=, N=, B= for training, decoding= for eval, method=
for search). The report has one panel grid per comparison: held-out and train metrics over
training steps and the reward terms, grouped by λ, by rollout composition (N, B) and by
task/model. Offline runs must be synced first
(`wandb sync <run dir>/wandb/offline-run-*`). Without --save the report is only built (a dry run).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

METRICS = ("bleu", "hierarchical_f1", "micro_f1")  # the tasks' metric names in val/{split}_{m}
COMPARISONS = (  # (title, config keys the runs are grouped by)
    ("Reward mixing λ", ["lambda"]),
    ("Rollout composition (N, B)", ["rollout.num_samples", "rollout.beam_width"]),
    ("Task and model", ["task.name", "model.name"]),
)


def build_report(project: str, entity: str, group: str, title: str | None = None) -> Any:
    """The report object (not saved): one panel grid per comparison over the sweep's runs."""
    try:
        with warnings.catch_warnings():  # its Pydantic-V1-style validators warn on import
            warnings.simplefilter("ignore", DeprecationWarning)
            import wandb_workspaces.reports.v2 as wr
    except ImportError:
        raise SystemExit("the W&B Reports API is missing: pip install -e '.[report]'") from None

    step = "trainer/global_step"
    panels = [
        wr.LinePlot(title="held-out (dev) metric", x=step, y=[f"val/dev_{m}" for m in METRICS]),
        wr.LinePlot(title="train-slice metric", x=step, y=[f"val/train_{m}" for m in METRICS]),
        wr.LinePlot(
            title="reward",
            x=step,
            y=["train/reward", "train/reward_direct", "train/reward_reverse"],
        ),
        wr.LinePlot(title="KL to the reference", x=step, y=["train/kl"]),
        wr.BarPlot(title="final dev metric", metrics=[f"val/dev_{m}" for m in METRICS]),
    ]
    blocks: list[Any] = [
        wr.H1(title or f"GrammarRL sweep {group}"),
        wr.P(
            f"Runs of the W&B group {group}; tables and figures: python -m experiments.aggregate."
        ),
    ]
    for name, keys in COMPARISONS:
        runset = wr.Runset(
            entity=entity,
            project=project,
            name=name,
            filters=f"Config('logger.group') = '{group}'",
            groupby=[f"config.{k}" for k in keys],
        )
        blocks += [wr.H2(name), wr.PanelGrid(runsets=[runset], panels=panels)]
    return wr.Report(
        project=project,
        entity=entity,
        title=title or f"GrammarRL: {group}",
        description="Side-by-side comparison of one sweep",
        blocks=blocks,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.wandb_report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--project", default="grammarrl")
    parser.add_argument("--entity", required=True, help="W&B user or team")
    parser.add_argument("--group", required=True, help="the sweep's W&B group (its sweep dir)")
    parser.add_argument("--title")
    parser.add_argument("--save", action="store_true", help="save it to W&B (needs wandb login)")
    args = parser.parse_args(argv)
    report = build_report(args.project, args.entity, args.group, args.title)
    if args.save:
        report.save()
        print(report.url)
    else:
        print(f"built report {report.title!r} with {len(report.blocks)} blocks (use --save)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
