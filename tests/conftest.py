"""Shared fixtures: the `tiny` model config, model and tokenizer; real-data location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from grammarrl.tasks import builtin_task_names

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per pytest-xdist worker (`make test` runs two on two cores): two workers with two
    # torch threads each slow each other several-fold. Jobs the tests start inherit it.
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
BUILTIN_TASKS = builtin_task_names()  # every conf/task/*.yaml but custom: tests cover each


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the project's Hydra config with overrides (as the CLI would)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [], return_hydra_config=False)


REPO = Path(__file__).resolve().parents[1]
# Tests read the small bundled samples (`data.dir` null), the same with or without the real data
# (the real CoNLL pool costs minutes of hint embedding per fresh cache), and so do the jobs they
# start; tests marked `slow` get the real data back, and take it from `real_data_dir`. The value
# moves to a variable of the tests' own, which pytest-xdist's workers (started after this module
# is imported here) inherit.
_KEPT = "GRAMMARRL_TESTS_REAL_DATA_DIR"
os.environ.setdefault(_KEPT, os.environ.pop("GRAMMARRL_DATA_DIR", ""))
REAL_DATA_DIR = os.environ[_KEPT] or None


@pytest.fixture(autouse=True)
def real_data_only_when_slow(request, monkeypatch):
    if REAL_DATA_DIR and request.node.get_closest_marker("slow") is not None:
        monkeypatch.setenv("GRAMMARRL_DATA_DIR", REAL_DATA_DIR)


RUN_FOLDERS = ("outputs", "multirun")  # where Hydra writes runs by default, relative to the cwd


def _run_folders() -> set[Path]:
    return {p for name in RUN_FOLDERS if (REPO / name).is_dir() for p in (REPO / name).iterdir()}


@pytest.fixture(autouse=True)
def writes_no_run_folders_into_the_repository():
    """Tests write only under their temporary directories: a run folder a test leaves in the
    repository's outputs/ or multirun/ would be listed by the aggregator as a failed run."""
    before = _run_folders()
    yield
    added = sorted(map(str, _run_folders() - before))
    assert not added, f"the test wrote run folders into the repository: {added}"


@pytest.fixture(scope="module")
def sample_tasks() -> dict:
    """Every built-in task on its bundled samples (`data.dir=null`), by name."""
    from grammarrl.tasks import load_task

    return {
        name: load_task(compose_config([f"task={name}", "data.dir=null"])) for name in BUILTIN_TASKS
    }


@pytest.fixture(scope="module")
def model(tiny):
    """The `tiny` model alone."""
    return tiny[0]


@pytest.fixture(scope="module")
def tok(tiny):
    """The `tiny` model's tokenizer (SmolLM2's)."""
    return tiny[1]


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    """Three chat prompts of different lengths, encoded."""
    from grammarrl.models.chat import encode_prompt
    from tests.support.decoding import MESSAGES

    return [encode_prompt(tok, [{"role": "user", "content": m}]) for m in MESSAGES]


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The model cache shared across tests (SmolLM2 is dequantised into it once)."""
    path = Path(compose_config().cache_dir)  # conf/config.yaml's default, GRAMMARRL_CACHE_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny(cache_dir):
    """(model, tokenizer) for the randomly initialised `tiny` Llama on CPU."""
    from grammarrl.models.loading import load_model

    cfg = compose_config(["model=tiny"])
    return load_model(cfg.model, cache_dir, device="cpu")


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real data directory (GRAMMARRL_DATA_DIR), or skip with a visible reason."""
    value = REAL_DATA_DIR
    if not value or not Path(value).is_dir():
        pytest.skip("real data not found: set GRAMMARRL_DATA_DIR (CI sets it to ../shared/data)")
    return Path(value)


def train_in(work: Path, cfg: DictConfig):
    """`run_train(cfg)` with `work` as the working directory (the run dir goes under
    work/outputs): (run dir, results)."""
    from grammarrl.training.train import run_train

    previous = os.getcwd()
    os.chdir(work)
    try:
        results = run_train(cfg)
    finally:
        os.chdir(previous)
    (out,) = (work / "outputs").glob("*/*")
    return out, results


@pytest.fixture(scope="session")
def read_wandb_offline():
    """A reader of an offline W&B run as W&B wrote it: `read(run_dir)` -> dict with `run` (the
    run record: tags, group, job type), `config`, `summary` (merged updates), `history` (one
    dict per logged step) and `tables` (name -> parsed table JSON under files/media/table)."""
    return _read_wandb_offline


def _read_wandb_offline(run_dir: Path) -> dict:
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    # LevelDB log format after a 7-byte header: 32 KiB blocks of chunks (crc, length, type).
    block, pos, pending, found = 32768, 7, b"", {"history": [], "summary": {}, "config": {}}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL chunk, or the LAST of a FIRST/MIDDLE/LAST sequence
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            _collect(record, found)
    tables = Path(run_dir) / "files" / "media" / "table"
    found["tables"] = {
        p.name.rsplit("_", 2)[0]: json.loads(p.read_text()) for p in tables.glob("*.table.json")
    }
    return found


def _collect(record, found: dict) -> None:
    import json

    def items(updates) -> dict:
        return {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in updates}

    kind = record.WhichOneof("record_type")
    if kind == "run":
        found["run"] = record.run
        found["config"].update(items(record.run.config.update))
    elif kind == "config":
        found["config"].update(items(record.config.update))
    elif kind == "history":
        found["history"].append(items(record.history.item))
    elif kind == "summary":
        found["summary"].update(items(record.summary.update))
