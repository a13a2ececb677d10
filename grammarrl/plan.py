"""`python -m grammarrl.plan [overrides] [--prompt-tokens P] [--candidate-tokens C]`: the peak
memory of one GrammarRL training step per process (per GPU), for any model and task config, and
which cards it fits, without loading the weights.

The activations are not guessed from a formula: the step's policy pass (our `sequence_logprobs`
with the prompt shared, LoRA, the config's dtype and gradient checkpointing) runs on PyTorch's
`meta` device at the model's real dimensions, and every tensor autograd saves for backward is
counted (`saved_tensors_hooks`, each storage once, frozen weights excluded). Attention is counted
as the fused kernels keep it (queries, keys, values, output, log-sum-exp: what CPU flash and CUDA
memory-efficient attention save), not as the T x T matrix the meta device's math path would.
On SmolLM2 the count equals the one taken on the real model on CPU (tests/test_plan.py), and the
whole plan is compared with the measured peak RSS of the RL-step memory probe
(`python -m benchmarks.rl_step`, which prints both).

peak = runtime + frozen weights + trainable state (LoRA weights, gradients, two AdamW moments)
       + max(policy-pass activations of the batch + backward working memory,
             rollout KV cache of the batch)
       [+ DDP's gradient buckets, one more copy of the gradients, with trainer.devices > 1]

Everything is per process: `optim.batch_size` is inputs per step per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.errors import GrammarRLError, ModelError

GIB = 2**30
# Total memory (MiB) as `nvidia-smi` reports it for the smallest card of each class: A10
# (L4: 23034), A100 40GB, H100 80GB (A100 80GB: 81920); values collected by Modal
# (github.com/modal-labs/modal-client/pull/2797).
CARDS_MIB = {"24GB": 23028, "40GB": 40960, "80GB": 81559}
# Device memory a CUDA process holds outside PyTorch's allocator (context, kernels, cuBLAS
# workspace): an assumption (about 0.5-1 GiB on recent GPUs), not measured in this project.
CUDA_RUNTIME_GIB = 1.0
# Host memory a CPU training process holds besides weights, optimizer state and activations
# (Python, PyTorch, Lightning, the tokenizer, the compiled grammar, data and caches): its RSS
# before the second step's policy pass minus those, on SmolLM2 and CoNLL.
CPU_RUNTIME_GIB = 0.7
PROMPT_SAMPLE = 64  # training inputs whose prompts are measured (the longest one is planned)

# config.json of the paper's models (public), for planning without the hub.
PAPER_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B-Instruct": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    },
    "meta-llama/Llama-3.2-3B-Instruct": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    },
    "meta-llama/Llama-3.1-8B-Instruct": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
}


@dataclass
class MemoryPlan:
    """One step's planned peak, in bytes per part; `total` is what one process needs."""

    model: str
    task: str
    device: str
    dtype: str
    frozen_parameters: int
    trainable_parameters: int
    prompt_tokens: int
    candidate_tokens: int
    candidates: int
    inputs_per_step: int
    gradient_checkpointing: bool
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def fits(self) -> dict[str, bool]:
        """Whether the step fits each card class (its total memory as `nvidia-smi` reports it;
        `runtime` holds what CUDA keeps outside PyTorch's allocator)."""
        return {card: self.total <= mib * 2**20 for card, mib in CARDS_MIB.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "total": self.total,
            "total_gib": round(self.total / GIB, 3),
            "fits": self.fits(),
        }


