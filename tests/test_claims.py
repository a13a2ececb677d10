"""Headline sentences of README.md and the results page say what their committed files hold:
each number is recomputed here from the file it comes from."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO

PAGES = ("README.md", "docs/results/index.md")
FRESH = REPO / "experiments/results/smollm2-cpu-2/fresh-draw/comparison.json"
LAMBDA_RUN = REPO / "experiments/results/evidence3-lambda/run/validation.jsonl"


def signed(value: float) -> str:
    """A difference as the pages print it: sign (Unicode minus), three decimals."""
    return f"{'+' if value >= 0 else '−'}{abs(value):.3f}"


def trained_versus() -> dict[str, dict]:
    """The 360-step adapter's paired comparisons on the fresh draw, by reference."""
    systems = json.loads(FRESH.read_text())["systems"]
    (trained,) = [s for s in systems if s["label"].startswith("adapter ")]
    return {v["reference"]: v for v in trained["versus"]}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize(
    ("reference", "printed"),
    [
        ("frozen greedy", "{diff} over frozen greedy ([{low}, {high}])"),
        ("frozen beam(3)", "{diff} over beam(3) ([{low}, {high}]"),
        ("Full IS(10) on Sample-Rerank particles", "({diff}, [{low}, {high}])"),
    ],
)
def test_evidence_two_differences_carry_their_committed_intervals(page, reference, printed):
    versus = trained_versus()[reference]
    interval = versus["bootstrap"]["examples_and_draws"]
    sentence = printed.format(
        diff=signed(versus["mean"]), low=signed(interval["low"]), high=signed(interval["high"])
    )
    assert sentence in (REPO / page).read_text()


def test_the_lambda_quarter_run_emptied_198_of_its_200_dev_outputs():
    """Not "every output": two of the 200 dev outputs at step 120 kept a span."""
    empty = {"person": "", "organization": "", "location": "", "misc": ""}
    rows = [json.loads(line) for line in LAMBDA_RUN.read_text().splitlines()]
    at_120 = [r for r in rows if r["step"] == 120 and r["slice"] == "dev"]
    emptied = sum(json.loads(r["prediction"]) == empty for r in at_120)
    assert (emptied, len(at_120)) == (198, 200)
    for page in PAGES:
        text = (REPO / page).read_text()
        assert re.search(rf"{emptied} of (the )?{len(at_120)}", text)
        assert "empties every output" not in text
