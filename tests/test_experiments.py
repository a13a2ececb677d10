"""Aggregation of sweep outputs into the paper's tables and figures, on fixture run directories
written with the real results schema (grammarrl.runs.results); sweep expansion; launcher configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments import aggregate as agg
from experiments import analysis, jobs, paper_tables
from experiments.runs import AggregationError, load_sweep
from grammarrl.config.checks import CONF_DIR
from grammarrl.job import validate
from tests.conftest import compose_config
from tests.support.runs import conll, make_run, md_rows, read_results

# --- the generic sweep table -------------------------------------------------------------------


@pytest.fixture
def sweep_2x2(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    scores = {
        (0.0, 3): [0.1, 0.3],
        (0.0, 5): [0.2, 0.2],
        (1.0, 3): [0.5, 0.7],
        (1.0, 5): [0.4, 0.41],
    }
    for index, ((lam, b), s) in enumerate(scores.items()):
        make_run(
            root,
            f"{index}_lambda={lam},rollout.beam_width={b}",
            lam=lam,
            b=b,
            results={"results": s},
        )
    return root


def test_sweep_table_has_one_row_per_run_with_the_results_numbers(sweep_2x2: Path, capsys):
    written = agg.aggregate("sweep", [sweep_2x2])
    out = sweep_2x2 / "aggregate"
    assert {p.name for p in written} >= {"sweep.md", "sweep.tex", "runs.md"}
    rows = md_rows((out / "sweep.md").read_text())
    assert list(rows) == ["Configuration", "λ=0 B=3", "λ=0 B=5", "λ=1 B=3", "λ=1 B=5"]
    for run in sorted(sweep_2x2.glob("*_lambda=*")):
        res = read_results(run)
        label = "λ={} B={}".format(
            *re.match(r"\d+_lambda=(\d)\.0,rollout.beam_width=(\d)", run.name).groups()
        )
        assert rows[label][0] == f"{res['mean']:.3f} ± {res['std']:.3f}"
    tex = (out / "sweep.tex").read_text()
    assert "\\textbf{0.600 $\\pm$ 0.141}" in tex  # best of the block: λ=1 B=3
    assert tex.count("\\textbf") == 1
    assert "missing" not in capsys.readouterr().err


def test_failed_run_is_listed_as_missing_not_dropped(sweep_2x2: Path, capsys):
    make_run(sweep_2x2, "4_lambda=0.5,rollout.beam_width=3", lam=0.5)  # no results: it failed
    agg.aggregate("sweep", [sweep_2x2])
    listing = (sweep_2x2 / "aggregate" / "runs.md").read_text()
    assert "| 4_lambda=0.5,rollout.beam_width=3 | **missing** |" in listing
    assert listing.count("| ok |") == 4
    assert "4_lambda=0.5,rollout.beam_width=3" in capsys.readouterr().err


def test_runs_listing_gives_each_finished_job_its_wall_time(sweep_2x2: Path):
    (sweep_2x2 / "0_lambda=0.0,rollout.beam_width=3" / "timing.json").write_text(
        json.dumps({"wall_seconds": 150.0})
    )
    make_run(sweep_2x2, "4_lambda=0.5,rollout.beam_width=3", lam=0.5)  # unfinished
    agg.aggregate("sweep", [sweep_2x2])
    rows = md_rows((sweep_2x2 / "aggregate" / "runs.md").read_text())
    assert rows["0_lambda=0.0,rollout.beam_width=3"][:3] == ["ok", "2.5 min", "–"]
    assert rows["4_lambda=0.5,rollout.beam_width=3"][:2] == ["missing", "–"]


def test_runs_listing_sums_a_resumed_training_runs_step_times(tmp_path: Path):
    """The last attempt's wall time (the evaluations after a resume) is not the run's: the
    listing also gives its steps and their logged time, a step redone after a resume once."""
    metrics = "step,perf/step_seconds,train/reward\n" + "".join(
        f"{step},{seconds},-1.0\n" for step, seconds in [(0, 30), (1, 30), (2, 60), (2, 90)]
    )
    root = tmp_path / "sweep"
    run = make_run(root, "0_train", results={"results": [0.3]}, metrics=metrics)
    (run / "timing.json").write_text(json.dumps({"wall_seconds": 600.0}))
    make_run(root, "1_eval", mode="eval", results={"results": [0.2]})
    agg.aggregate("sweep", [root])
    rows = md_rows((root / "aggregate" / "runs.md").read_text())
    assert rows["0_train"][:3] == ["ok", "10.0 min", "3 (2.5 min)"]  # 30 + 30 + 90 s
    assert rows["1_eval"][2] == "–"


def test_errors_name_the_directory(tmp_path: Path):
    with pytest.raises(AggregationError, match=re.escape(str(tmp_path))):
        agg.aggregate("sweep", [tmp_path])
    make_run(tmp_path, "0_failed")
    with pytest.raises(AggregationError, match="none with a results file"):
        agg.aggregate("sweep", [tmp_path])
    assert agg.main(["sweep", str(tmp_path / "nowhere")]) == 2


def test_cli_writes_into_out_and_prints_the_table(sweep_2x2: Path, tmp_path: Path, capsys):
    assert agg.main(["sweep", str(sweep_2x2), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "o" / "sweep.md").read_text() in printed
    assert "| λ=1 B=3 | **0.600 ± 0.141** |" in printed
    assert str(tmp_path / "o" / "sweep.tex") in printed


def test_search_and_adapter_runs_are_labelled_by_what_they_ran(tmp_path: Path):
    root = tmp_path / "mixed"
    make_run(root, "0_greedy", mode="eval", results={"results": [0.2]})
    make_run(
        root,
        "1_trained",
        mode="eval",
        results={"results": [0.3]},
        extra_config={"eval": {"decoding": "greedy", "adapter": "run/adapter"}},
    )
    for index, (particles, adapter) in enumerate([(10, None), (3, "run/adapter")], start=2):
        make_run(
            root,
            f"{index}_is",
            mode="search",
            results={"results": [0.4]},
            extra_config={
                "search": {"method": "is", "particles": particles},
                "eval": {"decoding": "greedy", "adapter": adapter},
            },
        )
    agg.aggregate("sweep", [root])
    labels = list(md_rows((root / "aggregate" / "sweep.md").read_text()))[1:]
    assert sorted(labels) == sorted(
        [
            "system=baseline adapter=frozen",
            "system=grammarrl adapter=trained",
            "system=search/is search=is(10) adapter=frozen",
            "system=search/is search=is(3) adapter=trained",
        ]
    )
    assert not [label for label in labels if "None" in label]


def test_prepare_and_calibrate_jobs_that_completed_are_not_missing(sweep_2x2: Path, capsys):
    for mode in ("prepare", "calibrate"):
        done = make_run(sweep_2x2, f"{mode}_done", mode=mode)
        (done / "timing.json").write_text(json.dumps({"wall_seconds": 60.0}))
        make_run(sweep_2x2, f"{mode}_crashed", mode=mode)  # no timing.json: it did not end
    agg.aggregate("sweep", [sweep_2x2])
    rows = md_rows((sweep_2x2 / "aggregate" / "runs.md").read_text())
    assert rows["prepare_done"][:2] == rows["calibrate_done"][:2] == ["ok", "1.0 min"]
    assert rows["prepare_crashed"][0] == rows["calibrate_crashed"][0] == "missing"
    err = capsys.readouterr().err
    assert "prepare_crashed" in err and "prepare_done" not in err


# --- the paper's tables -----------------------------------------------------------------------


def main_sweep(root: Path) -> Path:
    """One model, two tasks, the five variants of the main experiment."""
    for task, base in (("conll", 0.4), ("wos", 0.3)):
        make_run(
            root,
            f"{task}_bg",
            task=task,
            mode="eval",
            results={"results": [base, base]},
            choices={"experiment/variant": "baseline_greedy"},
        )
        make_run(
            root,
            f"{task}_bb",
            task=task,
            mode="eval",
            results={"results": [base + 0.1] * 2},
            decodings={"results": "beam"},
        )
        make_run(root, f"{task}_do", task=task, lam=0.0, results={"results": [base + 0.05] * 2})
        make_run(root, f"{task}_ro", task=task, lam=1.0, results={"results": [base + 0.02] * 2})
        make_run(
            root,
            f"{task}_g",
            task=task,
            lam=0.5,
            results={"results": [base + 0.2, base + 0.22], "results_beam": [base + 0.15] * 2},
        )
    return root


def test_main_table_rows_columns_and_bold(tmp_path: Path):
    root = main_sweep(tmp_path / "main")
    agg.aggregate("main", [root])
    text = (root / "aggregate" / "main_results.md").read_text()
    rows = md_rows(text)
    assert list(rows)[1:] == [
        "baseline (greedy)",
        "baseline (beam)",
        "GrammarRL (reverse only)",
        "GrammarRL (direct only)",
        "GrammarRL",
        "GrammarRL (beam)",
    ]
    assert rows["Config"] == ["WoS (Hier. F1)", "CoNLL (F1-micro)"]
    assert rows["baseline (beam)"] == ["0.400 ± 0.000", "0.500 ± 0.000"]
    assert rows["GrammarRL"][1] == "0.610 ± 0.014"
    assert "| **0.610 ± 0.014** |" in text and text.count("**0.") == 2  # best per column only
    assert "| **tiny** |" in text


def test_one_cell_filled_by_two_different_runs_is_an_error(tmp_path: Path):
    root = main_sweep(tmp_path / "main")
    make_run(root, "conll_g_again", lam=0.5, results={"results": [0.9, 0.9]})
    with pytest.raises(AggregationError, match="conll_g_again"):
        agg.aggregate("main", [root])


def test_identical_baselines_collapse(tmp_path: Path):
    """The frozen model evaluated twice (same numbers) fills its cell once: the table is the one
    without the copy, and no error."""
    alone = main_sweep(tmp_path / "alone")
    agg.aggregate("main", [alone])
    root = main_sweep(tmp_path / "main")
    make_run(root, "conll_bg_copy", mode="eval", results={"results": [0.4, 0.4]})
    agg.aggregate("main", [root])
    table = (root / "aggregate" / "main_results.md").read_text()
    assert table == (alone / "aggregate" / "main_results.md").read_text()
    assert md_rows(table)["baseline (greedy)"] == ["0.300 ± 0.000", "0.400 ± 0.000"]


def test_rollout_table_blocks(tmp_path: Path):
    root = tmp_path / "rollout"
    for n, b, s in ((3, 3, 0.5), (6, 3, 0.6), (9, 3, 0.55), (3, 5, 0.52), (3, 10, 0.4)):
        make_run(root, f"n{n}_b{b}", n=n, b=b, results={"results": [s, s]})
    table = paper_tables.rollout_table(load_sweep([root]).evaluations())
    assert [b.title for b in table.blocks] == ["Sampled sequences N (B=3)", "Beam width B (N=3)"]
    assert [[r.label for r in b.rows] for b in table.blocks] == [["3", "6", "9"], ["3", "5", "10"]]
    assert [r.cells[0].bold for r in table.blocks[0].rows] == [False, True, False]
    assert [r.cells[0].bold for r in table.blocks[1].rows] == [False, True, False]
    assert [r.shaded for r in table.blocks[1].rows] == [True, False, False]


def test_calibration_table_from_run_files(tmp_path: Path, capsys):
    root = tmp_path / "cal"
    sigmas = {(3, 3): (0.8, 0.27), (6, 3): (0.81, 0.31), (3, 5): (0.82, 0.3)}
    for (n, b), (d, r) in sigmas.items():
        run = make_run(root, f"n{n}_b{b}", mode="calibrate", n=n, b=b, model="1b")
        # entries record their conditions, the model's settings among them (a dict)
        entry = {"sigma_direct": d, "sigma_reverse": r, "model": {"name": "1b", "dtype": "auto"}}
        (run / "calibration.json").write_text(json.dumps(entry))
    shared = make_run(root, "8b", mode="calibrate", model="8b")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "calibration.json").write_text(
        json.dumps({"conll/8b/n3_b3": {"sigma_direct": 0.6253, "sigma_reverse": 0.1916}})
    )
    (root / "8b" / ".hydra" / "config.yaml").write_text(
        (shared / ".hydra" / "config.yaml")
        .read_text()
        .replace(str(root / "cache"), str(tmp_path / "cache"))
    )
    make_run(root, "failed", mode="calibrate", n=9, b=3, model="1b")
    agg.aggregate("calibration", [root])
    rows = md_rows((root / "aggregate" / "calibration.md").read_text())
    assert rows["(N, B)"] == ["1B σ_direct", "1B σ_reverse", "8B σ_direct", "8B σ_reverse"]
    assert list(rows)[1:] == ["(3,3)", "(6,3)", "(3,5)"]
    assert rows["(3,3)"] == ["0.8000", "0.2700", "0.6253", "0.1916"]
    assert rows["(6,3)"][2:] == ["–", "–"]
    assert "failed" in capsys.readouterr().err
    assert "| failed | **missing** |" in (root / "aggregate" / "runs.md").read_text()


def test_inference_table_best_lambda_cost_and_first_sets(tmp_path: Path):
    root = tmp_path / "inf"
    make_run(root, "greedy", mode="eval", results={"results": [0.43, 0.44]}, eps=20.0)
    make_run(
        root,
        "beam",
        mode="eval",
        results={"results": [0.58, 0.59]},
        decodings={"results": "beam"},
        eps=6.0,
    )
    make_run(
        root,
        "rerank",
        mode="search",
        results={"results": [0.48, 0.49]},
        eps=2.0,
        extra_config={"search": {"method": "rerank"}},
    )
    for lam, s in ((0.25, [0.62, 0.63, 0.1]), (0.5, [0.57, 0.58, 0.9]), (0.75, [0.5, 0.5, 0.5])):
        make_run(root, f"lam{lam}", lam=lam, results={"results": s}, eps=20.0)
    table = paper_tables.inference_table(load_sweep([root]).evaluations(), num_sets=2)
    rows = {r.label: r for r in table.rows()}
    assert rows["Constrained beam (B=3)"].cells[0].text == "≈3×"
    assert rows["Sample-Rerank"].cells[0].text == "≈10×"
    assert rows["GrammarRL (λ=0.5)"].cells[0].text == "1× (+ training)"
    assert rows["Full IS"].cells[1].mean is None  # not run: a dash, not a crash
    best = rows["GrammarRL (best λ)"].cells[1]  # λ=0.25 on the first two sets (not on all three)
    assert best.mean == pytest.approx(0.625) and best.bold
    assert "conll 0.25" in table.notes[0]


# --- prediction statistics and figures --------------------------------------------------------


def test_empty_field_rate_and_trap_counts():
    rows = [
        {"set": 0, "gold": conll(person="A", location="B"), "prediction": conll(person="A")},
        {"set": 0, "gold": conll(misc="C"), "prediction": "not json"},
        {"set": 1, "gold": conll(person="A"), "prediction": conll(person="Z")},
    ]
    assert analysis.empty_field_rate(rows[:2]) == pytest.approx(100 * 2 / 3)
    assert analysis.per_set_mean(rows, analysis.empty_field_rate)[0] == pytest.approx(100 / 3)
    gloss = [{"set": 0, "prediction": "X THERE-DESC X GO"}, {"set": 1, "prediction": "XX X-DESC"}]
    assert analysis.per_set_mean(gloss, analysis.term_count("X")) == (1.0, pytest.approx(2**0.5))


def test_lambda_report_writes_table_and_qualitative_figures(tmp_path: Path):
    root = tmp_path / "lam"
    for lam, empties in ((0.0, 2), (0.5, 1), (1.0, 0)):
        preds = [
            {
                "set": s,
                "gold": conll(person="P", location="L"),
                "prediction": conll(person="" if i < empties else "P", location="L"),
            }
            for s in (0, 1)
            for i in range(2)
        ]
        make_run(
            root,
            f"conll{lam}",
            lam=lam,
            results={"results": [0.5 + lam / 10] * 2},
            predictions={"results": preds},
        )
        gloss_preds = [
            {"set": s, "prediction": " ".join(["THERE-DESC"] * int(4 * lam) + ["X"])}
            for s in (0, 1)
        ]
        make_run(
            root,
            f"gloss{lam}",
            task="gloss",
            lam=lam,
            results={"results": [0.3, 0.3]},
            predictions={"results": gloss_preds},
        )
    base = tmp_path / "base"
    make_run(
        base,
        "bg",
        mode="eval",
        results={"results": [0.4, 0.4]},
        predictions={"results": [{"set": 0, "gold": conll(person="P"), "prediction": conll()}]},
    )
    written = agg.aggregate("ablation_lambda", [root], baselines=[str(base)])
    names = {p.name for p in written}
    assert {
        "ablation_lambda.md",
        "conll_empty_fields.png",
        "conll_empty_fields.md",
        "gloss_trap_tokens.md",
        "gloss_trap_tokens.tex",
        "gloss_trap_tokens.png",
    } <= names
    empty = md_rows((root / "aggregate" / "conll_empty_fields.md").read_text())
    # 2 gold fields per example, 2 examples per set: 2, 1, 0 empty person fields of 4
    assert [v[0] for k, v in empty.items() if k != "λ"] == [
        "50.000 ± 0.000",
        "25.000 ± 0.000",
        "0.000 ± 0.000",
        "100.000",
    ]
    traps = md_rows((root / "aggregate" / "gloss_trap_tokens.md").read_text())
    assert traps["0 (direct only)"][2] == "0.0" and traps["1 (reverse only)"][2] == "4.0"
    assert traps["0.5"][3] == "1.0"
    lam_rows = md_rows((root / "aggregate" / "ablation_lambda.md").read_text())
    assert list(lam_rows)[1:] == ["0 (direct only)", "0.5", "1 (reverse only)"]
    assert (root / "aggregate" / "conll_empty_fields.png").stat().st_size > 1000


def test_training_curves_from_metrics_csv(tmp_path: Path):
    root = tmp_path / "curves"
    csv = (
        "step,train/reward,val/train_conll_metric,val/dev_conll_metric\n"
        "0,0.1,,\n1,0.2,0.3,0.25\n3,0.3,0.4,0.35\n"
    )
    run = make_run(root, "r", results={"results": [0.5]}, metrics=csv)
    series = analysis.read_metrics(load_sweep([run]).runs[0])
    assert series["val/dev_conll_metric"] == [(1, 0.25), (3, 0.35)]
    assert series["train/reward"] == [(0, 0.1), (1, 0.2), (3, 0.3)]
    written = agg.aggregate("sweep", [root])
    assert any(p.name == "training_curves.png" for p in written)


def test_a_panel_grid_of_many_runs_draws_every_run_its_own_way(tmp_path: Path, monkeypatch):
    """Twelve labels: matplotlib's ten colours repeat, so the 11th and 12th labels differ from
    the 1st and 2nd by their line style, in the panels and in the legend."""
    from matplotlib.colors import to_rgba

    from grammarrl.evaluation import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    lines = {f"run {i}": [(0, float(i)), (1, float(i) + 1)] for i in range(12)}
    plots.panel_grid([("reward", lines), ("kl", lines)], tmp_path / "curves.png", columns=3)
    (fig,) = figures
    panel, legend_cell = fig.axes[0], fig.axes[2]
    drawn = [(to_rgba(line.get_color()), line.get_linestyle()) for line in panel.get_lines()]
    assert len(drawn) == 12 and len(set(drawn)) == 12
    handles = legend_cell.get_legend().legend_handles
    legend = [(to_rgba(h.get_color()), h.get_linestyle()) for h in handles]
    assert legend == drawn


def test_a_sweeps_training_curves_of_many_runs_keep_each_run_apart(tmp_path: Path, monkeypatch):
    """Twelve runs of one task: the 11th and 12th share colours with the 1st and 2nd and differ
    by their marker; dev (solid) and train (dashed) lines of a run share colour and marker."""
    from matplotlib.colors import to_rgba

    from experiments import figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig) or path)
    curves = [
        figures.Curve("conll", f"run {i}", train=[(0, 0.1), (1, 0.2)], dev=[(0, 0.1), (1, i / 12)])
        for i in range(12)
    ]
    figures.training_curves(curves, tmp_path / "curves.png", {"conll": "F1"})
    (ax,) = drawn[0].axes
    styles = [(to_rgba(ln.get_color()), ln.get_marker(), ln.get_linestyle()) for ln in ax.lines]
    assert len(styles) == 24 and len(set(styles)) == 24
    assert styles[0][:2] == styles[1][:2] and styles[0][2] != styles[1][2]  # run 0: dev, train


def test_a_run_validated_once_is_named_with_the_settings_that_caused_it(tmp_path: Path, capsys):
    root = tmp_path / "curves"
    make_run(
        root,
        "r",
        results={"results": [0.5]},
        metrics="step,train/reward,val/dev_conll_metric\n0,,0.2\n0,0.1,\n1,0.2,\n",
        extra_config={"optim": {"max_steps": 2}, "trainer": {"val_check_interval": 50}},
    )
    agg.aggregate("sweep", [root])
    err = capsys.readouterr().err
    assert "validated at 1 step(s)" in err
    assert "trainer.val_check_interval=50, trainer.max_steps=2" in err


# --- sweeps and launchers ---------------------------------------------------------------------


def test_ablation_lambda_expands_to_five_jobs():
    expanded = jobs.expand(["+experiment=ablation_lambda"])
    assert len(expanded) == 5
    lambdas = [next(o for o in job if o.startswith("lambda=")) for job in expanded]
    assert lambdas == ["lambda=0", "lambda=0.25", "lambda=0.5", "lambda=0.75", "lambda=1"]
    cfg = jobs.compose_job(expanded[1])
    assert (cfg["lambda"], cfg.model.name, cfg.rollout.num_samples, cfg.rollout.beam_width) == (
        0.25,
        "1b",
        3,
        3,
    )


EXPERIMENT_DIR = Path(CONF_DIR) / "experiment"
EXPERIMENT_FILES = sorted(EXPERIMENT_DIR.rglob("*.yaml"))
JOB_COUNTS = {  # the sweeps whose size is fixed: the paper's grids and their CPU versions
    "main": 45,
    "ablation_rollout": 5,
    "calibration": 21,
    "inference_time": 15,
    "main_cpu": 5,
    "ablation_lambda_cpu": 5,
    "ablation_rollout_cpu": 5,
    "calibration_cpu": 5,
    "inference_time_cpu": 5,
    "evidence_conll_cpu": 5,
    "evidence_gloss_cpu": 5,
    "evidence4_pilot_cpu": 4,
}


@pytest.mark.parametrize(
    "path", EXPERIMENT_FILES, ids=[str(p.relative_to(EXPERIMENT_DIR)) for p in EXPERIMENT_FILES]
)
def test_every_experiment_config_composes_and_validates(path: Path):
    """Every file under conf/experiment/, found by listing the folder: an experiment's first and
    last job (composing all 116 jobs of the largest takes too long for a test), a file of one of
    its groups (variant, rollout, sigma, ...) on top of the defaults."""
    name = path.relative_to(EXPERIMENT_DIR).with_suffix("")
    if name.parent == Path("."):
        expanded = jobs.expand([f"+experiment={name}"])
        assert len(expanded) == JOB_COUNTS.get(str(name), len(expanded))
    else:
        expanded = [[f"+experiment/{name.parent}={name.name}"]]
    for job in (expanded[0], expanded[-1]):
        validate(jobs.compose_job(job))


def test_job_counts_name_existing_experiments():
    assert set(JOB_COUNTS) <= {p.stem for p in EXPERIMENT_FILES if p.parent == EXPERIMENT_DIR}


def test_variants_and_rollouts_land_in_the_job_config():
    main = jobs.expand(["+experiment=main", "task=conll", "model=1b"])
    configs = {job[-2].split("=")[1]: jobs.compose_job(job) for job in main}
    assert {
        k: (c.mode, c["lambda"], c.eval.decoding, c.train.eval_beam) for k, c in configs.items()
    } == {
        "baseline_greedy": ("eval", 0.5, "greedy", False),
        "baseline_beam": ("eval", 0.5, "beam", False),
        "direct_only": ("train", 0.0, "greedy", False),
        "reverse_only": ("train", 1.0, "greedy", False),
        "grammarrl": ("train", 0.5, "greedy", True),
    }
    cal = [jobs.compose_job(j) for j in jobs.expand(["+experiment=calibration", "task=wos"])]
    assert sorted((c.model.name, c.rollout.num_samples, c.rollout.beam_width) for c in cal) == [
        ("1b", 3, 3),
        ("1b", 3, 5),
        ("1b", 3, 10),
        ("1b", 6, 3),
        ("1b", 9, 3),
        ("3b", 3, 3),
        ("8b", 3, 3),
    ]
    assert {c.mode for c in cal} == {"calibrate"}
    cpu = jobs.compose_job(jobs.expand(["+experiment=ablation_lambda_cpu"])[0])
    assert (cpu.model.name, cpu.task.name, cpu.trainer.max_steps) == ("smollm2", "conll", 8)


def test_command_line_sweeps_override_the_experiment():
    expanded = jobs.expand(["+experiment=ablation_lambda", "lambda=0,1", "task=gloss,wos"])
    assert len(expanded) == 4
    plain = jobs.expand(["lambda=0,0.5", "rollout.beam_width=3,5,10"])  # no experiment
    assert len(plain) == 6 and ["lambda=0.5", "rollout.beam_width=10"] in plain


@pytest.mark.parametrize(
    ("launcher", "target", "key", "value"),
    [("slurm", "SlurmLauncher", "gpus_per_node", 1), ("local", "JoblibLauncher", "n_jobs", 2)],
)
def test_launcher_configs_compose(launcher: str, target: str, key: str, value: int):
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class

    with initialize_config_dir(config_dir=jobs.CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True
        )
    assert cfg.hydra.launcher._target_.endswith(target)
    assert cfg.hydra.launcher[key] == value
    assert get_class(cfg.hydra.launcher._target_).__name__ == target


def test_wandb_logger_groups_a_sweep():
    from omegaconf import OmegaConf

    logger = OmegaConf.to_container(compose_config(["+experiment=ablation_lambda"]).logger)
    assert logger["group"] == "${hydra:sweep.dir}"  # one W&B group per sweep directory
    assert "experiment=ablation_lambda" in logger["tags"]


def test_wandb_report_definition():
    from experiments.wandb_report import build_report

    report = build_report("grammarrl", "me", "multirun/2025-01-01/12-00-00")
    grids = [b for b in report.blocks if type(b).__name__ == "PanelGrid"]
    assert grids[0].runsets[0].groupby == ["config.lambda"]
    assert "multirun/2025-01-01/12-00-00" in grids[0].runsets[0].filters
