"""`train.eval_test=false`: a dev-only training run trains, validates and saves, never draws the
test sets, writes a results.json that marks it complete without any test evaluation (a re-run
is skipped), and is left out of the aggregator's tables; the test evaluations it contradicts
are refused before any model is loaded."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

import grammarrl.run
import grammarrl.runs.rundir
import grammarrl.training.train
from experiments import aggregate as agg
from experiments.runs import AggregationError, load_sweep
from grammarrl.errors import ConfigError
from grammarrl.job import validate
from grammarrl.runs.results import NO_TEST_NOTE, has_test_evaluation, untested_results
from grammarrl.tasks.base import Task
from tests.conftest import compose_config
from tests.support.runs import make_run, md_rows

DEV_ONLY = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "trainer.max_steps=2",
    "optim.batch_size=2",
    "optim.lr=1e-3",
    "task.max_new_tokens=32",
    "task.dev_size=2",
    "reward.sigma_direct=1",
    "reward.sigma_reverse=1",
    "trainer.val_check_interval=1",
    "train.val_size=2",
    "train.val_at_start=false",
    "train.checkpoint_every_n_steps=1",
    "eval.num_test_sets=1",
    "eval.test_size=2",
    "data.limit_train=4",
    "train.eval_test=false",
]


def dispatch_in(out: Path, overrides: list[str], mp: pytest.MonkeyPatch) -> tuple[object, str]:
    """`python -m grammarrl.run <overrides> hydra.run.dir=<out>` in-process (the job's run
    directory patched in where Hydra would give it): (what the job returned, what it printed)."""
    mp.setattr(grammarrl.run, "hydra_run_dir", lambda: out)
    mp.setattr(grammarrl.runs.rundir, "hydra_run_dir", lambda: out)
    out.mkdir(parents=True, exist_ok=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = grammarrl.run.dispatch(compose_config(overrides))
    return result, printed.getvalue()


@pytest.fixture(scope="module")
def dev_only(tmp_path_factory):
    """A 2-step dev-only run, then the same command again, with every test-set drawing
    (`Task.test_sets`, which all test evaluations go through) and every start of training
    (`run_train`) recorded."""
    work = tmp_path_factory.mktemp("work")
    out = work / "run"
    drawn: list[tuple] = []
    trained: list[str] = []
    draw, train = Task.test_sets, grammarrl.training.train.run_train

    def spy_draw(self, *args, **kwargs):
        drawn.append(args)
        return draw(self, *args, **kwargs)

    def spy_train(cfg, **found):
        trained.append(cfg.mode)
        return train(cfg, **found)

    previous = os.getcwd()
    os.chdir(work)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Task, "test_sets", spy_draw)
            mp.setattr(grammarrl.training.train, "run_train", spy_train)
            first, printed = dispatch_in(out, DEV_ONLY, mp)
            stored = (out / "results.json").read_bytes()
            again, _ = dispatch_in(out, DEV_ONLY, mp)
    finally:
        os.chdir(previous)
    return {
        "out": out,
        "first": first,
        "again": again,
        "printed": printed,
        "stored": stored,
        "drawn": drawn,
        "trained": trained,
    }


def test_the_test_sets_are_never_drawn(dev_only):
    assert dev_only["drawn"] == []


def test_results_mark_the_run_complete_without_a_test_evaluation(dev_only):
    out = dev_only["out"]
    record = json.loads((out / "results.json").read_text())
    assert record["eval_test"] is False and record["evaluations"] == {}
    assert record["note"] == NO_TEST_NOTE and not has_test_evaluation(record)
    assert not {"metric", "scores", "mean", "set_ids"} & set(record)
    assert record["task"] == "conll" and record["model"] == "tiny" and record["final_step"] == 2
    assert record["adapter"] == "run/adapter"  # relative to the working directory
    assert record["config"]["train"]["eval_test"] is False
    assert record["best_dev"] == json.loads((out / "best_dev.json").read_text())
    assert dev_only["first"] == {**record, "path": str(out / "results.json")}


def test_nothing_of_a_test_evaluation_is_written(dev_only):
    out = dev_only["out"]
    assert sorted(p.name for p in out.glob("results*.json")) == ["results.json"]
    assert not list(out.glob("predictions*")) and not (out / "summary.md").exists()


def test_training_validation_and_saving_run_as_usual(dev_only):
    out = dev_only["out"]
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "adapter-best-dev" / "adapter_model.safetensors").is_file()
    assert (out / "checkpoints" / "last.ckpt").is_file() and (out / "timing.json").is_file()
    assert (out / "samples.jsonl").read_text().strip()
    rows = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert {row["slice"] for row in rows} >= {"dev"} and {row["step"] for row in rows} == {1, 2}
    assert "val/dev_micro_f1" in (out / "metrics" / "metrics.csv").read_text()


def test_the_end_of_run_summary_says_no_test_evaluation_was_run(dev_only):
    printed = dev_only["printed"]
    assert "No test evaluation was run (train.eval_test=false)" in printed
    assert "± " not in printed  # no table of test metrics


def test_the_same_command_again_is_skipped(dev_only):
    assert dev_only["trained"] == ["train"]  # the second job never reached training
    assert (dev_only["out"] / "results.json").read_bytes() == dev_only["stored"]
    assert dev_only["again"] == json.loads(dev_only["stored"])


def test_eval_test_true_later_evaluates_the_trained_run_on_the_test_sets(
    dev_only, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    shutil.copytree(dev_only["out"], out)
    monkeypatch.chdir(tmp_path)
    results, _ = dispatch_in(out, [*DEV_ONLY, "train.eval_test=true"], monkeypatch)
    record = json.loads((out / "results.json").read_text())
    assert has_test_evaluation(record) and len(record["scores"]) == 1  # eval.num_test_sets
    assert results["greedy"]["path"] == str(out / "results.json")
    assert (out / "predictions.jsonl").is_file()
    steps = [
        json.loads(line)["step"] for line in (out / "validation.jsonl").read_text().splitlines()
    ]
    assert max(steps) == 2  # no step trained again: it resumed at trainer.max_steps


def test_runs_recorded_before_the_key_still_compare_as_tested(dev_only, tmp_path):
    from grammarrl.runs.rundir import plan_job

    old = compose_config([k for k in DEV_ONLY if not k.startswith("train.eval_test")])
    record = json.loads((dev_only["out"] / "job.json").read_text())
    del record["config"]["train"]["eval_test"]  # a run recorded before the key: it tested
    assert old.train.eval_test is True
    (tmp_path / "job.json").write_text(json.dumps(record))
    (tmp_path / "results.json").write_text(json.dumps({"mean": 0.5}))
    assert plan_job(old, tmp_path).done == {"mean": 0.5}  # old runs are still skipped


@pytest.mark.parametrize("other", ["eval_beam", "eval_baseline", "eval_best_dev"])
def test_a_test_evaluation_with_eval_test_false_is_refused(other):
    cfg = compose_config([*DEV_ONLY, f"train.{other}=true"])
    with pytest.raises(
        ConfigError, match=rf"^train\.eval_test=false contradicts train\.{other}=true"
    ):
        validate(cfg)
    validate(compose_config([*DEV_ONLY, f"train.{other}=true", "train.eval_test=true"]))
    validate(compose_config([*DEV_ONLY, f"train.{other}=true", "mode=eval"]))  # not trained


def test_the_aggregator_lists_a_dev_only_run_and_leaves_it_out_of_its_tables(tmp_path, capsys):
    root = tmp_path / "sweep"
    make_run(root, "0_tested", results={"results": [0.1, 0.3]})
    dev_only = make_run(root, "1_dev_only", lam=1.0)
    config = yaml.safe_load((dev_only / ".hydra" / "config.yaml").read_text())
    config["train"] = {"eval_test": False}
    record = untested_results(task="conll", model="tiny", config=config, final_step=2)
    (dev_only / "results.json").write_text(json.dumps(record))

    sweep = load_sweep([root])
    assert [run.untested for run in sweep.runs] == [False, True]
    assert [ev.run.path.name for ev in sweep.evaluations()] == ["0_tested"]
    agg.aggregate("sweep", [root])
    rows = md_rows((root / "aggregate" / "sweep.md").read_text())
    assert [cells[0] for label, cells in rows.items() if label != "Configuration"] == [
        "0.200 ± 0.141"  # the tested run's row alone
    ]
    listing = (root / "aggregate" / "runs.md").read_text()
    assert "| 1_dev_only | ok, no test evaluation (train.eval_test=false) |" in listing
    err = capsys.readouterr().err
    assert f"no test evaluation (train.eval_test=false): {dev_only}" in err
    assert "missing" not in err

    (root / "0_tested" / "results.json").unlink()
    with pytest.raises(
        AggregationError,
        match=r"none with a results file of a test evaluation \(1 finished with no test evaluation",
    ):
        agg.aggregate("sweep", [root])
