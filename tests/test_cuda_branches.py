"""Every branch the code takes only on CUDA, forced on CPU: by answering CUDA's predicates
(`torch.cuda.is_available`, a device type) as a GPU machine would, or by calling the small
function that makes the choice with `cuda`. The numbers themselves are checked on a GPU by the
`cuda` tests (tests/test_cuda_parity.py, `python -m benchmarks.device`)."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks import common, device
from grammarrl import job, plan
from grammarrl.config import checks as config_module
from grammarrl.decoding import ConstrainedDecoder, cascade
from grammarrl.decoding.grammar import CompiledGrammar, MaskComputer
from grammarrl.decoding.scoring import _gather_logprobs
from grammarrl.models import loading as models
from grammarrl.runs import rng, rundir, timing
from grammarrl.training import train
from tests.conftest import compose_config
from tests.support.decoding import JSON_GRAMMAR


@pytest.fixture
def cuda_present(monkeypatch):
    """This process sees one CUDA device, as a GPU machine's would (nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    calls: list[str] = []
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: calls.append(name))
    return calls


# ----- decoding: cascade attention and the grammar masks ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_attention_off_cpu_takes_the_explicit_float32_path(dtype):
    assert not cascade.uses_cpu_flash("cuda", dtype)
    assert cascade.uses_cpu_flash("cpu", dtype) == (cascade._CPU_FLASH is not None)
    assert not cascade.uses_cpu_flash("cpu", dtype, exact_fp32=True)


def test_cascade_rollout_with_cuda_attention_equals_the_cpu_kernel(
    model, tok, prompts, monkeypatch
):
    """cascade.py:attention_with_lse as on CUDA (the explicit float32 computation, never the
    CPU kernel) gives the CPU kernel's rollout: same tokens, log-probs within 1e-5 (they differ
    by about 2e-6; attention scores off by 1% move them by 3e-5 on this model)."""
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, 10, cascade=True)
    expected = decoder.rollout(
        prompts, 3, 3, generator=torch.Generator().manual_seed(0), length_penalty=1.0
    )
    as_on_cuda, explicit = cascade.uses_cpu_flash, []

    def off_cpu(device_type, *args, **kwargs):
        explicit.append(not as_on_cuda("cuda", *args, **kwargs))
        return False

    monkeypatch.setattr(cascade, "uses_cpu_flash", off_cpu)
    monkeypatch.setattr(cascade, "_CPU_FLASH", lambda *a, **k: pytest.fail("CPU kernel used"))
    got = decoder.rollout(
        prompts, 3, 3, generator=torch.Generator().manual_seed(0), length_penalty=1.0
    )
    assert explicit and all(explicit)
    for want_group, got_group in zip(expected, got):
        for want, have in zip(want_group, got_group):
            assert have.token_ids == want.token_ids
            torch.testing.assert_close(
                torch.tensor(have.logp_unconstrained),
                torch.tensor(want.logp_unconstrained),
                atol=1e-5,
                rtol=0,
            )


def test_grammar_masks_are_built_on_the_logits_device(tok, monkeypatch):
    """grammar.py:MaskComputer on a non-CPU device: the bit table lives there, the bitmask is
    copied there without blocking, and the padded mask is made there (`meta` stands in for
    CUDA: it has placement and shapes, no values)."""
    grammar = CompiledGrammar(tok, JSON_GRAMMAR, tok.eos_token_id)
    width = grammar.vocab_size + 7  # a padded head, as Llama's 128,256 columns past a tokenizer
    moves: list[tuple[str, bool]] = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device):
            moves.append((args[0].type, kwargs.get("non_blocking", False)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    masks = MaskComputer(grammar, width, torch.device("meta"))
    allowed = masks.allowed([grammar.matcher(), grammar.matcher()])
    assert allowed.device.type == "meta" and masks._byte_bits.device.type == "meta"
    assert allowed.shape == (2, width) and allowed.dtype == torch.bool
    assert ("meta", True) in moves  # the per-step bitmask copy


def test_grammar_masks_follow_a_model_that_moved(model, tok, prompts):
    """decoder.py:distribution after Lightning's teardown moved the model (CUDA -> CPU, found by
    the device check on an H100): the cached masks are rebuilt on the new logits' device
    instead of mixing devices (`meta` stands in for the other device)."""
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, 4)
    decoder.greedy(prompts[:1])  # builds the masks on the CPU
    width = decoder._masks.width
    moved = decoder.distribution(torch.zeros(1, width, device="meta"), [decoder.grammar.matcher()])
    assert moved.masked.device.type == "meta" and decoder._masks.device.type == "meta"


def test_trained_policy_is_evaluated_on_the_run_device(monkeypatch):
    """trained_eval.py:evaluate_trained moves the policy back to the run's device before the
    test evaluations (Lightning's teardown after `fit` leaves it on the CPU)."""
    from grammarrl.training import trained_eval

    seen: list[str] = []

    def first_evaluation(evaluation, skip_completed, policy, *args):
        seen.append(next(policy.parameters()).device.type)
        raise StopIteration

    monkeypatch.setattr(trained_eval, "resolve_device", lambda spec: torch.device("meta"))
    monkeypatch.setattr(trained_eval, "evaluate_best_dev", first_evaluation)
    with pytest.raises(StopIteration):
        trained_eval.evaluate_trained(
            trained_eval.TrainedEvalSettings.from_config(compose_config(["model=tiny"])),
            torch.nn.Linear(2, 2),
            None,
            None,
            None,
            None,
        )
    assert seen == ["meta"]


def test_half_precision_logits_are_scored_in_float32():
    """scoring.py:_gather_logprobs: bfloat16 logits (CUDA's default dtype) are upcast."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 7, 49])
    got = _gather_logprobs(logits.bfloat16(), targets)
    want = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, targets[:, None])[:, 0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# ----- device and dtype choices ----------------------------------------------------------------
def test_auto_device_and_dtype_on_a_cuda_machine(cuda_present):
    """models/loading.py:resolve_device/resolve_dtype, config/checks.py:device_type,
    runs/rundir.py:resolved_settings with CUDA present: auto is cuda in bfloat16."""
    assert models.resolve_device("auto") == torch.device("cuda")
    assert models.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert config_module.device_type("auto") == "cuda"
    cfg = compose_config(["model=tiny", "device=auto", "model.dtype=auto"])
    assert rundir.resolved_settings(cfg) == {"device": "cuda", "dtype": "bfloat16"}
    gpu = compose_config(["model=tiny", "trainer.accelerator=gpu"])
    job.validate(gpu)  # accelerator=gpu agrees with device=auto on a CUDA machine


def test_load_model_on_cuda(cuda_present, cache_dir, monkeypatch):
    """models/loading.py:load_model on CUDA: bfloat16 weights with a float32 head, moved to the GPU,
    and glibc's allocator left alone (`steady_cpu_allocator` is for CPU runs)."""
    tuned: list[bool] = []
    monkeypatch.setattr(models, "steady_cpu_allocator", lambda: tuned.append(True))
    moved: list[torch.device] = []
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, torch.device) and target.type == "cuda":
            moved.append(target)
            return self
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    cfg = compose_config(["model=tiny", "model.dtype=auto"])
    model, _ = models.load_model(cfg.model, cache_dir, device="auto")
    assert moved == [torch.device("cuda")] and not tuned
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.get_output_embeddings().weight.dtype == torch.float32


