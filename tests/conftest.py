"""Shared fixtures: the `tiny` model config, model and tokenizer; real-data location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the project's Hydra config with overrides (as the CLI would)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [], return_hydra_config=False)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The model cache shared across tests (SmolLM2 is dequantised into it once)."""
    path = Path(os.environ.get("GRAMMARRL_CACHE_DIR", Path.home() / ".cache" / "grammarrl"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny(cache_dir):
    """(model, tokenizer) for the randomly initialised `tiny` Llama on CPU."""
    from grammarrl.models import load_model

    cfg = compose_config(["model=tiny"])
    return load_model(cfg.model, cache_dir, device="cpu")


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real data directory (GRAMMARRL_DATA_DIR), or skip with a visible reason."""
    value = os.environ.get("GRAMMARRL_DATA_DIR")
    if not value or not Path(value).is_dir():
        pytest.skip("real data not found: set GRAMMARRL_DATA_DIR (CI sets it to ../shared/data)")
    return Path(value)