def model_config(model_cfg: DictConfig, cache_dir: str | Path) -> Any:
    """The transformers config of a model config group, from local files only: `tiny`'s own
    dimensions, the embedded SmolLM2's cached config, a local directory or the hub cache, else
    the paper's models' published dimensions."""
    from transformers import AutoConfig, LlamaConfig

    from grammarrl.models.loading import _in_hub_cache, _weights_path

    if model_cfg.source == "tiny":
        return LlamaConfig(
            vocab_size=49152,
            hidden_size=model_cfg.hidden_size,
            intermediate_size=model_cfg.intermediate_size,
            num_hidden_layers=model_cfg.num_layers,
            num_attention_heads=model_cfg.num_heads,
            num_key_value_heads=model_cfg.num_heads,
            tie_word_embeddings=True,
        )
    path = _weights_path(model_cfg, Path(cache_dir))
    if Path(path).expanduser().is_dir() or _in_hub_cache(path):
        return AutoConfig.from_pretrained(path)
    if path in PAPER_ARCHITECTURES:
        return LlamaConfig(**PAPER_ARCHITECTURES[path])
    raise ModelError(
        f"model.path={path}: no config.json found locally (a model directory or the "
        "Hugging Face cache) to plan with; download the model's config.json first"
    )


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """Within: scaled_dot_product_attention saves what the fused kernels save for backward
    (q, k, v, output, float32 log-sum-exp per query and head, the mask) instead of running the
    math path, which keeps the T x T attention weights. Shapes only: meant for the meta device."""
    original = torch.nn.functional.scaled_dot_product_attention

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, query, key, value, mask):  # type: ignore[override]
            # [batch, query, head, dim] in memory, as the kernels return it: the transpose
            # before the output projection is then free, as in a real run.
            batch, heads, length = query.shape[:-1]
            out = query.new_empty(batch, length, heads, value.shape[-1]).transpose(1, 2)
            logsumexp = query.new_empty(query.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(
                query, key, value, out, logsumexp, *([mask] if mask is not None else [])
            )
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
            raise RuntimeError("a planning trace has no backward")

    def attention(query, key, value, attn_mask=None, **kwargs: Any) -> torch.Tensor:
        return FusedAttention.apply(query, key, value, attn_mask)

    torch.nn.functional.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def saved_activation_bytes(
    policy: torch.nn.Module, prompt_tokens: int, candidate_lengths: list[int]
) -> int:
    """Bytes autograd keeps for backward after the policy pass of one input: its prompt once,
    then its candidates packed after it (`sequence_logprobs` with a shared prefix), counting
    each storage once and leaving out the model's own weights."""
    from grammarrl.decoding.scoring import sequence_logprobs

    weights = {p.untyped_storage()._cdata for p in policy.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    prompt = [1] * prompt_tokens
    sequences = [prompt + [2] * length for length in candidate_lengths]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logp = sequence_logprobs(policy, sequences, [prompt_tokens] * len(sequences))
        torch.stack([lp.sum() for lp in logp])
    return sum(saved.values())


def build_policy(
    config: Any,
    dtype: torch.dtype,
    lora_cfg: DictConfig,
    checkpointing: bool,
    device: str | torch.device = "meta",
) -> torch.nn.Module:
    """The training policy as `grammarrl.training.train` builds it (half-precision weights with a float32
    head, LoRA, optional activation checkpointing, train mode without dropout), on `device`."""
    from transformers import AutoModelForCausalLM

    from grammarrl.models.loading import add_lora, enable_activation_checkpointing, float32_head
    from grammarrl.training.policy import policy_train_mode

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if dtype in (torch.float16, torch.bfloat16):
        float32_head(model)
    policy = add_lora(model, lora_cfg)
    if checkpointing:
        enable_activation_checkpointing(policy)
    policy_train_mode(policy, dropout=False)
    return policy


def _bytes(params: Any) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def plan_step(
    cfg: DictConfig, prompt_tokens: int, candidate_tokens: int, runtime: int
) -> MemoryPlan:
    """The peak of one RL step of `cfg` with prompts of `prompt_tokens` and every candidate
    `candidate_tokens` long (N samples and the beam winner per input)."""
    from grammarrl.config.checks import device_type
    from grammarrl.models.loading import resolve_dtype

    device = torch.device(device_type(cfg.device))  # the run's device, not necessarily this one
    dtype = resolve_dtype(cfg.model.dtype, device)
    config = model_config(cfg.model, cfg.cache_dir)
    checkpointing = bool(cfg.train.gradient_checkpointing)
    policy = build_policy(config, dtype, cfg.lora, checkpointing)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    frozen = [p for p in policy.parameters() if not p.requires_grad]
    candidates = cfg.rollout.num_samples + 1
    inputs = cfg.optim.batch_size
    with fused_attention():
        per_input = saved_activation_bytes(policy, prompt_tokens, [candidate_tokens] * candidates)
        # Backward re-runs one layer at a time under checkpointing and holds one layer's
        # gradients otherwise: one layer's activations of the input, twice (values, gradients).
        one_layer = copy.deepcopy(config)
        one_layer.num_hidden_layers = 1
        layer = saved_activation_bytes(
            build_policy(one_layer, dtype, cfg.lora, False),
            prompt_tokens,
            [candidate_tokens] * candidates,
        )
    layers, kv_dim = config.num_hidden_layers, _kv_dim(config)
    rows = cfg.rollout.num_samples + cfg.rollout.beam_width  # decoded after each prompt
    rollout_tokens = prompt_tokens + rows * candidate_tokens
    kv_cache = inputs * layers * 2 * kv_dim * rollout_tokens * torch.finfo(dtype).bits // 8
    policy_pass = inputs * per_input + 2 * layer
    parts = {
        "runtime": runtime,
        "frozen_weights": _bytes(frozen),
        "trainable_state": 4 * _bytes(trainable),  # weights, gradients, AdamW's two moments
        "activations": max(policy_pass, kv_cache),
    }
    if int(cfg.trainer.devices) > 1:  # DDP's gradient buckets: a second copy of the gradients
        parts["ddp_buckets"] = _bytes(trainable)
    return MemoryPlan(
        model=str(cfg.model.name),
        task=str(cfg.task.name),
        device=device.type,
        dtype=str(dtype).removeprefix("torch."),
        frozen_parameters=sum(p.numel() for p in frozen),
        trainable_parameters=sum(p.numel() for p in trainable),
        prompt_tokens=prompt_tokens,
        candidate_tokens=candidate_tokens,
        candidates=candidates,
        inputs_per_step=inputs,
        gradient_checkpointing=checkpointing,
        parts=parts,
    )


def _kv_dim(config: Any) -> int:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return getattr(config, "num_key_value_heads", heads) * head_dim


def longest_prompt(cfg: DictConfig, sample: int = PROMPT_SAMPLE) -> tuple[int, str]:
    """Tokens of the longest training prompt among the first `sample` training inputs, with the
    model's tokenizer when it is available locally, else SmolLM2's (named in the result)."""
    from grammarrl.models.chat import encode_prompt
    from grammarrl.models.loading import load_tokenizer
    from grammarrl.tasks import load_task

    try:
        tokenizer, counted_with = load_tokenizer(cfg.model, cfg.cache_dir), str(cfg.model.name)
    except ModelError:
        from omegaconf import OmegaConf

        smollm2 = OmegaConf.create({"name": "smollm2", "source": "tiny", "path": None})
        tokenizer, counted_with = load_tokenizer(smollm2, cfg.cache_dir), "smollm2 (stand-in)"
    task = load_task(cfg)
    train = task.splits().train[:sample]
    return max(
        len(encode_prompt(tokenizer, task.forward_messages(ex))) for ex in train
    ), counted_with


def runtime_bytes(cfg: DictConfig) -> int:
    """What a training process holds besides weights, optimizer state and activations: on CPU
    the measured `CPU_RUNTIME_GIB`, on CUDA the assumed `CUDA_RUNTIME_GIB`."""
    from grammarrl.config.checks import device_type

    return int((CUDA_RUNTIME_GIB if device_type(cfg.device) == "cuda" else CPU_RUNTIME_GIB) * GIB)


def format_plan(plan: MemoryPlan, notes: list[str]) -> str:
    """The plan as a small table a person reads, then the JSON line."""
    lines = [
        (
            f"{plan.model} on {plan.task}: {plan.dtype} on {plan.device}, "
            f"{plan.inputs_per_step} inputs per step and process, prompt {plan.prompt_tokens} "
            f"tokens, {plan.candidates} candidates of {plan.candidate_tokens} tokens, gradient "
            f"checkpointing {'on' if plan.gradient_checkpointing else 'off'}"
        )
    ]
    for name, value in plan.parts.items():
        lines.append(f"  {name:<16} {value / GIB:8.2f} GiB")
    lines.append(
        f"  {'peak':<16} {plan.total / GIB:8.2f} GiB   fits: "
        + ", ".join(f"{card} {'yes' if ok else 'no'}" for card, ok in plan.fits().items())
    )
    lines += [f"  note: {note}" for note in notes]
    lines.append(json.dumps(plan.as_dict()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from grammarrl.config.checks import device_type
    from grammarrl.run import checked_config
    from grammarrl.runs.logs import quiet_third_party

    parser = argparse.ArgumentParser(
        prog="python -m grammarrl.plan", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as for grammarrl.run")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        help="plan this prompt length instead of the longest of the task's first training prompts",
    )
    parser.add_argument("--candidate-tokens", type=int, help="default: task.max_new_tokens")
    args = parser.parse_args(argv)
    quiet_third_party()
    try:
        cfg = checked_config(args.overrides)
        notes = []
        if args.prompt_tokens is None:
            prompt_tokens, counted_with = longest_prompt(cfg)
            notes.append(
                f"prompt: the longest of {PROMPT_SAMPLE} training prompts, counted with "
                f"{counted_with}'s tokenizer"
            )
        else:
            prompt_tokens = args.prompt_tokens
        candidate_tokens = args.candidate_tokens or int(cfg.task.max_new_tokens)
        notes.append(
            f"runtime: {CPU_RUNTIME_GIB} GiB resident besides weights, optimizer and "
            "activations, measured on SmolLM2"
            if device_type(cfg.device) == "cpu"
            else f"runtime: {CUDA_RUNTIME_GIB} GiB outside PyTorch's allocator, assumed"
        )
        plan = plan_step(cfg, prompt_tokens, candidate_tokens, runtime_bytes(cfg))
    except GrammarRLError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_plan(plan, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
