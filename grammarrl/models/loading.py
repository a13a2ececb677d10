"""Model loading: hub ids or local paths, the embedded SmolLM2, the `tiny` test model, LoRA.

The embedded SmolLM2's GGUF is located and converted once in `grammarrl.models.cache`.

The reference model pi_ref is the policy with its LoRA adapter disabled (`reference_mode`),
so one copy of the weights serves both.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from grammarrl.errors import ModelError
from grammarrl.models.cache import SMOLLM2_GGUF, smollm2_cache, smollm2_gguf_path

log = logging.getLogger(__name__)


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` picks CUDA when available, else CPU."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device={spec} was requested but CUDA is not available; use device=cpu")
    return device


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
STEADY_MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value
# Inference only (mode=diagnose): blocks up to 64 MiB from the heap, reused without page faults;
# on SmolLM2 ~10% less CPU than the steady threshold (no backward pass to fragment the heap).
INFERENCE_MMAP_THRESHOLD = 64 * 1024 * 1024


@functools.cache
def steady_cpu_allocator(threshold: int = STEADY_MMAP_THRESHOLD) -> bool:
    """Keep glibc's mmap threshold at its starting 128 KiB for this process (as
    MALLOC_MMAP_THRESHOLD_ does, which wins when set). glibc raises the threshold (up to 32 MiB)
    each time a large block is freed, so from the second RL step on the activations come from
    the heap, where freed blocks fragment and stay resident: on SmolLM2 (CoNLL, 10-shot, 2
    steps) the peak RSS was 5.6 GiB with glibc's default and 3.2 GiB with the threshold kept
    (`python -m benchmarks.rl_step`). Another `threshold` sets that one instead. Returns whether
    it was applied (Linux glibc only)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl)
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX): there bf16 weights
    roughly halve the time of a forward or backward pass; elsewhere it is emulated and slow."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA and on CPUs with native bf16, float32 on other CPUs."""
    if spec == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if native else torch.float32
    try:
        dtype = getattr(torch, spec)
    except AttributeError:
        raise ModelError(f"model.dtype={spec!r} is not a torch dtype") from None
    if not isinstance(dtype, torch.dtype):
        raise ModelError(f"model.dtype={spec!r} is not a torch dtype")
    return dtype


def load_tokenizer(model_cfg: DictConfig, cache_dir: str | Path) -> Any:
    """The tokenizer of a model config (`tiny` uses SmolLM2's)."""
    from transformers import AutoTokenizer

    path = _weights_path(model_cfg, Path(cache_dir))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:  # hub unreachable, gated, or no usable tokenizer files
        raise hub_error(path, err) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


