"""`python -m experiments.aggregate compare`: systems compared across results files by distinct
test set (identified by its examples), with the spread between sets and between draws apart, on
small fake CoNLL runs whose numbers are worked out by hand."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments import aggregate as agg
from experiments import compare, frontier
from grammarrl.runs.results import build_results
from grammarrl.tasks.conll import FIELDS
from tests.support.runs import md_rows

DATA = "/data"
Counts = tuple[int, int, int]
ONE, HALF, ZERO = [(1, 0, 0), (1, 0, 0)], [(1, 0, 0), (0, 1, 1)], [(0, 1, 0), (0, 0, 1)]
POINT_EIGHT = [(1, 1, 0), (1, 0, 0)]  # micro-F1 4/5


def uids(name: str, size: int = 2, absolute: bool = True) -> list[str]:
    """The uids of a test set `name` (A, B, ...): absolute as older results wrote them, or
    relative to the data directory as newer ones do."""
    line = 1000 * (ord(name) - ord("A"))
    prefix = f"{DATA}/conll2003/test.txt" if absolute else "conll2003/test.txt"
    return [f"{prefix}:{line + i}" for i in range(size)]


def micro_f1(counts: list[Counts]) -> float:
    """Micro-F1 of summed counts, written out independently of the code under test."""
    tp, fp, fn = (sum(c[i] for c in counts) for i in range(3))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def texts(counts: Counts) -> tuple[str, str]:
    """A (gold, prediction) pair of CoNLL outputs with these tp, fp, fn (at most 4 fields)."""
    tp, fp, fn = counts
    gold = {f: "G" if i < tp + fn else "" for i, f in enumerate(FIELDS)}
    pred = {
        f: "G" if i < tp else "P" if tp + fn <= i < tp + fn + fp else ""
        for i, f in enumerate(FIELDS)
    }
    return json.dumps(gold), json.dumps(pred)


def prediction_rows(
    sets: list[list[str]], outputs: dict[str, list[list[list[Counts]]]], new: bool
) -> list[dict[str, Any]]:
    """predictions.jsonl: one row per (draw, set, example), as `write_run` describes."""
    decoding = next(iter(outputs))
    search = decoding in compare.SEARCH_NAMES
    rows = []
    for draw, draw_sets in enumerate(outputs[decoding]):
        for index, examples in enumerate(draw_sets):
            for position, counts in enumerate(examples):
                gold, prediction = texts(counts)
                row = {"set": index, "uid": sets[index][position], "gold": gold}
                row |= {"prediction": prediction, "scores": dict(zip(compare.COUNTS, counts))}
                chosen = {m: outputs[m][draw][index][position] for m in outputs}
                if search and new:
                    row["draw"] = draw
                    row["selection_scores"] = {
                        m: dict(zip(compare.COUNTS, c)) for m, c in chosen.items()
                    }
                elif search:
                    row["selections"] = {m: texts(c)[1] for m, c in chosen.items()}
                rows.append(row)
    return rows


def results_fields(
    sets: list[list[str]], outputs: dict[str, list[list[list[Counts]]]], new: bool
) -> dict[str, Any]:
    """The scores, selections and (`new`) drawing fields of results.json."""
    decoding = next(iter(outputs))
    per_draw = {m: [[micro_f1(s) for s in draw] for draw in d] for m, d in outputs.items()}
    means = {m: [sum(s) / len(s) for s in zip(*d)] for m, d in per_draw.items()}
    fields: dict[str, Any] = {"scores": means[decoding]}
    if decoding in compare.SEARCH_NAMES:
        fields.update(particles=4, potential="reverse")
        fields["selections"] = {
            m: {"scores": means[m], **({"per_draw": per_draw[m]} if new else {})} for m in outputs
        }
        if new:
            fields.update(sampler_seeds=list(range(len(per_draw[decoding]))))
            fields.update(scores_per_draw=per_draw[decoding])
    if new:
        fields.update(test_set_drawing="disjoint", set_ids=sets)
    return fields


def write_run(
    root: Path,
    name: str,
    sets: list[list[str]],
    outputs: dict[str, list[list[list[Counts]]]],
    *,
    seed: int = 0,
    adapter: str | None = None,
    new: bool = False,
    costs: dict[str, int] | None = None,
) -> Path:
    """A run directory (results.json, predictions.jsonl, .hydra/config.yaml). `outputs`:
    selection -> [draw][set][example] (tp, fp, fn); the first selection is the decoding, a
    search method (rerank, is) making it a search run. `new`: the schema with drawing, set ids,
    sampler seeds and per-draw scores; else the older one (one draw, selections as text).
    `costs`: the forward token counts results record (`grammarrl.evaluation.costs`)."""
    decoding = next(iter(outputs))
    search = decoding in compare.SEARCH_NAMES
    config = {
        "mode": "search" if search else "eval",
        "seed": seed,
        "data": {"dir": DATA},
        "task": {"name": "conll"},
        "model": {"name": "tiny"},
        "eval": {"decoding": "greedy" if search else decoding, "beam_width": 3, "adapter": adapter},
        "search": {"method": decoding, "particles": 4, "potential": "reverse"},
    }
    results = build_results(
        task="conll",
        model="tiny",
        decoding=decoding,
        metric="micro_f1",
        validity=1.0,
        truncated=0.0,
        examples_per_second=1.0,
        config=config,
        seed=seed,
        adapter=adapter,
        **results_fields(sets, outputs, new),
        **(costs or {}),
    )
    path = root / name
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "results.json").write_text(json.dumps(results))
    rows = prediction_rows(sets, outputs, new)
    (path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_compare(tmp_path: Path, *extra: str) -> tuple[dict[str, list[str]], dict[str, Any], str]:
    """The table's rows, comparison.json and the caption of `compare` over tmp_path/runs."""
    out = tmp_path / "out"
    assert agg.main(["compare", str(tmp_path / "runs"), "--out", str(out), *extra]) == 0
    markdown = (out / "comparison.md").read_text()
    assert (out / "comparison.tex").is_file()
    return md_rows(markdown), json.loads((out / "comparison.json").read_text()), markdown


