"""Config composition and validation: bad values fail before any model is loaded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grammarrl.errors import ConfigError
from grammarrl.job import compose_job_config, validate
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]


def test_default_config_is_valid_and_has_paper_defaults():
    cfg = compose_config()
    validate(cfg)
    assert cfg.mode == "train" and cfg["lambda"] == 0.5 and cfg.beta == 0.02
    assert cfg.rollout.num_samples == 3 and cfg.rollout.beam_width == 3
    assert cfg.lora.r == 64 and cfg.lora.alpha == 128 and cfg.lora.dropout == 0.05


@pytest.mark.parametrize(
    "task, lr, batch, new_tokens",
    [("gloss", 3.3e-7, 4, 350), ("wos", 7e-7, 8, 128), ("conll", 7e-7, 8, 128)],
)
def test_per_task_paper_defaults(task, lr, batch, new_tokens):
    cfg = compose_config([f"task={task}"])
    assert cfg.optim.lr == pytest.approx(lr)
    assert cfg.optim.batch_size == batch
    assert cfg.task.max_new_tokens == new_tokens
    assert cfg.trainer.max_steps == 1000


def test_paper_sigma_table_is_in_config():
    cfg = compose_config(["task=conll"])
    assert list(cfg.task.sigmas["1b"]["n3_b3"]) == [0.8047, 0.2766]
    assert list(compose_config(["task=wos"]).task.sigmas["8b"]["n3_b3"]) == [0.1353, 0.0140]


@pytest.mark.parametrize(
    "override, key",
    [
        ("lambda=1.5", "lambda"),
        ("lambda=-0.1", "lambda"),
        ("rollout.num_samples=0", "rollout.num_samples"),
        ("rollout.beam_width=0", "rollout.beam_width"),
        ("mode=fly", "mode"),
        ("eval.decoding=nucleus", "eval.decoding"),
        ("beta=-1", "beta"),
        ("task.name=pos", "task"),
        ("eval.test_set_drawing=random", "eval.test_set_drawing"),
        ("eval.sampler_seeds=[]", "eval.sampler_seeds"),
        ("eval.sampler_seeds=[1,1]", "eval.sampler_seeds"),
        ("eval.sampler_seeds=3", "eval.sampler_seeds"),
        ("trainer.val_check_interval=0", "trainer.val_check_interval"),
        ("trainer.val_check_interval=0.5", "trainer.val_check_interval"),  # steps, not epochs
        ("trainer.val_check_interval=null", "trainer.val_check_interval"),
        ("data.limit_train=0", "data.limit_train"),  # was "no limit"
        ("data.limit_train=-2", "data.limit_train"),
        ("task.train_size=0", "task.train_size"),
    ],
)
def test_bad_values_name_their_key(override, key):
    cfg = compose_config([override])
    with pytest.raises(ConfigError, match=rf"^{key}"):
        validate(cfg)


def test_validation_every_k_steps_and_a_training_limit_are_accepted():
    validate(compose_config(["trainer.val_check_interval=1", "data.limit_train=1"]))
    epochs = ["trainer.check_val_every_n_epoch=1", "trainer.val_check_interval=0.5"]
    validate(compose_config(epochs))  # Lightning's fraction of an epoch, where epochs count


def test_every_trainer_argument_lightning_takes_is_accepted():
    """conf/trainer/default.yaml says any key there is a Trainer argument: every argument of
    lightning.pytorch.Trainer's signature may be added, but those GrammarRL sets itself."""
    import inspect
    from dataclasses import fields

    from lightning.pytorch import Trainer

    from grammarrl.config.schema import TRAINER_SET, TrainerSchema

    configured = {f.name for f in fields(TrainerSchema)}
    refused = {*TRAINER_SET, "callbacks"}
    added = set(inspect.signature(Trainer).parameters) - configured - refused
    assert {"precision", "max_epochs", "deterministic"} <= added
    for name in sorted(added):
        validate(compose_config([f"+trainer.{name}=null"]))
    validate(compose_config(["+trainer.precision=bf16-mixed"]))


