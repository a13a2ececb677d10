"""Judge a recorded diagnosis again, without a model: the λ curve, the cross-fitted lift, the
per-field table and the verdict, under this version's rules and the given config, from the
run's `diagnosis.json` and `diagnosis_rows.jsonl` (the scored candidates and perturbation pairs).
The command is `python -m experiments.rejudge RUN_DIR [--out DIR] [OVERRIDES ...]`
(docs/diagnose.md); the candidates, their rewards and the σ's are the record's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.concordance import Pair
from grammarrl.diagnosis.judge import judge
from grammarrl.diagnosis.perturb import Perturbation
from grammarrl.diagnosis.report import JSON, write_report
from grammarrl.diagnosis.run import dev_inputs, labelled_rows
from grammarrl.diagnosis.selection import Sigmas
from grammarrl.diagnosis.settings import DiagnoseSettings
from grammarrl.errors import ConfigError
from grammarrl.types import Example

DECODED = ("seed", "num_inputs", "num_samples", "num_labelled")  # fixed by the rows


def _floats(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def recorded_groups(rows: list[dict[str, Any]], examples: list[Example]) -> list[Group]:
    """The candidate groups of the rows, each with its dev input (matched by id, in order)."""
    found = [row for row in rows if row["part"] == "candidates"]
    if [row["uid"] for row in found] != [ex.uid for ex in examples[: len(found)]]:
        raise ConfigError(
            "diagnosis_rows.jsonl: its inputs are not this task's first dev inputs (the data, the "
            "task's settings or data.split_seed differ from the run's)"
        )
    return [
        Group(ex, row["texts"], _floats(row["direct"]), _floats(row["reverse"]))
        for row, ex in zip(found, examples)
    ]


def recorded_pairs(rows: list[dict[str, Any]]) -> list[Pair]:
    """The perturbation pairs of the rows."""
    return [
        Pair(
            row["uid"],
            Perturbation(row["field"], row["kind"], row["perturbed"]),
            tuple(_floats(row["gold_rewards"])),
            tuple(_floats(row["perturbed_rewards"])),
        )
        for row in rows
        if row["part"] == "pair"
    ]


def recorded_overrides(run: Path) -> list[str]:
    """The run's own overrides (`.hydra/overrides.yaml`), to compose its config again."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: missing (the run's overrides; rejudge needs its config)")
    return [str(o) for o in yaml.safe_load(path.read_text()) or []]


def check_overrides(extra: list[str]) -> None:
    """Refuse an override of what the rows fixed (what was decoded and perturbed)."""
    changed = [o for o in extra if o.split("=")[0].removeprefix("diagnose.") in DECODED]
    if changed:
        raise ConfigError(f"{changed[0]}: fixed by the recorded rows (decode again to change it)")


def rejudge(run: Path, out: Path, cfg: DictConfig, extra: list[str]) -> dict[str, Any]:
    """The run's record judged again under `cfg` (the run's overrides, then `extra`), written
    into `out`; returns it."""
    from grammarrl.tasks import load_task

    check_overrides(extra)
    record = json.loads((run / JSON).read_text())
    rows = [json.loads(line) for line in (run / "diagnosis_rows.jsonl").read_text().splitlines()]
    task = load_task(cfg)
    settings = DiagnoseSettings.from_config(cfg)
    groups = recorded_groups(rows, dev_inputs(task, settings.num_inputs))
    golds = [ex.target for ex in labelled_rows(task, settings.num_labelled)[0]]
    sigmas = Sigmas(**record["sigmas"])
    curve, table, verdict = judge(settings, task, groups, recorded_pairs(rows), sigmas, golds)
    curve["finished_candidates"] = record["candidates"]["finished_candidates"]  # not in the rows
    record.update(
        verdict=vars(verdict),
        settings=settings.record(),
        candidates=curve,
        fields={**record["fields"], "table": table or {}},
        rejudged={"overrides": extra},
    )
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, record, rows)
    return record