HUB_HELP = (
    "log in with `hf auth login` and accept the model's licence on the hub, or set "
    "model.path to a local model directory; for offline use, HF_HUB_OFFLINE=1 with the "
    "model already in the Hugging Face cache"
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def hub_error(path: str, err: Exception) -> ModelError:
    """One line for a model that transformers could not load from `model.path`."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return ModelError(
        f"cannot load model.path={path}: {first[:300]} ({type(err).__name__}); {HUB_HELP}"
    )


def missing_model_files(directory: Path) -> list[str]:
    """What a local model directory lacks for transformers: config, tokenizer, weights."""
    missing = []
    if not (directory / "config.json").is_file():
        missing.append("config.json")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_FILES):
        missing.append(f"weights ({' or '.join(WEIGHT_FILES)})")
    return missing


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (`org/name`)."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def check_model_source(model_cfg: DictConfig) -> None:
    """Before anything is loaded: the model's files can be found. A local `model.path` must be a
    model directory, a hub id must be in the local cache when the hub is offline, and the
    embedded GGUF (SmolLM2, and the tokenizer of `tiny`) must be installed."""
    if model_cfg.source in ("embedded", "tiny"):
        smollm2_gguf_path(model_cfg.path if model_cfg.source == "embedded" else SMOLLM2_GGUF)
        return
    path = str(model_cfg.path)
    local = Path(path).expanduser()
    if local.is_dir():
        missing = missing_model_files(local)
        if missing:
            raise ModelError(
                f"model.path={path}: the directory lacks {', '.join(missing)}; point model.path "
                "at a Hugging Face model directory (e.g. one written by `hf download "
                "meta-llama/Llama-3.2-1B-Instruct --local-dir DIR`)"
            )
    elif _looks_local(path) or local.exists():
        raise ModelError(
            f"model.path={path}: no such directory (a local model directory or a "
            "hub id such as meta-llama/Llama-3.2-1B-Instruct)"
        )
    elif _hub_offline() and not _in_hub_cache(path):
        raise ModelError(
            f"model.path={path}: not in the Hugging Face cache and the hub is "
            f"offline (HF_HUB_OFFLINE=1); {HUB_HELP}"
        )


def _weights_path(model_cfg: DictConfig, cache_dir: Path) -> str:
    """A directory or hub id that transformers can load (the embedded GGUF is cached first)."""
    source = model_cfg.source
    if source in ("embedded", "tiny"):
        relative = model_cfg.path if source == "embedded" else SMOLLM2_GGUF
        return str(smollm2_cache(cache_dir, smollm2_gguf_path(relative)))
    if source == "hub":
        return str(model_cfg.path)
    raise ModelError(f"model.source={source!r} is not one of hub, embedded, tiny")


def build_tiny(model_cfg: DictConfig, vocab_size: int) -> torch.nn.Module:
    """A randomly initialised small Llama (seeded) for tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(model_cfg.init_seed)
        return LlamaForCausalLM(config)


def load_model(
    model_cfg: DictConfig, cache_dir: str | Path, device: str = "auto"
) -> tuple[torch.nn.Module, Any]:
    """Load (model, tokenizer) for a `model` config group, on the right device and dtype.
    The global random state is left as it was: a cold cache converts the weights, which draws
    random numbers, and a run must not depend on the state of the cache."""
    from lightning.pytorch.utilities.seed import isolate_rng
    from transformers import AutoModelForCausalLM

    with isolate_rng():
        device_ = resolve_device(device)
        dtype = resolve_dtype(model_cfg.dtype, device_)
        if device_.type == "cpu":
            steady_cpu_allocator()
        tokenizer = load_tokenizer(model_cfg, cache_dir)
        if model_cfg.source == "tiny":
            model = build_tiny(model_cfg, vocab_size=len(tokenizer)).to(dtype)
        else:
            path = _weights_path(model_cfg, Path(cache_dir))
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except OSError as err:
                raise hub_error(path, err) from err
        if dtype in (torch.bfloat16, torch.float16):
            float32_head(model)
        model.to(device_)
        model.eval()
        log.info(
            "model %s: %s on %s%s",
            model_cfg.name,
            str(dtype).removeprefix("torch."),
            device_,
            " (model.dtype=auto)" if model_cfg.dtype == "auto" else "",
        )
    return model, tokenizer


def float32_head(model: torch.nn.Module) -> None:
    """Compute the logits in float32 under half-precision weights: a float32 copy of the output
    projection (untied from the embeddings, frozen) fed the float32-cast final hidden state.
    Logits rounded to bfloat16 shift token log-probs by up to ~0.06; on 100 SmolLM2 CoNLL test
    examples, greedy outputs agreed with float32 in 92 with this head and 87 without it
    (experiments/results/precision-bf16.md)."""
    head = model.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return
    full = torch.nn.Linear(
        head.in_features,
        head.out_features,
        bias=head.bias is not None,
        device=head.weight.device,
        dtype=torch.float32,
    )
    with torch.no_grad():
        full.weight.copy_(head.weight.float())
        if head.bias is not None:
            full.bias.copy_(head.bias.float())
    full.requires_grad_(False)
    full.register_forward_pre_hook(lambda module, args: (args[0].float(), *args[1:]))
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(full)


def add_lora(model: torch.nn.Module, lora_cfg: DictConfig) -> torch.nn.Module:
    """Wrap a model with a fresh PEFT LoRA adapter (the base weights stay frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(OmegaConf.to_container(lora_cfg.target_modules)),
        task_type="CAUSAL_LM",
    )
    with peft_deprecations_quiet():
        return get_peft_model(model, config)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward (non-reentrant), under the name this Transformers
    version uses (`activation_checkpointing_enable`; `gradient_checkpointing_enable` before)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def peft_deprecations_quiet() -> Iterator[None]:
    """PEFT calls Transformers' deprecated `is_gradient_checkpointing` when it wraps a model:
    a FutureWarning users cannot act on, silenced here only."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # PEFT's file names


def check_adapter_dir(adapter_dir: str | Path, key: str = "eval.adapter") -> Path:
    """The directory of a saved PEFT adapter (config `key`); ModelError when it is not one."""
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ModelError(f"{key}={adapter_dir}: no adapter_config.json there")
    if not any((adapter_dir / name).is_file() for name in ADAPTER_WEIGHTS):
        raise ModelError(
            f"{key}={adapter_dir}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)}) there; "
            f"the adapters committed under experiments/results/ are restored by `make adapters`"
        )
    return adapter_dir


def load_adapter(
    model: torch.nn.Module,
    adapter_dir: str | Path,
    trainable: bool = False,
    key: str = "eval.adapter",
):
    """Attach a saved PEFT adapter (config `key`); a missing or mismatched adapter is a clear
    ModelError."""
    from peft import PeftModel

    adapter_dir = check_adapter_dir(adapter_dir, key)
    try:
        with peft_deprecations_quiet():
            return PeftModel.from_pretrained(model, adapter_dir, is_trainable=trainable)
    except (RuntimeError, ValueError, KeyError) as err:
        raise ModelError(
            f"adapter {adapter_dir} does not fit this base model ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]})"
        ) from err
    except Exception as err:  # a truncated or corrupt weights file (safetensors, torch)
        raise ModelError(
            f"{key}={adapter_dir}: the adapter weights cannot be read "
            f"({type(err).__name__}: {str(err)[:200]})"
        ) from err


@functools.cache
def kv_cache_name() -> str:
    """The model keyword and output field of the KV cache: `cache` in Transformers versions that
    renamed it (where `past_key_values` is deprecated, to be removed in 5.40), else
    `past_key_values`."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in fields else "past_key_values"


def with_kv_cache(cache: Any) -> dict[str, Any]:
    """`model(..., **with_kv_cache(cache))` passes a KV cache under this version's name."""
    return {kv_cache_name(): cache}


def output_kv_cache(output: Any) -> Any:
    """The KV cache a model call returned, under this version's name."""
    return getattr(output, kv_cache_name())


@contextlib.contextmanager
def reference_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run the frozen reference pi_ref: the same model with its LoRA adapter disabled."""
    disable = getattr(model, "disable_adapter", None)
    with disable() if disable is not None else contextlib.nullcontext():
        yield model