def system(data: dict[str, Any], label: str) -> dict[str, Any]:
    """A system's entry in comparison.json, by label."""
    return next(s for s in data["systems"] if s["label"] == label)


def old_greedy_seeds(root: Path) -> None:
    """Frozen greedy under the old drawing: seed 0 drew sets A, B, C and seed 1 B, C, D; on C
    the two evaluations differ (bf16 noise): F1 0 and 0.8."""
    sets = {name: uids(name) for name in "ABCD"}
    write_run(root, "seed0", [sets["A"], sets["B"], sets["C"]], {"greedy": [[ONE, HALF, ZERO]]})
    write_run(
        root,
        "seed1",
        [sets["B"], sets["C"], sets["D"]],
        {"greedy": [[HALF, POINT_EIGHT, ONE]]},
        seed=1,
    )


def test_sets_are_counted_by_their_examples_not_by_their_index(tmp_path: Path):
    old_greedy_seeds(tmp_path / "runs")
    rows, data, markdown = run_compare(tmp_path)
    assert data["num_sets"] == 4 and data["num_examples"] == 8  # not 6 sets of 12
    assert markdown.startswith("**micro_f1 on 4 distinct test sets (8 distinct examples)")
    greedy = system(data, "frozen greedy")
    assert (greedy["num_sets"], greedy["draws_min"], greedy["draws_max"]) == (4, 1, 2)
    # per set, draw-averaged: A 1.0, B 0.5, C (0 + 0.8) / 2 = 0.4, D 1.0
    assert greedy["mean"] == pytest.approx(0.725)
    assert greedy["between_set_std"] == pytest.approx(math.sqrt(0.3075 / 3))
    # only C varies between draws: sample variance 0.32, B's 0: sqrt((0.32 + 0) / 2)
    assert greedy["between_draw_std"] == pytest.approx(0.4)
    assert rows["frozen greedy"][:4] == ["0.725", "0.320", "0.400", "4 × 1–2"]
    assert "S2 (2): seed_plus_index seed 0 set 1, seed_plus_index seed 1 set 0" in markdown