@pytest.mark.parametrize(
    "override, message",
    [
        ("+trainer.precison=bf16-mixed", "unknown config key (did you mean trainer.precision?)"),
        ("+trainer.logger=false", "GrammarRL sets this Trainer argument itself; use logger="),
        ("+trainer.default_root_dir=/x", "itself; use hydra.run.dir"),
        ("+trainer.plugins=[]", "itself; use trainer.precision"),
        ("+trainer.enable_checkpointing=false", "itself; use train.checkpoint_every_n_steps"),
        ("+trainer.callbacks=[]", "itself; use callbacks (the top-level group"),
    ],
)
def test_trainer_arguments_grammarrl_sets_or_misspelt_are_refused(override, message):
    key = override.removeprefix("+").split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: .*{re.escape(message)}"):
        validate(compose_config([override]))


def test_added_trainer_arguments_reach_the_trainer(tmp_path):
    from grammarrl.runs.progress import StepProgressBar
    from grammarrl.training.callbacks import BestDevAdapter
    from grammarrl.training.train import build_trainer

    added = ["+trainer.precision=bf16-mixed", "+trainer.enable_progress_bar=false"]
    cfg = compose_config(["logger=none", "device=cpu", *added])
    validate(cfg)
    trainer = build_trainer(
        cfg.trainer,
        cfg.callbacks,
        tmp_path,
        [BestDevAdapter(tmp_path, "f1")],
        device=cfg.device,
        checkpoint_every=cfg.train.checkpoint_every_n_steps,
        loggers=[],
    )
    assert trainer.precision == "bf16-mixed"
    assert not any(isinstance(c, StepProgressBar) for c in trainer.callbacks)


def test_the_cache_directory_default_is_written_once():
    """conf/config.yaml gives cache_dir its default (GRAMMARRL_CACHE_DIR, else
    ~/.cache/grammarrl); code and tests read `cfg.cache_dir` instead of writing it again."""
    written = '".cache"'
    sources = [*ROOT.glob("grammarrl/**/*.py"), *ROOT.glob("tests/**/*.py")]
    again = [
        p.relative_to(ROOT) for p in sources if p != Path(__file__) and written in p.read_text()
    ]
    assert again == []
    assert compose_config().cache_dir.endswith("/.cache/grammarrl") or os.environ.get(
        "GRAMMARRL_CACHE_DIR"
    )


def test_wrong_type_names_key():
    cfg = compose_config(["rollout.num_samples=abc"])
    with pytest.raises(ConfigError, match="rollout.num_samples"):
        validate(cfg)


def test_model_ids():
    expected = {
        "1b": "meta-llama/Llama-3.2-1B-Instruct",
        "3b": "meta-llama/Llama-3.2-3B-Instruct",
        "8b": "meta-llama/Llama-3.1-8B-Instruct",
    }
    for name, hub_id in expected.items():
        assert compose_config([f"model={name}"]).model.path == hub_id


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grammarrl.run", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_composed_config():
    out = _cli("--cfg", "job", "task=wos", "model=8b", "lambda=0.25")
    assert out.returncode == 0, out.stderr
    assert "lambda: 0.25" in out.stdout
    assert "meta-llama/Llama-3.1-8B-Instruct" in out.stdout


