"""experiments/frontier_report.py: the frontier study's outcomes against its predictions, on the
committed triage records (trained at λ=0.75 and frozen greedy on 200 fresh messages)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.frontier_report import (
    BEGIN,
    END,
    PARTICLES,
    _field_counts,
    _fields,
    _judge,
    _systems,
    main,
    outcomes_markdown,
    report,
    with_outcomes,
)
from experiments.paired import counts_by_set
from experiments.runs import AggregationError, read_jsonl

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "results" / "frontier"


def _rows(path: Path) -> dict[int, dict[str, dict]]:
    found: dict[int, dict[str, dict]] = {}
    for row in read_jsonl(path):
        found.setdefault(row["set"], {})[row["uid"]] = row
    return found


def test_field_counts_add_up_to_each_examples_json_field_counts():
    """Per-field counts summed over the fields are the counts the task scored each example with:
    the per-field changes split the metric, they do not redefine it."""
    rows = _rows(FOLDER / "runs" / "triage" / "train" / "predictions.jsonl.gz")
    per_field = [_field_counts("support_triage", rows, f) for f in ("category", "order_id")]
    scored = counts_by_set(r for by_uid in rows.values() for r in by_uid.values())
    for index, by_uid in scored.items():
        for uid, counts in by_uid.items():
            assert np.array_equal(sum(f[index][uid] for f in per_field), counts)


def test_conll_outputs_are_read_by_their_four_fields():
    text = '{"person": "Ann", "organization": "", "location": "Paris", "misc": ""}'
    assert _fields("conll", text) == {
        "person": "Ann",
        "organization": "",
        "location": "Paris",
        "misc": "",
    }
    assert _fields("wos_parent", "CS") == {} and _fields("x", None) == {}


def test_grammarrl_greedy_is_the_training_run_even_beside_an_adapter_evaluated_alone():
    adapter = {"key": {"weights": "adapter", "decoding": "greedy"}, "label": "adapter greedy"}
    trained = {"key": {"weights": "trained", "decoding": "greedy"}, "label": "trained greedy"}
    assert _systems({"systems": [adapter, trained]})["GrammarRL greedy"] is trained
    assert _systems({"systems": [adapter]})["GrammarRL greedy"] is adapter


def test_a_prediction_is_borne_out_by_where_the_interval_lies():
    assert _judge((0.06, 0.04, 0.09), above=True) == "yes"
    assert _judge((0.06, 0.04, 0.09), above=False) == "**no**"
    assert _judge((0.01, -0.02, 0.04), above=False) == "yes"
    assert _judge(None, above=True) == "not run"


@pytest.mark.slow
def test_triage_outcome_names_the_miss_and_what_is_not_run(tmp_path):
    """Triage was predicted `marginal`; trained greedy beat frozen greedy with the interval above
    0 (+0.062 [+0.039, +0.088] at the commit that added this test): the table calls it a miss.
    A system is in the outcomes exactly when its runs are, and those without runs read "not run";
    a runs folder without a prediction is an error."""
    outcomes, checks = report(FOLDER, tmp_path / "report")
    writeup = (FOLDER.parent / "frontier.md").read_text()
    assert with_outcomes(writeup, outcomes_markdown(outcomes, checks)) == writeup  # regenerates
    triage = next(o for o in outcomes if o["task"] == "triage")
    assert triage["predicted"]["outlook"] == "marginal"
    assert triage["gain"][1] > 0 and triage["gain"][0] == pytest.approx(0.0621, abs=1e-4)
    text = (tmp_path / "report" / "outcomes.md").read_text()
    assert "| triage | marginal | +0.062 [+0.039, +0.088] | **no** |" in text
    searched = any((FOLDER / "runs" / "triage").glob("is10_s*"))
    assert (triage["systems"]["Full IS(10)"] is not None) == searched
    missing = [(o["task"], name) for o in outcomes for name, s in o["systems"].items() if not s]
    assert not missing or "not run" in text
    assert (tmp_path / "report" / "triage" / "frontier_support_triage.png").is_file()
    copy = tmp_path / "frontier"
    shutil.copytree(FOLDER / "runs" / "triage", copy / "runs" / "mystery")
    shutil.copy(FOLDER.parent / "frontier-predictions.json", tmp_path)
    with pytest.raises(SystemExit, match="no prediction for mystery"):
        main([str(copy)])


def test_the_writeup_block_is_replaced_and_nothing_else():
    page = f"# Title\n\nVerdict.\n\n{BEGIN}\n\nold table\n{END}\n\n## Later\n"
    new = with_outcomes(page, "| new |\n")
    assert new == f"# Title\n\nVerdict.\n\n{BEGIN}\n\n| new |\n\n{END}\n\n## Later\n"
    assert with_outcomes(new, "| new |\n") == new
    with pytest.raises(AggregationError, match="expected one block"):
        with_outcomes("# no markers\n", "| x |\n")
    begin, end = PARTICLES
    both = f"{new}{begin}\n\nold curves\n{end}\n"
    assert with_outcomes(both, "| curves |\n", markers=PARTICLES) == (
        f"{new}{begin}\n\n| curves |\n\n{end}\n"
    )


def test_particle_curves_come_with_the_report_when_asked(tmp_path):
    """`--particles` (report(particles=True)) writes a task's particle curves beside its
    comparison, from its Full IS(10) runs, with frozen and trained greedy as references; the
    same curves as experiments.particle_subsets on those runs."""
    copy = tmp_path / "frontier"
    shutil.copytree(FOLDER / "runs" / "triage", copy / "runs" / "triage")
    shutil.copy(FOLDER.parent / "frontier-predictions.json", tmp_path)
    (outcome,), _ = report(copy, tmp_path / "report", particles=True)
    curves = outcome["particle_curves"]
    assert set(curves["references"]) == {"frozen greedy", "GrammarRL greedy"}
    assert (
        curves["references"]["GrammarRL greedy"]["mean"]
        == outcome["systems"]["GrammarRL greedy"]["mean"]
    )
    assert curves["curves"]["Full IS"][-1] == pytest.approx(
        outcome["systems"]["Full IS(10)"]["mean"], abs=1e-9
    )
    written = tmp_path / "report" / "triage"
    assert json.loads((written / "particle_subsets.json").read_text()) == curves
    assert (written / "particle_subsets.png").is_file()
    assert (
        "particle_curves" not in json.loads((tmp_path / "report" / "outcomes.json").read_text())[0]
    )