def test_a_stochastic_system_keeps_its_draws_apart_from_its_sets(tmp_path: Path):
    # three sampler draws on sets X and Y: X scores 1, 0.5, 0; Y 0.8, 0.8, 0.5
    draws = [[ONE, POINT_EIGHT], [HALF, POINT_EIGHT], [ZERO, HALF]]
    write_run(tmp_path / "runs", "rerank", [uids("X"), uids("Y")], {"rerank": draws}, new=True)
    rows, data, _ = run_compare(tmp_path)
    rerank = system(data, "Sample-Rerank(4)")
    draw_means = [(1 + 0.8) / 2, (0.5 + 0.8) / 2, (0 + 0.5) / 2]
    assert sum(draw_means) / 3 == pytest.approx(0.6)
    assert rerank["mean"] == pytest.approx(0.6)
    # within-set sample variances: X 0.25, Y 0.03
    assert rerank["between_draw_std"] == pytest.approx(math.sqrt((0.25 + 0.03) / 2))
    assert rerank["between_set_std"] == pytest.approx(math.sqrt(2 * 0.1**2))  # of 0.5 and 0.7
    assert rows["Sample-Rerank(4)"][3] == "2 × 3"
    assert rerank["sets"]["S1"]["draws"] == pytest.approx([1.0, 0.5, 0.0])


def test_the_bootstrap_resamples_the_draws(tmp_path: Path):
    """Sample-Rerank's draws score 1 and 0 (mean 0.5), frozen greedy 0.5: level on average,
    and only resampling the draws can put Sample-Rerank's resampled F1 at 1 or 0."""
    right, wrong, half = [(1, 0, 0)] * 10, [(0, 1, 1)] * 10, [(1, 1, 1)] * 10
    examples = uids("E", size=10, absolute=False)
    write_run(tmp_path / "runs", "greedy", [examples], {"greedy": [[half]]}, new=True)
    write_run(tmp_path / "runs", "rerank", [examples], {"rerank": [[right], [wrong]]}, new=True)
    _, data, _ = run_compare(tmp_path, "--reference", "frozen greedy")
    boot = system(data, "Sample-Rerank(4)")["versus"][0]["bootstrap"]
    both, fixed = boot["examples_and_draws"], boot["examples"]
    assert both["observed"] == fixed["observed"] == pytest.approx(0.0)
    # examples alone: every resample scores 0.5 against 0.5; the draws add ±0.5 (P 1/4 each)
    assert (fixed["low"], fixed["high"]) == pytest.approx((0.0, 0.0))
    assert (both["low"], both["high"]) == pytest.approx((-0.5, 0.5))
    assert both["p_above_zero"] == pytest.approx(0.25, abs=0.02)


def cost(generation: int, outputs: int, potential: int | None = None) -> dict[str, int]:
    """The counts a results file records: one draw's forward tokens over its distinct outputs."""
    found = {"forward_tokens": generation, "num_unique_examples": outputs}
    return found | ({} if potential is None else {"potential_forward_tokens": potential})


