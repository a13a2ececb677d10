"""The benchmark suite's plumbing on the tiny model (`python -m benchmarks --quick`): the
bench.json schema, verdicts that follow from ratio and goal, and per-phase step timings."""

from __future__ import annotations

import json
import logging

import pytest

from benchmarks.__main__ import main
from benchmarks.common import BenchResult
from benchmarks.rl_step import PHASES


def test_verdict_follows_ratio_and_goal_direction():
    assert BenchResult("a", 1.04, 1.05, at_most=True).holds
    assert not BenchResult("a", 1.06, 1.05, at_most=True).holds
    assert BenchResult("b", 2.5, 2.5, at_most=False).holds
    assert not BenchResult("b", 1.9, 2.0, at_most=False).record()["holds"]
    assert BenchResult("b", 1.9, 2.0, at_most=False).record()["goal"] == ">= 2.0"


def test_quick_suite_writes_bench_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "--quick",
            "--out",
            str(out),
            "--only",
            "grammar_overhead/conll",
            "--only",
            "eval_batching/conll",
            "--only",
            "rl_step_prefix_sharing/conll",
            "--only",
            "rl_step_dtype/conll",
            "--only",
            "rl_step_floor/conll",
        ]
    )
    assert code == 0
    assert logging.getLogger("grammarrl").isEnabledFor(logging.WARNING)  # later tests read logs
    records = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(records) == {
        "grammar_overhead/conll",
        "eval_batching/conll",
        "rl_step_prefix_sharing/conll",
        "rl_step_dtype/conll",
        "rl_step_floor/conll",
    }
    for record in records.values():
        assert set(record) == {"name", "ratio", "goal", "holds", "details"}
        assert record["ratio"] > 0
        assert record["details"]["model"] == "tiny"
        assert "cpu_count" in record["details"]["machine"]
    printed = capsys.readouterr().out
    assert all(name in printed for name in records)
    assert "goals not judged" in printed and "MISSED" not in printed and "holds" not in printed
    assert all(record["holds"] is None for record in records.values())  # a random model
    overhead = records["grammar_overhead/conll"]
    assert overhead["details"]["generated_tokens"] and all(
        n >= 1 for n in overhead["details"]["generated_tokens"]
    )
    batching = records["eval_batching/conll"]["details"]
    assert batching["differing_outputs"] == 0  # the tiny model has no near-tie arg-max
    assert records["eval_batching/conll"]["goal"] == (
        f">= {round(0.9 * batching['reachable_ratio'], 3)}"
    )  # 90% of the reachable ratio
    assert 0 < batching["prefill_share"] < 1 and batching["decode_step_growth"]["ratio"] > 0
    sharing = records["rl_step_prefix_sharing/conll"]["details"]
    for variant in ("shared_s", "unshared_s"):
        phases = sharing[variant]
        assert set(phases) == set(PHASES)
        parts = sum(phases[p] for p in PHASES if p != "step")
        assert 0 < parts <= phases["step"] * 1.001  # the step contains its phases
    floor = records["rl_step_floor/conll"]["details"]
    assert set(floor["step_s"]) == set(floor["floor_s"]) == set(PHASES)
    assert floor["floor_s"]["step"] == pytest.approx(
        sum(floor["floor_s"][p] for p in PHASES if p != "step"), abs=1e-3
    )
    assert records["rl_step_floor/conll"]["ratio"] == pytest.approx(
        floor["step_s"]["step"] / floor["floor_s"]["step"], rel=1e-3
    )
    precision = records["rl_step_dtype/conll"]["details"]
    assert set(precision["float32_s"]) == set(PHASES) and precision["auto_dtype"] in (
        "bfloat16",
        "float32",
    )


def test_unknown_benchmark_name_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["--quick", "--only", "no_such_benchmark", "--out", str(tmp_path / "b.json")])
    assert info.value.code == 2


def test_peer_output_length_counts_the_end_token_only_when_there_is_one():
    from benchmarks.decoding import output_length

    stop = 2
    assert output_length([5, 6, 7, 8], stop) == 4  # hit the cap: no end token to count
    assert output_length([5, 6, stop, stop], stop) == 3  # ended, then padded with the end token
    assert output_length([stop, stop, stop], stop) == 1