def test_cli_bad_lambda_exits_nonzero_naming_lambda():
    out = _cli("lambda=1.5", "model=1b")  # a hub model: must fail before any download attempt
    assert out.returncode != 0
    assert "lambda" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_cli_unknown_model_is_refused_in_one_line():
    out = _cli("model=70b")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "error: model=70b is invalid: expected one of 1b, 3b, 8b, smollm2, tiny\n"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["logger.mode=loud"], "logger.mode"),
        (["logger.mode=online"], "logger.mode"),  # no W&B credentials here
        (["device=cpu", "trainer.accelerator=gpu"], "trainer.accelerator"),
        (["train.resume=/nonexistent.ckpt"], "train.resume"),
        (["+nonsense=1"], "nonsense"),
        (["+optim.maxsteps=1"], "optim.maxsteps"),
        (["eval.adapter=/some/adapter"], "eval.adapter"),  # mode=train evaluates its own
        (["trainer.val_check_interval=0"], "trainer.val_check_interval"),
        (["data.limit_train=0"], "data.limit_train"),
        (["data.source=hubb"], "data.source"),
        (["model.dtype=float33"], "model.dtype"),
        (["task=wos", "task.test_fraction=1.5"], "task.test_fraction"),
        (["task.num_hints=-3"], "task.num_hints"),
        (["trainer.devices=0"], "trainer.devices"),
        (["+trainer.accumulate_grad_batches=4"], "trainer.accumulate_grad_batches"),
    ],
)
def test_bad_values_are_refused_before_any_model_loads(overrides, key, tmp_path, monkeypatch):
    from grammarrl.run import dispatch

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))

    def loaded(*args, **kwargs):
        raise AssertionError("data or a model was loaded before the config was refused")

    monkeypatch.setattr("grammarrl.tasks.load_task", loaded)
    monkeypatch.setattr("grammarrl.models.loading.load_model", loaded)
    with pytest.raises(ConfigError) as err:
        dispatch(compose_config(["model=tiny", "logger=wandb", *overrides]))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--cfg", "job", "+optim.maxsteps=1"],
            "optim.maxsteps: unknown config key (did you mean task.max_steps or trainer.max_steps?)",
        ),
        (["optim.max_steps=2"], "optim.max_steps: this key is now trainer.max_steps"),
        (["+nonsense=1"], "nonsense: unknown config key (no known key is close"),
        (["+lamda=0.3"], "lamda: unknown config key (did you mean lambda?)"),
        (
            ["mode=search", "search.adapter=/x"],
            "search.adapter: unknown config key (did you mean eval.adapter?)",
        ),
        (["logger.mode=loud"], "logger.mode='loud' is invalid: expected one of offline, online"),
    ],
)
def test_cli_refuses_unknown_keys_and_bad_values_in_one_line(args, line):
    out = _cli(*args, "model=tiny")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [out.stderr.strip()]  # one line, no traceback
    assert out.stderr.startswith(f"error: {line}")


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["task=conll", "task.test_fraction=0.2"],
            "task.test_fraction: applies to task=custom or task=wos only",
        ),
        (["task=gloss", "task.train=x.jsonl"], "task.train: applies to task=custom only"),
        (["logger=none", "logger.project=p"], "logger.project: applies to logger=wandb only"),
        (
            ["trainer.precision=bf16-mixed"],
            "trainer.precision: conf/ does not set it; add it with +trainer.precision=...",
        ),
    ],
)
def test_a_known_key_this_config_lacks_says_where_it_applies(overrides, line):
    """Not "unknown config key (did you mean <the same key>?)"."""
    with pytest.raises(ConfigError) as err:
        compose_job_config(overrides)
    assert str(err.value) == line


def test_gradient_accumulation_is_refused_naming_the_batch_size_instead():
    """The step-indexed sampler gives each optimizer step one batch: accumulating several would
    replay batches, and a resume would start at the wrong one."""
    validate(compose_config(["+trainer.accumulate_grad_batches=1"]))
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["+trainer.accumulate_grad_batches=4"]))
    message = str(err.value)
    assert message.startswith("trainer.accumulate_grad_batches=4 is invalid: expected 1")
    assert "optim.batch_size" in message and "\n" not in message


def test_hydra_and_experiment_keys_still_compose():
    out = _cli("--cfg", "job", "+experiment=tiny_scale", "hydra.run.dir=/tmp/somewhere")
    assert out.returncode == 0, out.stderr
    assert "name: tiny" in out.stdout


def test_one_sigma_set_by_hand_alone_is_refused():
    """lookup_sigmas uses hand-set σ's only as a pair: one alone would be ignored silently."""
    with pytest.raises(ConfigError, match=r"reward\.sigma_reverse is set alone: set both"):
        validate(compose_config(["reward.sigma_reverse=0.2"]))
    validate(compose_config(["reward.sigma_direct=0.7", "reward.sigma_reverse=0.2"]))
