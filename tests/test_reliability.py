"""Reliability: sweeps that survive failures and skip finished jobs, no result shown under
settings it was not produced with (one W&B run per job, run-directory records, checked resumes),
atomic results and checkpoints under a full disk, and bad input (each with a clear error or a
counted skip).

The exact resume after a real kill is in tests/test_resume.py; validity of constrained outputs in
tests/test_reliability_validity.py. Other bad-input cases are tested where their code lives:
malformed/missing-field rows and unreadable files (test_data.py), bad config values
(test_config.py), missing or mismatched adapters (test_models.py).
"""

from __future__ import annotations

import csv
import errno
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grammarrl.training.module
import grammarrl.training.rloo_step
from grammarrl.data.sources import SAMPLES_DIR
from grammarrl.errors import ConfigError, DataError, GrammarRLError, ModelError
from grammarrl.runs.atomic import AtomicWriteError, write_json
from grammarrl.runs.results import config_dict, write_results
from grammarrl.tasks import load_task
from grammarrl.training.module import NonFiniteLossError
from grammarrl.training.resume import resolve_resume
from grammarrl.training.train import AtomicCheckpointIO, run_train
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "optim.batch_size=2",
    "optim.lr=1e-3",
    "task.max_new_tokens=64",
    "task.dev_size=2",
    "reward.sigma_direct=1",
    "reward.sigma_reverse=1",
    "train.checkpoint_every_n_steps=1",
    "trainer.val_check_interval=100",
    "train.val_size=2",
    "eval.num_test_sets=1",
    "eval.test_size=2",
    "data.limit_train=4",
]


def resume_of(cfg, out: Path):
    """`resolve_resume` of a run directory under this config, as `run_train` calls it."""
    return resolve_resume(out, cfg.train.resume, cfg.trainer.max_steps, config_dict(cfg))


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    return env


def cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grammarrl.run", *args],
        cwd=cwd,
        env={**clean_env(), **env},
        capture_output=True,
        text=True,
        check=False,
    )


def train_in(work: Path, overrides: list[str]) -> tuple[Path, object]:
    """run_train in a scratch working directory; (run dir, results or the exception raised)."""
    previous = os.getcwd()
    os.chdir(work)
    try:
        try:
            outcome = run_train(compose_config([*TINY_TRAIN, *overrides]))
        except GrammarRLError as err:
            outcome = err
    finally:
        os.chdir(previous)
    runs = sorted((work / "outputs").glob("*/*"), key=lambda p: p.stat().st_mtime)
    return runs[-1], outcome


@pytest.fixture
def copy_samples(tmp_path):
    shutil.copytree(SAMPLES_DIR, tmp_path / "data")
    return tmp_path / "data"


# ----- sweeps ----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["basic", "submitit_local", "local"])
def test_sweep_records_a_failed_job_runs_the_others_and_rerun_skips_completed(tmp_path, launcher):
    """The same behaviour under Hydra's basic launcher (in process), submitit's local executor
    (each job a subprocess, as on SLURM) and joblib (`hydra/launcher=local`)."""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "+experiment=tiny_scale",
        "lambda=0,1.5",
        f"hydra.sweep.dir={sweep}",
        f"hydra/launcher={launcher}",
    ]
    first = cli(*args)
    assert first.returncode != 0  # the sweep reports that a job failed ...
    good = next(
        p.parent.parent
        for p in sweep.glob("*/.hydra/overrides.yaml")
        if "lambda=0" in p.read_text().split()
    )
    bad = next(
        p.parent.parent
        for p in sweep.glob("*/.hydra/overrides.yaml")
        if "lambda=1.5" in p.read_text().split()
    )
    assert (good / "results.json").is_file(), first.stderr[-3000:]  # ... and the other job ran
    assert not (good / "failed.json").exists()
    failure = json.loads((bad / "failed.json").read_text())
    assert failure["type"] == "ConfigError" and "lambda=1.5" in failure["error"]
    assert not (bad / "results.json").exists()

    timing = (good / "timing.json").read_text()
    assert json.loads(timing)["wall_seconds"] > 0 and not (bad / "timing.json").exists()
    before = (good / "results.json").read_bytes(), (good / "results.json").stat().st_mtime_ns
    second = cli(*args)  # the same sweep again: the completed job is skipped, not re-run
    assert second.returncode != 0
    # submitit's jobs print into their own logs; every job also logs into its run.log
    assert "Skipping this job" in second.stdout + second.stderr + (good / "run.log").read_text()
    assert (
        (good / "results.json").read_bytes(),
        (good / "results.json").stat().st_mtime_ns,
    ) == before
    assert (good / "timing.json").read_text() == timing  # a skipped re-run keeps the timing

    from experiments import aggregate as agg

    agg.aggregate("sweep", [sweep])
    listing = (sweep / "aggregate" / "runs.md").read_text()
    assert f"| {bad.name} | **failed**: ConfigError: lambda=1.5 is invalid" in listing
    assert f"| {good.name} | ok |" in listing


