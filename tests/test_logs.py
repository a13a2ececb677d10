"""Job console hygiene: known third-party noise is dropped by its text, nothing else."""

from __future__ import annotations

import logging
import warnings

import pytest

from grammarrl.runs.logs import quiet_third_party


def test_known_noise_is_dropped_and_other_messages_kept(caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("Found 397 module(s) in eval mode at the start of training.", UserWarning)
        warnings.warn(
            "Experiment logs directory /runs/a/metrics exists and is not empty. Previous log files"
            " in this directory will be deleted when the new ones are saved!",
            UserWarning,
        )
        warnings.warn("a library warning we do not know", FutureWarning)
        warnings.warn("our own warning", UserWarning)
    assert [str(w.message) for w in caught] == [
        "a library warning we do not know",
        "our own warning",
    ]
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO):
        rank_zero.info("💡 Tip: For seamless cloud logging, try installing X")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("a Lightning message we do not know")
        logging.getLogger("grammarrl").warning("our warning")
    assert [r.getMessage() for r in caplog.records] == [
        "a Lightning message we do not know",
        "our warning",
    ]


def test_lightning_console_handler_removed_when_the_root_logs(monkeypatch):
    lightning = logging.getLogger("lightning.pytorch")
    extra = logging.StreamHandler()
    monkeypatch.setattr(lightning, "handlers", [extra])
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])
    quiet_third_party()
    assert extra not in lightning.handlers  # records still reach the root's handlers


@pytest.mark.integration
def test_a_training_job_console_shows_each_message_once_and_counts_steps(tmp_path):
    """What a user sees from `python -m grammarrl.run` (the bundled samples, no data dir)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            "+experiment=tiny_scale",
            "trainer.max_steps=3",
            "eval.num_test_sets=1",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=Path(__file__).resolve().parents[1],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    console = (done.stdout + done.stderr).replace("\r", "\n")
    assert done.returncode == 0, console[-3000:]
    assert console.count("val_check_interval=1") == 1  # not once per Lightning handler
    assert "GPU available" not in console and "Seed set to" not in console  # noise dropped
    assert "Loading weights" not in console and "wandb:" not in console
    assert console.count("No data directory set") == 1  # said once, where the data comes from
    assert "train: 100%" in console and "3/3" in console  # steps of trainer.max_steps
    assert "Epoch 0" not in console and "v_num" not in console
    assert "validate dev" in console and "validate train" in console
    assert "`weights_only` was not set" not in console