def test_the_cost_column_is_forward_tokens_per_output(tmp_path: Path, capsys):
    """Generation plus potential over the outputs of every file a system pools (a search's paired
    selection costs what its run did); a file without counts (older greedy) reads n/a."""
    runs = tmp_path / "runs"
    write_run(runs, "old", [uids("A")], {"greedy": [[HALF]]})
    write_run(runs, "ad", [uids("A")], {"greedy": [[ONE]]}, adapter="/x/ad", costs=cost(60, 2))
    for name, ids, counts in (("r0", "A", cost(600, 2, 200)), ("r1", "B", cost(1000, 2, 400))):
        outputs = {"rerank": [[ONE], [HALF]], "is": [[ONE], [ONE]]}
        write_run(runs, name, [uids(ids)], outputs, new=True, costs=counts)
    rows, data, _ = run_compare(tmp_path)
    # (600 + 200 + 1000 + 400) / 4 outputs; the adapter's 60 / 2
    costs = {label: row[5] for label, row in rows.items()}
    assert costs == {
        "system": "forward tokens / output",  # the header
        "frozen greedy": "n/a",
        "adapter ad greedy": "30",
        "Sample-Rerank(4)": "550",
        "Full IS(4) on Sample-Rerank particles": "550",
    }
    assert system(data, "frozen greedy")["cost"] is None
    assert system(data, "Sample-Rerank(4)")["cost"] == {
        "tokens_per_output": 550.0,
        "generation_per_output": 400.0,
        "potential_per_output": 150.0,
        "reward_scoring_per_output": None,
        "outputs": 4,
        "files": 2,
    }
    assert (tmp_path / "out" / "frontier_conll.png").stat().st_size > 0
    assert str(tmp_path / "out" / "frontier_conll.png") in capsys.readouterr().out


def test_the_frontier_places_each_system_by_cost_with_its_paired_interval(tmp_path: Path):
    """Sample-Rerank (mean 0.5) against frozen greedy (0.5): its paired interval [-0.5, +0.5]
    sits around its mean; the reference has no interval against itself."""
    right, wrong, half = [(1, 0, 0)] * 10, [(0, 1, 1)] * 10, [(1, 1, 1)] * 10
    examples, runs = uids("E", size=10, absolute=False), tmp_path / "runs"
    greedy_cost, rerank_cost = cost(50, 10), cost(300, 10, 100)
    write_run(runs, "greedy", [examples], {"greedy": [[half]]}, new=True, costs=greedy_cost)
    outputs = {"rerank": [[right], [wrong]]}
    write_run(runs, "rerank", [examples], outputs, new=True, costs=rerank_cost)
    _, data, _ = run_compare(tmp_path, "--reference", "frozen greedy")
    reference, points = frontier.frontier_points(data)["conll"]
    assert reference["label"] == "frozen greedy"
    by_label = {point.label: point for point in points}
    assert by_label["frozen greedy"].tokens == 5 and by_label["frozen greedy"].interval is None
    rerank = by_label["Sample-Rerank(4)"]
    assert (rerank.tokens, rerank.mean) == pytest.approx((40, 0.5))
    assert rerank.interval == pytest.approx((0.0, 1.0))


def test_absolute_and_relative_uids_of_one_example_pair_up(tmp_path: Path):
    """An old frozen greedy run (absolute uids, seed_plus_index) and a new adapter run
    (relative uids, disjoint) on the same examples measure one set, and are paired on it."""
    write_run(tmp_path / "runs", "old", [uids("A")], {"greedy": [[HALF]]})
    new_ids = [uids("A", absolute=False)]
    write_run(tmp_path / "runs", "new", new_ids, {"greedy": [[ONE]]}, adapter="/x/ad", new=True)
    rows, data, _ = run_compare(tmp_path)
    assert data["num_sets"] == 1 and data["drawings"] == ["disjoint", "seed_plus_index"]
    versus = system(data, "adapter ad greedy")["versus"][0]
    assert (versus["shared_sets"], versus["sets_ahead"]) == (1, 1)
    assert versus["mean"] == pytest.approx(0.5)
    assert rows["adapter ad greedy"][4:7] == ["disjoint", "n/a", "+0.500 (1/1)"]
    assert data["sets"]["S1"]["uids"] == new_ids[0]