def test_device_check_policy_in_half_precision_has_a_float32_head():
    """benchmarks/device.py:random_model in bfloat16 (what `auto` gives on CUDA): half-precision
    weights, the float32 head `load_model` gives them, Llama's shapes from the model config."""
    cfg = compose_config(["model=tiny", "model.dtype=bfloat16", "device=cpu"])
    model = device.random_model(cfg)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    head = model.get_output_embeddings().weight
    assert head.dtype == torch.float32 and head.shape == (49152, cfg.model.hidden_size)
    assert not model.training


@pytest.mark.parametrize(
    ("device_spec", "devices", "expected"),
    [("cuda", 1, ("gpu", 1)), ("cuda:1", 1, ("gpu", [1])), ("cuda", 2, ("gpu", 2))],
)
def test_trainer_placement_on_cuda(device_spec, devices, expected):
    """train.py:trainer_placement: Lightning's accelerator and devices follow `device`."""
    cfg = compose_config(["model=tiny", f"device={device_spec}", f"trainer.devices={devices}"])
    assert train.trainer_placement(cfg.device, cfg.trainer.devices) == expected


def test_plan_runtime_on_cuda(cuda_present):
    """plan.py:runtime_bytes: what CUDA holds outside PyTorch's allocator (device=auto on a
    CUDA machine too), not the CPU process's measured runtime."""
    for spec in ("cuda", "auto"):
        cfg = compose_config(["model=tiny", f"device={spec}"])
        assert plan.runtime_bytes(cfg) == int(plan.CUDA_RUNTIME_GIB * plan.GIB)


# ----- random state, clocks, benchmark plumbing ------------------------------------------------
def test_cuda_random_state_is_saved_and_restored(cuda_present, monkeypatch):
    """rng.py:rng_states/set_rng_states keep the CUDA generators' states in a checkpoint."""
    state = [torch.arange(8, dtype=torch.uint8)]
    restored: list = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: copy.deepcopy(state))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    saved = rng.rng_states()
    assert torch.equal(saved["cuda"][0], state[0])
    rng.set_rng_states(saved)
    assert len(restored) == 1 and torch.equal(restored[0][0], state[0])


def test_phase_clock_waits_for_cuda_work(cuda_present, monkeypatch):
    """timing.py:clock synchronizes before it reads once CUDA is in use, and not before."""
    before = len(cuda_present)
    timing.clock()
    assert cuda_present[before:] == ["synchronize"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    timing.clock()
    assert cuda_present[before:] == ["synchronize"]


def test_benchmark_plumbing_on_cuda(cuda_present, monkeypatch):
    """benchmarks: the timer's synchronization, the cache release, the machine's GPU name, the
    peak-memory reset and reading, and the results file's name on a CUDA machine."""
    gib = 2**30
    values = {
        "mem_get_info": (70 * gib, 80 * gib),
        "memory_reserved": 9 * gib,
        "max_memory_reserved": 12 * gib,
        "max_memory_allocated": 11 * gib,
    }
    for name, value in values.items():
        monkeypatch.setattr(torch.cuda, name, lambda *a, value=value: value)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    common.timed(lambda: None, 1)
    common.release_memory()
    device.memory_reset()
    assert cuda_present == ["synchronize", "synchronize", "empty_cache", "reset_peak_memory_stats"]
    assert common.machine()["cuda_device"] == "NVIDIA H100 80GB HBM3"
    assert device.gpu_slug() == "nvidia-h100-80gb-hbm3"
    peak = device.measured_peak()
    assert peak["outside_allocator_bytes"] == 1 * gib  # used 10 GiB, 9 of them reserved
    assert peak["peak_bytes"] == 13 * gib and peak["max_allocated_bytes"] == 11 * gib