def test_failure_record_is_removed_once_the_job_succeeds(tmp_path):
    run = tmp_path / "run"
    args = [
        "mode=eval",
        "model=tiny",
        "task=conll",
        "logger=none",
        "task.max_new_tokens=16",
        "eval.num_test_sets=1",
        "eval.test_size=2",
        f"hydra.run.dir={run}",
    ]
    failed = cli(*args, f"eval.adapter={tmp_path / 'nowhere'}")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert "no adapter_config.json" in json.loads((run / "failed.json").read_text())["error"]
    ok = cli(*args)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (run / "results.json").is_file() and not (run / "failed.json").exists()


# ----- no result is ever shown under settings it was not produced with -------------------------
TINY_SWEEP = ["+experiment=tiny_scale", "trainer.max_steps=1", "eval.num_test_sets=1"]


def sweep_labels(sweep_dir: Path) -> list[str]:
    """The row labels of the aggregated sweep table."""
    from experiments import aggregate as agg

    agg.aggregate("sweep", [sweep_dir])
    table = (sweep_dir / "aggregate" / "sweep.md").read_text()
    return sorted(
        line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| λ=")
    )


def test_each_sweep_job_logs_its_own_finished_wandb_run(tmp_path, monkeypatch):
    """A multirun in one process, as Hydra's basic launcher runs it: every job gets its own W&B
    run with its own config and tags in the sweep's group, finished before the next starts."""
    import runpy

    import wandb
    from hydra.core.hydra_config import HydraConfig
    from wandb.sdk.wandb_run import Run

    started, summaries = [], {}
    real_init, real_finish = wandb.init, Run.finish

    def init(*args, **kwargs):
        started.append((kwargs, real_init(*args, **kwargs)))
        return started[-1][1]

    def finish(run, *args, **kwargs):
        summaries[run.id] = dict(run.summary)  # not readable once finished
        return real_finish(run, *args, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setattr(Run, "finish", finish)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "grammarrl.run",
            "-m",
            *TINY_SWEEP,
            "logger=wandb",
            "lambda=0,1",
            f"hydra.sweep.dir={tmp_path}",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ],
    )
    try:
        runpy.run_module("grammarrl.run", run_name="__main__")  # python -m grammarrl.run
    finally:
        HydraConfig.instance().cfg = None  # later tests run outside Hydra
    assert [kwargs["config"]["lambda"] for kwargs, _ in started] == [0, 1]
    for job, (kwargs, run) in enumerate(started):
        assert run._is_finished, f"job {job}'s W&B run was left open"
        assert kwargs["group"] == str(tmp_path) and f"lambda={job}" in kwargs["tags"]
        assert len(list((tmp_path / str(job) / "wandb").glob("offline-run-*"))) == 1
        assert (
            summaries[run.id]["results/mean"]
            == json.loads((tmp_path / str(job) / "results.json").read_text())["mean"]
        )