def test_old_search_files_rescore_the_paired_selection_from_its_text(tmp_path: Path):
    """An old Sample-Rerank file: the Full IS selection's counts come from its text, scored
    against the row's gold (the same gold fields as Sample-Rerank's counts)."""
    outputs = {"rerank": [[HALF, ZERO]], "is": [[ONE, [(0, 0, 0), (1, 0, 0)]]]}
    write_run(tmp_path / "runs", "rerank", [uids("A"), uids("B")], outputs)
    _, data, _ = run_compare(tmp_path)
    full_is = system(data, "Full IS(4) on Sample-Rerank particles")
    assert full_is["mean"] == pytest.approx(1.0)
    assert full_is["versus"][0]["bootstrap"]["examples"]["observed"] == pytest.approx(0.75)


def test_runs_renamed_to_one_label_are_pooled(tmp_path: Path):
    """The same adapter evaluated again under another name joins its system's sets."""
    runs = tmp_path / "runs"
    write_run(runs, "first", [uids("A")], {"greedy": [[ONE]]}, adapter="/x/ad")
    write_run(runs, "again", [uids("B")], {"greedy": [[ZERO]]}, adapter="/y/ad-copy")
    rows, data, _ = run_compare(tmp_path, "--label", "adapter ad-copy greedy=adapter ad greedy")
    pooled = system(data, "adapter ad greedy")
    assert pooled["num_sets"] == 2 and pooled["mean"] == pytest.approx(0.5)
    assert "adapter ad-copy greedy" not in rows


def spoil_score(run: Path) -> None:
    """Set 1's score in results.json off by 0.01."""
    results = json.loads((run / "results.json").read_text())
    results["scores"][1] += 0.01
    (run / "results.json").write_text(json.dumps(results))


def drop_from_first_row(*keys: str) -> Callable[[Path], None]:
    """A spoiler deleting a nested key of the first predictions row (`scores`, `fp`)."""

    def spoil(run: Path) -> None:
        rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
        node = rows[0]
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
        (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    return spoil


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (spoil_score, "set 1, draw 0: micro_f1 0.800000000000 from the predictions' counts"),
        (lambda run: (run / "predictions.jsonl").unlink(), "cannot read its predictions"),
        (drop_from_first_row("scores", "fp"), "1 rows without per-example statistics for greedy"),
        (drop_from_first_row("uid"), "malformed results or predictions (KeyError: 'uid')"),
    ],
)
def test_bad_results_are_errors_naming_the_file(tmp_path: Path, capsys, spoil, message):
    old_greedy_seeds(tmp_path / "runs")
    spoil(tmp_path / "runs" / "seed1")
    assert agg.main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "seed1/results.json" in error and message in error


def test_results_of_different_metrics_are_not_pooled(tmp_path: Path, capsys):
    old_greedy_seeds(tmp_path / "runs")
    path = tmp_path / "runs" / "seed1" / "results.json"
    path.write_text(path.read_text().replace('"micro_f1"', '"bleu"'))
    assert agg.main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "different metrics" in error and "seed1/results.json" in error


def test_a_gzip_compressed_predictions_file_compares_as_the_plain_one(tmp_path: Path):
    """Committed search runs keep their particles as predictions.jsonl.gz: read through gzip,
    the comparison is the same, number for number."""
    import gzip
    import shutil

    draws = [[ONE, POINT_EIGHT], [HALF, POINT_EIGHT], [ZERO, HALF]]
    write_run(tmp_path / "runs", "rerank", [uids("X"), uids("Y")], {"rerank": draws}, new=True)
    _, plain, _ = run_compare(tmp_path)
    (predictions,) = (tmp_path / "runs").rglob("predictions.jsonl")
    with predictions.open("rb") as src, gzip.open(f"{predictions}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    predictions.unlink()
    _, packed, _ = run_compare(tmp_path)
    assert system(packed, "Sample-Rerank(4)")["sets"] == system(plain, "Sample-Rerank(4)")["sets"]
    assert packed["systems"] == plain["systems"]