def test_rerun_sweep_with_new_values_never_shows_old_results_under_new_labels(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = cli("-m", *TINY_SWEEP, "lambda=0,1", f"hydra.sweep.dir={sweep_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    results = {p: p.read_bytes() for p in sweep_dir.glob("*/results.json")}
    hydra_files = {p: p.read_text() for p in sweep_dir.glob("*/.hydra/*.yaml")}
    assert len(results) == 2 and sweep_labels(sweep_dir) == ["λ=0", "λ=1"]

    again = cli("-m", *TINY_SWEEP, "lambda=0.25,0.75", f"hydra.sweep.dir={sweep_dir}")
    text = again.stdout + again.stderr
    assert again.returncode != 0 and "Skipping" not in text
    assert "holds outputs produced with other settings: lambda=0 (now 0.25)" in text
    assert "lambda=1 (now 0.75)" in text and "overwrite=true" in text
    assert {p: p.read_bytes() for p in results} == results
    assert {p: p.read_text() for p in hydra_files} == hydra_files  # .hydra/ put back
    assert not list(sweep_dir.glob("*/failed.json"))  # the jobs there did not fail
    assert sweep_labels(sweep_dir) == ["λ=0", "λ=1"]

    replaced = cli(
        "-m", *TINY_SWEEP, "lambda=0.25,0.75", "overwrite=true", f"hydra.sweep.dir={sweep_dir}"
    )
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert sweep_labels(sweep_dir) == ["λ=0.25", "λ=0.75"]


def test_a_run_recorded_before_keys_moved_is_still_skipped(tmp_path, caplog):
    """A job.json written when max_steps, grad_clip and the validation keys lived in optim and
    trainer (and trainer held no Trainer defaults, kl_penalty did not exist and `seed` alone
    seeded training and calibration) reads under today's names: the same job is skipped, and a
    changed setting is still named."""
    from grammarrl.runs import rundir

    cfg = compose_config(["model=tiny", "mode=train", "logger=none"])
    rundir.commit(cfg, tmp_path, rundir.Plan())
    write_json(tmp_path / "results.json", {"mean": 0.5})
    record = json.loads((tmp_path / "job.json").read_text())
    config = record["config"]
    trainer, train = config["trainer"], config["train"]
    config["optim"]["max_steps"] = trainer.pop("max_steps")
    config["optim"]["grad_clip"] = trainer.pop("gradient_clip_val")
    for key in ("val_size", "val_at_start", "checkpoint_every_n_steps"):
        trainer[key] = train.pop(key)
    for key in rundir.TRAINER_BEFORE:
        del trainer[key]
    for key in rundir.ADDED:
        *parents, leaf = key.split(".")
        functools.reduce(dict.get, parents, config).pop(leaf, None)
    del train["seed"]
    del config["reward"]["calibration_seed"]
    write_json(tmp_path / "job.json", record)
    before = compose_config(
        ["model=tiny", "mode=train", "logger=none", "eval.test_set_drawing=seed_plus_index"]
    )
    assert rundir.plan_job(before, tmp_path).done == {"mean": 0.5}
    with caplog.at_level("WARNING"):  # today's test sets: evaluated again, training continues
        assert rundir.plan_job(cfg, tmp_path).remove == [tmp_path / "results.json"]
    assert "eval.test_set_drawing=seed_plus_index (now disjoint)" in caplog.text
    write_json(tmp_path / "results.json", {"mean": 0.5})
    for change, named in (
        ("kl_penalty=reward", "kl_penalty=loss"),
        ("train.seed=1", "train.seed=0"),
    ):
        other = compose_config(["model=tiny", "mode=train", "logger=none", change])
        with pytest.raises(rundir.RunDirConflict, match=rf"{named} \(now"):
            rundir.plan_job(other, tmp_path)  # not what the old run did
    stream = compose_config(
        ["model=tiny", "mode=train", "logger=none", "reward.calibration_seed=1"]
    )
    with caplog.at_level("WARNING"):  # σ's travel in checkpoints: training may continue
        assert rundir.plan_job(stream, tmp_path).done is None
    assert "reward.calibration_seed=0 (now 1)" in caplog.text  # it was `seed`'s stream
    config["optim"]["max_steps"] = 7
    write_json(tmp_path / "job.json", record)
    plan = rundir.plan_job(cfg, tmp_path)  # more steps: the training run continues
    assert plan.done is None and tmp_path / "results.json" in plan.remove


@pytest.mark.parametrize("where", ["record", "results"])
def test_outputs_of_a_machine_where_auto_resolved_otherwise_are_not_reused(tmp_path, where):
    """`model.dtype=auto` is bfloat16 on a CPU with native bf16 and float32 elsewhere: results
    computed on the other kind of machine are neither skipped over nor continued."""
    from grammarrl.runs import rundir

    cfg = compose_config(["model=tiny", "mode=eval", "logger=none"])
    here = rundir.resolved_settings(cfg)
    other = "float32" if here["dtype"] == "bfloat16" else "bfloat16"
    rundir.commit(cfg, tmp_path, rundir.Plan())
    write_json(tmp_path / "results.json", {"mean": 0.5, "device": "cpu", "dtype": here["dtype"]})
    assert rundir.plan_job(cfg, tmp_path).done["mean"] == 0.5  # same machine kind: skipped

    record = json.loads((tmp_path / "job.json").read_text())
    if where == "record":
        record["resolved"]["dtype"] = other
    else:  # a record from before resolved settings were kept: the results say it
        del record["resolved"]
        write_json(tmp_path / "results.json", {"mean": 0.5, "device": "cpu", "dtype": other})
    write_json(tmp_path / "job.json", record)
    with pytest.raises(
        rundir.RunDirConflict, match=re.escape(f"dtype={other} (this machine: {here['dtype']})")
    ):
        rundir.plan_job(cfg, tmp_path)
    overwrite = compose_config(["model=tiny", "mode=eval", "logger=none", "overwrite=true"])
    plan = rundir.plan_job(overwrite, tmp_path)
    assert plan.done is None and tmp_path / "results.json" in plan.remove


def test_run_dir_holds_one_job_and_training_continues_with_more_steps(tmp_path):
    run = tmp_path / "run"
    train = [*TINY_SWEEP, f"hydra.run.dir={run}"]
    assert cli(*train).returncode == 0
    results = (run / "results.json").read_bytes()
    for extra in ([], ["skip_completed=false"], ["overwrite=true"]):
        evaluated = cli("mode=eval", "model=tiny", "logger=none", *extra, f"hydra.run.dir={run}")
        assert evaluated.returncode == 2, extra
        assert (
            "holds the outputs of a mode=train run; mode=eval would write its results on "
            "top of them" in evaluated.stdout + evaluated.stderr
        )
    assert (run / "results.json").read_bytes() == results
    assert "mode: train" in (run / ".hydra" / "config.yaml").read_text()

    more = cli(*train, "trainer.max_steps=2")
    text = more.stdout + more.stderr
    assert more.returncode == 0, text[-3000:]
    assert "Continuing the training run" in text and "trainer.max_steps=1 (now 2)" in text
    assert "Resuming from" in text and "(1 steps done)" in text
    assert json.loads((run / "results.json").read_text())["config"]["trainer"]["max_steps"] == 2
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    same = cli(*train, "trainer.max_steps=2")
    assert "Skipping this job" in same.stdout + same.stderr


def test_a_second_process_in_a_running_jobs_directory_is_refused(tmp_path):
    """While a job runs in a directory (it holds the directory's lock), the same command started
    again, as when a stopped job is restarted before it has exited, is refused before it writes
    anything, and the directory's `.hydra/` still describes the running job; once the lock is
    released the directory is usable again (the finished job is skipped)."""
    from grammarrl.runs import rundir

    run = tmp_path / "run"
    evaluate = ["mode=eval", "model=tiny", "logger=none", f"hydra.run.dir={run}"]
    assert cli(*evaluate).returncode == 0
    hydra_files = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    results = (run / "results.json").read_bytes()
    with rundir.claimed(run):
        second = cli(*evaluate, "skip_completed=false")
    text = second.stdout + second.stderr
    assert second.returncode == 2, text[-3000:]
    assert f"{run} is in use: pid {os.getpid()} (since " in text
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == hydra_files
    assert (run / "results.json").read_bytes() == results and not (run / "failed.json").exists()
    again = cli(*evaluate)
    assert again.returncode == 0 and "Skipping this job" in again.stdout + again.stderr


def test_a_run_directory_moved_elsewhere_resumes_and_checkpoints_into_last_ckpt(tmp_path):
    """A run directory resumed under another path (moved, copied to another machine, reached
    through a link) used to checkpoint into last-v1.ckpt beside the old last.ckpt, which the
    next resume then took: steps were lost. Its checkpoints now always overwrite last.ckpt."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    assert cli(*TINY_SWEEP, f"hydra.run.dir={first}").returncode == 0
    shutil.copytree(first, moved)
    (moved / "results.json").unlink()  # as if killed before its evaluation
    more = cli(*TINY_SWEEP, "trainer.max_steps=2", f"hydra.run.dir={moved}")
    assert more.returncode == 0, (more.stdout + more.stderr)[-3000:]
    assert [p.name for p in (moved / "checkpoints").iterdir()] == ["last.ckpt"]
    ckpt = torch.load(moved / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2


def test_resume_refuses_a_checkpoint_trained_with_other_settings(tmp_path, monkeypatch, caplog):
    out, results = train_in(tmp_path, ["trainer.max_steps=2"])
    assert isinstance(results, dict), results
    ckpt = f"train.resume={out / 'checkpoints' / 'last.ckpt'}"

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("grammarrl.training.train.load_model", no_model)
    refused = {
        ("lambda=1", "rollout.num_samples=2"): (
            "lambda=0.5 (now 1)",
            "rollout.num_samples=3 (now 2)",
        ),
        ("beta=0.1", "rollout.temperature=0.7"): (
            "beta=0.02 (now 0.1)",
            "rollout.temperature=1.0 (now 0.7)",
        ),
        ("rollout.length_penalty=0", "rollout.beam_width=2"): (
            "rollout.length_penalty=1.0 (now 0)",
            "rollout.beam_width=3 (now 2)",
        ),
        ("lora.r=8", "optim.lr=0.01", "task.num_fewshot=2", "data.split_seed=1"): (
            "lora.r=64 (now 8)",
            "optim.lr=0.001 (now 0.01)",
            "task.num_fewshot=10 (now 2)",
            "data.split_seed=0 (now 1)",
        ),
    }
    for overrides, named in refused.items():
        _, err = train_in(tmp_path, ["trainer.max_steps=3", ckpt, *overrides])
        assert isinstance(err, ConfigError) and str(err).startswith("train.resume="), err
        assert all(name in str(err) for name in named), err
    _, err = train_in(tmp_path, ["trainer.max_steps=1", ckpt])
    assert isinstance(err, ConfigError) and "trainer.max_steps=1 is below the 2 steps" in str(err)

    monkeypatch.undo()
    with caplog.at_level(logging.INFO):
        longer, extended = train_in(tmp_path, ["trainer.max_steps=3", ckpt])
    assert isinstance(extended, dict), extended
    assert "(2 steps done); changed since: trainer.max_steps=2 (now 3)" in caplog.text
    # its own directory, with the curves of the run it started from: steps 0, 1 and its own 2
    with open(longer / "metrics" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert longer != out
    assert [int(float(r["step"])) for r in rows if r.get("train/reward")] == [0, 1, 2]


def test_a_resumed_run_logs_each_step_at_its_own_number(tmp_path):
    """A validation at the last step before a resume used to shift every later training row of
    metrics.csv one step to the right (Lightning's restore adds one to its logging counter)."""
    validated = ["trainer.val_check_interval=2"]
    out, results = train_in(tmp_path, ["trainer.max_steps=2", *validated])
    assert isinstance(results, dict), results
    ckpt = f"train.resume={out / 'checkpoints' / 'last.ckpt'}"
    longer, extended = train_in(tmp_path, ["trainer.max_steps=4", ckpt, *validated])
    assert isinstance(extended, dict), extended
    with open(longer / "metrics" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(float(r["step"])) for r in rows if r.get("train/reward")] == [0, 1, 2, 3]


def test_a_run_killed_while_validating_retrains_that_step_and_validates_it(tmp_path, monkeypatch):
    """A step's checkpoint waits for the step's validation: written before it, a run killed
    while validating resumed past it (Lightning does not validate a restored step again) and
    lost that dev point and a dev-best at it. Now the resume retrains the step from the
    checkpoint before, to the same weights as a run never killed, and validates it."""
    validated = ["trainer.max_steps=3", "trainer.val_check_interval=2"]
    straight, _ = train_in(tmp_path, validated)
    validate = grammarrl.training.module.GrammarRLModule.on_validation_epoch_end

    def killed_at_step_2(self):
        if self.global_step == 2:
            raise RuntimeError("killed while validating")
        return validate(self)

    monkeypatch.setattr(
        grammarrl.training.module.GrammarRLModule, "on_validation_epoch_end", killed_at_step_2
    )
    with pytest.raises(RuntimeError, match="killed while validating"):
        train_in(tmp_path, validated)
    (killed,) = set((tmp_path / "outputs").glob("*/*")) - {straight}
    ckpt = killed / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 1  # step 2's waited
    monkeypatch.undo()

    resumed, results = train_in(tmp_path, [*validated, f"train.resume={ckpt}"])
    assert isinstance(results, dict), results
    rows = [json.loads(line) for line in (resumed / "validation.jsonl").read_text().splitlines()]
    validations = sorted({(r["step"], r["slice"]) for r in rows})
    assert validations == [(0, "dev"), (0, "train"), (2, "dev"), (2, "train")]
    assert json.loads((resumed / "best_dev.json").read_text())["step"] == 2
    weights = "adapter/adapter_model.safetensors"
    assert (resumed / weights).read_bytes() == (straight / weights).read_bytes()


def test_hub_model_out_of_reach_is_one_line_naming_model_path(tmp_path):
    offline = cli(
        "task=wos",
        "model=8b",
        "lambda=0.25",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    text = offline.stdout + offline.stderr
    assert offline.returncode == 2 and "Traceback" not in text, text[-3000:]
    (line,) = [line for line in text.splitlines() if "model.path" in line]
    assert "model.path=meta-llama/Llama-3.1-8B-Instruct" in line
    assert "hf auth login" in line and "HF_HUB_OFFLINE=1" in line


def test_hub_model_failing_to_load_is_one_line_naming_model_path(monkeypatch):
    import transformers

    from grammarrl.models.loading import load_tokenizer

    def unreachable(*args, **kwargs):
        raise OSError(
            "We couldn't connect to 'https://huggingface.co' to load the files.\n"
            "Check your internet connection."
        )

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    with pytest.raises(ModelError) as err:
        load_tokenizer(compose_config(["model=1b"]).model, "/nowhere")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "cannot load model.path=meta-llama/Llama-3.2-1B-Instruct: We couldn't connect"
    )
    assert "hf auth login" in message and "HF_HUB_OFFLINE=1" in message


def test_model_dir_without_a_model_says_what_it_lacks(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli(
        "mode=eval",
        "model=1b",
        f"model.path={empty}",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text[-3000:]
    assert (
        f"model.path={empty}: the directory lacks config.json, a tokenizer (tokenizer.json "
        "or tokenizer.model), weights (*.safetensors or pytorch_model*.bin)"
    ) in text
    from grammarrl.models.loading import check_model_source

    (empty / "config.json").write_text("{}")
    (empty / "model.safetensors").write_bytes(b"")
    with pytest.raises(
        ModelError,
        match=r"lacks a tokenizer \(tokenizer.json or tokenizer."
        r"model\); point model.path",
    ):
        check_model_source(compose_config(["model=1b", f"model.path={empty}"]).model)
    with pytest.raises(ModelError, match=r"model.path=/no/such/dir: no such directory"):
        check_model_source(compose_config(["model=1b", "model.path=/no/such/dir"]).model)


# ----- atomic writes under a full disk ---------------------------------------------------------
class FullDisk:
    """os.fdopen whose handles write a few bytes and then fail with ENOSPC."""

    def __init__(self, real):
        self.real = real

    def __call__(self, fd, *args, **kwargs):
        handle = self.real(fd, *args, **kwargs)
        real_write = handle.write

        def write(data):
            real_write(data[:5])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        handle.write = write
        return handle


def test_disk_full_while_writing_results_keeps_the_previous_results(tmp_path, monkeypatch):
    record = {
        "task": "conll",
        "model": "tiny",
        "decoding": "greedy",
        "metric": "micro_f1",
        "scores": [0.5],
        "mean": 0.5,
        "std": 0.0,
        "validity": 1.0,
        "truncated": 0.0,
        "examples_per_second": 1.0,
        "config": {},
    }
    path = write_results(tmp_path, record, [{"uid": "a"}])
    before = path.read_text(), (tmp_path / "predictions.jsonl").read_text()
    monkeypatch.setattr(os, "fdopen", FullDisk(os.fdopen))
    with pytest.raises(
        AtomicWriteError,
        match=r"No space left on device; the previous "
        r"predictions.jsonl is unchanged",
    ):
        write_results(tmp_path, {**record, "mean": 0.9}, [{"uid": "b"}])
    with pytest.raises(
        AtomicWriteError,
        match=r"results.json: No space left on device; the "
        r"previous results.json is unchanged",
    ):
        write_json(path, {**record, "mean": 0.9})
    monkeypatch.undo()
    assert (path.read_text(), (tmp_path / "predictions.jsonl").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl", "results.json"]


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def full(obj, handle):
        real_save(obj, handle)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(GrammarRLError, match="No space left on device; the previous checkpoint"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temp file left


# ----- bad input -------------------------------------------------------------------------------
def test_truncated_data_files_are_counted_skips_with_file_and_line(copy_samples, caplog):
    conll = copy_samples / "conll2003" / "test.txt"
    text = conll.read_text()
    conll.write_text(text[: len(text) // 2 + 7])  # cut in the middle of a token line
    wos = copy_samples / "wos" / "wos_labelled.jsonl"
    rows = wos.read_text()
    wos.write_text(rows[:-40])  # the last JSON row cut short
    with caplog.at_level(logging.WARNING):
        task = load_task(compose_config(["task=conll", f"data.dir={copy_samples}"]))
        assert task.splits().skipped["malformed_line"] == 1 and task.splits().test_pool
        wos_task = load_task(compose_config(["task=wos", f"data.dir={copy_samples}"]))
        assert wos_task.splits().skipped == {"malformed_json": 1}
    last = len(rows.splitlines())
    assert f"wos_labelled.jsonl:{last}: row skipped (malformed_json)" in caplog.text
    assert "test.txt:" in caplog.text and "row skipped (malformed_line)" in caplog.text


def test_unknown_config_keys_are_refused_with_their_name(tmp_path):
    typo = cli("lamda=0.3", "model=tiny", f"hydra.run.dir={tmp_path / 'typo'}")
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert "lamda: unknown config key (did you mean lambda?)" in typo.stderr
    added = cli("+optim.momentum=0.9", "model=tiny", f"hydra.run.dir={tmp_path / 'added'}")
    assert added.returncode == 2 and "Traceback" not in added.stderr
    assert "optim.momentum: unknown config key" in added.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "added").exists()  # no run dir


def test_empty_test_set_fails_before_training(copy_samples, tmp_path):
    (copy_samples / "conll2003" / "test.txt").write_text("")
    out, err = train_in(tmp_path, [f"data.dir={copy_samples}", "trainer.max_steps=1"])
    assert isinstance(err, DataError) and "the test pool is empty" in str(err)
    assert not (out / "checkpoints").exists()  # nothing was trained and lost


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    from grammarrl.training.callbacks import RUN_RECORD

    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    cfg = compose_config([])  # train.resume=auto
    AtomicCheckpointIO().save_checkpoint(
        {
            "global_step": 3,
            "state_dict": {},
            RUN_RECORD: {"config": config_dict(cfg), "sigmas": [1.0, 1.0]},
        },
        ckpt,
    )
    assert resume_of(cfg, tmp_path / "run").path == ckpt
    (ckpt.parent / ".last.ckpt.abc.tmp").write_bytes(b"half")  # a write cut by a kill
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"last.ckpt is corrupt or truncated .*delete it"):
        resume_of(cfg, tmp_path / "run")
    assert (ckpt.parent / ".last.ckpt.abc.tmp").exists()  # a check deletes nothing
    assert resume_of(compose_config(["train.resume=null"]), tmp_path / "run") is None


def test_a_checkpoint_recorded_before_the_diagnose_keys_resumes(tmp_path):
    """Keys training does not use (`rundir.MODE_UNUSED["train"]`: the diagnose group, added
    later) neither refuse a resume nor count as changes."""
    from grammarrl.training.callbacks import RUN_RECORD

    cfg = compose_config([])
    config = config_dict(cfg)
    del config["diagnose"]
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    AtomicCheckpointIO().save_checkpoint(
        {"global_step": 3, "state_dict": {}, RUN_RECORD: {"config": config, "sigmas": [1, 1]}},
        ckpt,
    )
    resumed = resume_of(cfg, tmp_path / "run")
    assert (resumed.path, resumed.step, resumed.changes) == (ckpt, 3, "")


def test_an_explicit_resume_is_where_a_run_starts_then_its_own_checkpoint_wins(tmp_path, caplog):
    """train.resume=PATH starts a new run directory from PATH; once that run has written its own
    last.ckpt, the same command continues from it instead of going back to PATH."""
    from grammarrl.training.callbacks import RUN_RECORD

    def checkpoint(path: Path, step: int) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"config": config_dict(cfg), "sigmas": [1.0, 1.0]}
        AtomicCheckpointIO().save_checkpoint(
            {"global_step": step, "state_dict": {}, RUN_RECORD: record}, path
        )
        return path

    cfg = compose_config(["trainer.max_steps=10"])
    start = checkpoint(tmp_path / "shorter" / "checkpoints" / "last.ckpt", 4)
    cfg = compose_config(["trainer.max_steps=10", f"train.resume={start}"])
    run = tmp_path / "longer"
    assert resume_of(cfg, run).step == 4  # a fresh directory starts from PATH
    own = checkpoint(run / "checkpoints" / "last.ckpt", 7)
    with caplog.at_level(logging.INFO):
        resumed = resume_of(cfg, run)
    assert (resumed.path, resumed.step) == (own, 7)
    assert "this run has its own checkpoint" in caplog.text


def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real_loss, calls = grammarrl.training.rloo_step.grammarrl_loss, []

    def loss_nan_at_third_step(*args, **kwargs):
        loss, parts = real_loss(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), parts

    monkeypatch.setattr(grammarrl.training.rloo_step, "grammarrl_loss", loss_nan_at_third_step)
    out, err = train_in(tmp_path, ["trainer.max_steps=4"])
    assert isinstance(err, NonFiniteLossError), err
    message = str(err)
    assert "the loss is nan at step 3 (global_step 2)" in message
    assert "no update was applied" in message and "(after 2 steps)" in message
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    assert not (out / "adapter").exists() and not (out / "results.json").exists()

    # A checkpoint of another base model size is refused, naming the setting that differs.
    monkeypatch.undo()
    _, mismatch = train_in(
        tmp_path,
        [
            "trainer.max_steps=4",
            "model.hidden_size=32",
            f"train.resume={out / 'checkpoints' / 'last.ckpt'}",
        ],
    )
    assert isinstance(mismatch, ConfigError), mismatch
    assert "model.hidden_size=64 (now 32)" in str(mismatch)


def test_truncated_candidates_are_flagged_not_fatal(tmp_path):
    out, results = train_in(tmp_path, ["trainer.max_steps=2", "task.max_new_tokens=2"])
    assert isinstance(results, dict), results
    with open(out / "metrics" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["train/truncated"]) for r in rows if r.get("train/truncated")] == [1.0, 1.0]
    assert [float(r["train/validity"]) for r in rows if r.get("train/validity")] == [0.0, 0.0]
    greedy = json.loads((out / "results.json").read_text())
    assert greedy["truncated"] == 1.0 and greedy["validity"] == 0.0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert preds and all(p["truncated"] and not p["valid"] for p in preds)


def test_grammar_rejecting_gold_outputs_is_warned_with_counts(tiny, tmp_path, caplog):
    from grammarrl.evaluation.evaluate import evaluate
    from grammarrl.evaluation.settings import EvalSettings

    model, tok = tiny
    cfg = compose_config(
        [
            "model=tiny",
            "task=conll",
            "data.dir=null",
            "task.max_new_tokens=40",
            "eval.num_test_sets=1",
            "eval.test_size=4",
        ]
    )
    task = load_task(cfg)
    empty = '{"person": "", "organization": "", "location": "", "misc": ""}'
    task.grammar = lambda: "start: " + json.dumps(empty)  # admits only the empty output
    with caplog.at_level(logging.WARNING):
        results = evaluate(
            EvalSettings.from_config(cfg), model, tok, task, "greedy", tmp_path, progress=False
        )
    # Every CoNLL gold output names an entity (entityless rows are dropped): all 4 rejected.
    assert "the conll grammar rejects 4 of 4 distinct gold outputs" in caplog.text
    assert (results["gold_rejected"], results["gold_total"]) == (4, 4)
    assert results["validity"] == 1.0


def test_corrupt_adapter_is_a_clear_error(tmp_path, cache_dir):
    from grammarrl.evaluation.evaluate import run_eval
    from grammarrl.models.loading import add_lora, load_model

    cfg = compose_config(["model=tiny", "mode=eval", "data.dir=null"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    add_lora(model, cfg.lora).save_pretrained(tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    cfg = compose_config(
        [
            "model=tiny",
            "mode=eval",
            "data.dir=null",
            "device=cpu",
            f"eval.adapter={tmp_path / 'adapter'}",
        ]
    )
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ModelError, match=r"the adapter weights cannot be read"):
            run_eval(cfg)
    finally:
        os.chdir(previous)


def test_a_job_is_validated_once_and_finds_its_checkpoint_once_changing_nothing(
    tmp_path, monkeypatch
):
    """One job through the command line: `validate` runs once (the pre-Hydra check's config is
    the job's), the pre-flight check finds the checkpoint and hands it to run_train, and it
    deletes nothing (a write cut by a kill is cleared by run_train, not by a check)."""
    import runpy

    from hydra.core.hydra_config import HydraConfig

    import grammarrl.job
    import grammarrl.training.resume
    import grammarrl.training.train
    from grammarrl.job import compose_job_config
    from grammarrl.training.callbacks import RUN_RECORD

    run = tmp_path / "run"
    overrides = [*TINY_TRAIN, "trainer.max_steps=5", f"hydra.run.dir={run}"]
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    record = {"config": config_dict(compose_job_config(overrides)), "sigmas": [1.0, 1.0]}
    AtomicCheckpointIO().save_checkpoint(
        {"global_step": 3, "state_dict": {}, RUN_RECORD: record}, ckpt
    )
    cut = ckpt.parent / ".last.ckpt.abc.tmp"
    cut.write_bytes(b"half")

    calls: dict[str, list] = {"validate": [], "resolve_resume": [], "run_train": []}

    def counted(name: str, real):
        def call(*args, **kwargs):
            calls[name].append(kwargs)
            return real(*args, **kwargs)

        return call

    def run_train(cfg, **kwargs):
        calls["run_train"].append({**kwargs, "cut write kept": cut.exists()})
        return {}

    real_validate, real_resolve = grammarrl.job.validate, grammarrl.training.resume.resolve_resume
    monkeypatch.setattr(grammarrl.job, "validate", counted("validate", real_validate))
    monkeypatch.setattr(
        grammarrl.training.resume, "resolve_resume", counted("resolve_resume", real_resolve)
    )
    monkeypatch.setattr(grammarrl.training.train, "run_train", run_train)
    logging_off = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["grammarrl.run", *overrides, *logging_off])
    try:
        runpy.run_module("grammarrl.run", run_name="__main__")  # python -m grammarrl.run
    finally:
        HydraConfig.instance().cfg = None  # later tests run outside Hydra
    assert len(calls["validate"]) == 1 and len(calls["resolve_resume"]) == 1
    [job] = calls["run_train"]
    assert job["resume"].path == ckpt and job["resume"].step == 3 and job["cut write kept"]


OLDEST_RECORDS = (  # the oldest committed run records (2026-11-24), one per mode they hold
    "experiments/results/smollm2-cpu-2/runs/baselines/0_baseline_greedy/job.json",
    "experiments/results/smollm2-cpu-2/runs/train/0_lambda=0.5,rollout.num_samples=3/job.json",
)


@pytest.mark.parametrize("record", OLDEST_RECORDS)
def test_every_key_added_since_the_oldest_records_says_what_they_ran_with(record):
    """A key added to the schema after a run was recorded is absent from its record, and a
    missing key compares as null: unless the key declares `recorded_default` (what the run ran
    with), every existing run directory whose mode compares it would conflict. Composed today
    from the record's own overrides, no key the mode compares may be missing from the migrated
    record (`current_names`) with a non-null value; the key is named."""
    import yaml

    from grammarrl.runs.rundir import BOOKKEEPING, MODE_UNUSED, current_names, flatten

    stored = json.loads((Path(__file__).resolve().parents[1] / record).read_text())
    old = flatten(current_names(stored["config"]))
    overrides = yaml.safe_load(stored["hydra_files"]["overrides.yaml"])
    new = flatten(config_dict(compose_config(overrides)))
    ignored = (*BOOKKEEPING, *MODE_UNUSED[stored["mode"]])
    missing = sorted(
        k
        for k, value in new.items()
        if k not in old
        and value is not None
        and not any(k == p or k.startswith(p + ".") for p in ignored)
    )
    assert not missing, (
        f"declare recorded_default for {', '.join(missing)} (added since {record} was recorded)"
    )
