"""RL-step benchmarks: prefix sharing on vs off (by config), time per phase, growth with prompt
length and N, and peak resident memory of a step (in a fresh process)."""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.common import Bench, BenchResult, release_memory
from grammarrl.models.loading import with_kv_cache
from grammarrl.training.policy import policy_train_mode

PHASES = ("rollout", "scoring", "policy", "backward", "optimizer", "step")
# Fixed σ's: the benchmark times a step, it does not need calibrated rewards.
STEP_OVERRIDES = ("reward.sigma_direct=1.0", "reward.sigma_reverse=1.0", "optim.lr=1e-5")


def run_steps(bench: Bench, steps: int, *overrides: str) -> list[dict[str, float]]:
    """Run `steps` real training steps (Lightning, LoRA policy, this config) and return each
    step's wall time per phase."""
    return train_module(bench, steps, *overrides)[1]


def train_module(
    bench: Bench, steps: int, *overrides: str, record: list | None = None
) -> tuple[Any, list[dict[str, float]]]:
    """The GrammarRLModule after `steps` real training steps, and each step's wall time per
    phase; `record` (if given) receives each step's StepOutputs (rollouts, rewards, loss)."""
    from grammarrl.models.loading import add_lora
    from grammarrl.tasks import load_task
    from grammarrl.training.callbacks import PhaseTimer
    from grammarrl.training.datamodule import DataSettings, GrammarRLDataModule
    from grammarrl.training.module import GrammarRLModule
    from grammarrl.training.settings import StepSettings

    cfg = bench.config(*STEP_OVERRIDES, f"trainer.max_steps={steps}", *overrides)
    L.seed_everything(cfg.seed, verbose=False)
    model, tokenizer = bench.load(cfg)
    task = load_task(cfg)
    sigmas = cfg.reward.sigma_direct, cfg.reward.sigma_reverse
    settings = StepSettings.from_config(cfg, *sigmas)
    module = GrammarRLModule(add_lora(model, cfg.lora), tokenizer, task, settings)
    timer = PhaseTimer()
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=cfg.trainer.gradient_clip_val,
        callbacks=[timer],
    )
    if record is not None:
        step_loss = module.step_loss
        module.step_loss = lambda batch: record.append(step_loss(batch)) or record[-1]
    trainer.fit(module, datamodule=GrammarRLDataModule(task, DataSettings.from_config(cfg)))
    return module, timer.history


def median_phases(history: list[dict[str, float]], skip: int = 1) -> dict[str, float]:
    """Median seconds per phase over the steps after the first `skip` (warm-up)."""
    kept = history[skip:] or history
    return {phase: round(statistics.median(h[phase] for h in kept), 4) for phase in PHASES}


def prefix_sharing(
    bench: Bench, task_name: str, batch_size: int = 1, steps: int = 1, extra: tuple[str, ...] = ()
) -> BenchResult:
    """One RL step with the prompt's KV cache shared across the group (and static prefixes
    cached) vs the same step with `train.share_prefix=false`; same inputs and seeds."""
    common = (f"task={task_name}", f"optim.batch_size={batch_size}", *extra)
    shared = median_phases(run_steps(bench, steps, *common, "train.share_prefix=true"))
    unshared = median_phases(run_steps(bench, steps, *common, "train.share_prefix=false"))
    return BenchResult(
        name=f"rl_step_prefix_sharing/{task_name}",
        ratio=unshared["step"] / shared["step"],
        goal=2.5,
        at_most=False,
        details={
            "task": task_name,
            "batch_size": batch_size,
            "steps": steps,
            "timed_steps": max(steps - 1, 1),
            "overrides": list(extra),
            "shared_s": shared,
            "unshared_s": unshared,
            "phase_ratio": {p: round(unshared[p] / max(shared[p], 1e-9), 3) for p in PHASES},
        },
    )


def dtype_pair(bench: Bench, task_name: str, steps: int = 2) -> BenchResult:
    """RL steps with the weights in float32 vs `model.dtype=auto` (bfloat16 on CUDA and on CPUs
    with native bf16); same inputs and seeds. The ratio is float32 step / auto step."""
    from grammarrl.models.loading import resolve_device, resolve_dtype

    common = (f"task={task_name}", "optim.batch_size=1")
    auto_cfg = bench.config(*common, "model.dtype=auto")
    chosen = resolve_dtype("auto", resolve_device(auto_cfg.device))
    fp32 = median_phases(run_steps(bench, steps, *common, "model.dtype=float32"))
    release_memory()
    auto = median_phases(run_steps(bench, steps, *common, "model.dtype=auto"))
    return BenchResult(
        name=f"rl_step_dtype/{task_name}",
        ratio=fp32["step"] / auto["step"],
        goal=1.7,
        at_most=False,
        details={
            "task": task_name,
            "steps": steps,
            "timed_steps": max(steps - 1, 1),
            "auto_dtype": str(chosen).removeprefix("torch."),
            "float32_s": fp32,
            "auto_s": auto,
            "phase_ratio": {p: round(fp32[p] / max(auto[p], 1e-9), 3) for p in PHASES},
        },
    )


def step_floor(bench: Bench, task_name: str, steps: int = 2) -> BenchResult:
    """A real training step (the last of `steps`, as the trainer runs it) against its floor: the
    model calls that step cannot avoid, timed with plain Transformers calls on the same model,
    dtype and tokens, without grammar, masks, packing bookkeeping or Lightning:
    - rollout: one prefill of the prompt, then one decode call per step for the rows still
      running (each sample until its own length, the B beam rows until the winner's length),
      their tokens run as one sequence after the prompt's KV, held once in a preallocated
      StaticCache and rewritten in place (no copies; each row's own earlier tokens are left
      out of its attention, at most 64 keys next to the prompt's ~1k);
    - scoring: one reference forward over prompt + all candidates (causal, one row) and one over
      the candidates' reverse prompts after their static part (not counted: it is cached);
    - policy / backward: one forward with gradient over prompt + all candidates, its backward;
    - optimizer: the step's own (AdamW over the LoRA weights is already the floor).
    The ratio is step / floor; `phase_ratio` says where the rest goes."""
    from transformers import StaticCache

    from grammarrl.models.chat import encode_prompt
    from grammarrl.models.loading import reference_mode

    record: list = []
    module, history = train_module(
        bench, steps, f"task={task_name}", "optim.batch_size=1", record=record
    )
    step = history[-1]
    rollouts = record[-1].rollouts
    prompt, group = rollouts.prompts[0], rollouts.groups[0]
    example = rollouts.examples[0]
    policy, device = module.policy.eval(), next(module.policy.parameters()).device
    num_samples = len(group) - 1
    beam_width = module.settings.rollout.beam_width
    lengths = [len(g.token_ids) for g in group]
    candidates = [t for g in group for t in g.token_ids]
    scorer = module.scorer
    static = len(scorer.reverse_static_prefix().tokens)
    reverse = [
        t
        for g in group
        for t in encode_prompt(module.tokenizer, module.task.reverse_messages(g.text))[static:]
        + scorer.input_ids(example)
    ]

    def ids(tokens: list[int]) -> torch.Tensor:
        return torch.tensor([tokens], device=device)

    @torch.no_grad()
    def rollout() -> None:
        rows_at = [
            sum(n > t for n in lengths[:num_samples]) + beam_width * (lengths[-1] > t)
            for t in range(max(lengths))
        ]
        cache = StaticCache(config=policy.config, max_cache_len=len(prompt) + max(rows_at))
        policy(
            input_ids=ids(prompt),
            **with_kv_cache(cache),
            logits_to_keep=1,
            cache_position=torch.arange(len(prompt), device=device),
        )
        for t, rows in enumerate(rows_at):
            # The running rows' tokens as one sequence after the prompt's KV, rewritten in place
            # each step: each row reads the one prompt KV (its own earlier tokens are left out).
            # Recent Transformers write a StaticCache at its own running length, not at
            # cache_position: rewind it to the prompt's end.
            for layer in cache.layers:
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length.fill_(len(prompt))
            policy(
                input_ids=torch.zeros(1, rows, dtype=torch.long, device=device),
                **with_kv_cache(cache),
                cache_position=torch.arange(len(prompt), len(prompt) + rows, device=device),
                position_ids=torch.full((1, rows), len(prompt) + t, device=device),
            )

    @torch.no_grad()
    def scoring() -> None:
        with reference_mode(policy):
            policy(input_ids=ids(prompt + candidates), logits_to_keep=len(candidates))
            policy(input_ids=ids(reverse), logits_to_keep=len(reverse))

    def policy_pass() -> tuple[float, float]:
        policy_train_mode(policy, dropout=False)
        start = time.perf_counter()
        logits = policy(
            input_ids=ids(prompt + candidates), logits_to_keep=len(candidates) + 1
        ).logits
        logp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids(candidates).T).sum()
        forward = time.perf_counter() - start
        logp.backward()
        backward = time.perf_counter() - forward - start
        policy.zero_grad(set_to_none=True)
        policy.eval()
        return forward, backward

    timings: dict[str, list[float]] = {"rollout": [], "scoring": [], "policy": [], "backward": []}
    for _ in range(bench.repeats + 1):  # the first round warms up and is dropped
        for phase, fn in (("rollout", rollout), ("scoring", scoring)):
            start = time.perf_counter()
            fn()
            timings[phase].append(time.perf_counter() - start)
        forward, backward = policy_pass()
        timings["policy"].append(forward)
        timings["backward"].append(backward)
    floor = {p: round(statistics.median(ts[1:]), 4) for p, ts in timings.items()}
    floor["optimizer"] = round(step["optimizer"], 4)
    floor["step"] = round(sum(floor.values()), 4)
    measured = {p: round(step[p], 4) for p in PHASES}
    return BenchResult(
        name=f"rl_step_floor/{task_name}",
        ratio=measured["step"] / floor["step"],
        goal=1.3,
        at_most=True,
        details={
            "task": task_name,
            "steps": steps,
            "timed_step": steps,
            "prompt_tokens": len(prompt),
            "candidate_tokens": lengths,
            "reverse_tokens": len(reverse),
            "reverse_static_tokens": static,
            "step_s": measured,
            "floor_s": floor,
            "phase_ratio": {p: round(measured[p] / max(floor[p], 1e-9), 3) for p in PHASES},
            "unaccounted_s": round(measured["step"] - sum(measured[p] for p in PHASES[:-1]), 4),
        },
    )


def scaling(
    bench: Bench,
    task_name: str,
    fewshots: tuple[int, ...],
    samples: tuple[int, ...],
    steps: int = 1,
) -> BenchResult:
    """Step time vs prompt length (few-shot count) and N, shared vs unshared. The ratio is how
    much more the unshared step grows from the smallest to the largest N than the shared one."""
    from grammarrl.models.chat import encode_prompt
    from grammarrl.tasks import load_task

    rows = []
    for fewshot in fewshots:
        cfg = bench.config(f"task={task_name}", f"task.num_fewshot={fewshot}")
        _, tokenizer = bench.load(cfg)
        task = load_task(cfg)
        example = task.splits().train[0]
        prompt_tokens = len(encode_prompt(tokenizer, task.forward_messages(example)))
        for n in samples:
            row: dict[str, Any] = {
                "num_fewshot": fewshot,
                "prompt_tokens": prompt_tokens,
                "num_samples": n,
            }
            for share in (True, False):
                phases = median_phases(
                    run_steps(
                        bench,
                        steps,
                        f"task={task_name}",
                        f"task.num_fewshot={fewshot}",
                        f"rollout.num_samples={n}",
                        "optim.batch_size=1",
                        f"train.share_prefix={str(share).lower()}",
                    )
                )
                row["shared_s" if share else "unshared_s"] = phases["step"]
                release_memory()
            rows.append(row)
    longest = [r for r in rows if r["num_fewshot"] == max(fewshots)]
    lo = min(longest, key=lambda r: r["num_samples"])
    hi = max(longest, key=lambda r: r["num_samples"])
    growth_shared = hi["shared_s"] / lo["shared_s"]
    growth_unshared = hi["unshared_s"] / lo["unshared_s"]
    return BenchResult(
        name=f"rl_step_scaling/{task_name}",
        ratio=growth_unshared / growth_shared,
        goal=1.0,
        at_most=False,
        details={
            "table": rows,
            "growth_in_n_shared": round(growth_shared, 3),
            "growth_in_n_unshared": round(growth_unshared, 3),
            "ratio_is": "unshared growth / shared growth from the smallest to the largest N "
            "at the longest prompt (> 1: shared grows slower)",
        },
    )


def peak_memory(
    bench: Bench,
    task_name: str,
    checkpointing: bool = False,
    batch_size: int = 1,
    limit_gb: float = 4.0,
) -> BenchResult:
    """Peak resident memory (VmHWM) of a fresh process that loads the model and the task and
    runs 2 RL steps at the paper's N=3, B=3; with `train.gradient_checkpointing` if asked."""
    overrides = [*bench.overrides, f"train.gradient_checkpointing={str(checkpointing).lower()}"]
    args = [
        sys.executable,
        "-m",
        "benchmarks.rl_step",
        "--task",
        task_name,
        "--model",
        bench.model,
        "--batch-size",
        str(batch_size),
        *[f"--override={o}" for o in overrides],
    ]
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the memory probe failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    gb = report["max_rss_kb"] / 2**20
    suffix = "+checkpointing" if checkpointing else ""
    return BenchResult(
        name=f"rl_step_peak_memory_gb/{task_name}{suffix}",
        ratio=gb,
        goal=limit_gb,
        at_most=True,
        details={"batch_size": batch_size, "gradient_checkpointing": checkpointing, **report},
    )


def _memory_probe() -> None:
    """Child process of `peak_memory`: 2 steps, then print max RSS as JSON."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--task", required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--override", action="append", default=[])
    args = parser.parse_args()
    bench = Bench(model=args.model, overrides=args.override)
    record: list = []
    steps = (
        f"task={args.task}",
        f"optim.batch_size={args.batch_size}",
        "rollout.num_samples=3",
        "rollout.beam_width=3",
    )
    _, history = train_module(bench, 2, *steps, record=record)
    peak_kb = peak_rss_kb()
    print(
        json.dumps(
            {
                "max_rss_kb": peak_kb,
                "step_s": [h["step"] for h in history],
                "policy_tokens": [policy_tokens(out.rollouts) for out in record],
                **planned(bench.config(*STEP_OVERRIDES, *steps), record, peak_kb),
            }
        )
    )


def planned(cfg: Any, record: list, peak_kb: int) -> dict[str, Any]:
    """`grammarrl.plan`'s peak for the largest step recorded (its longest prompt, its candidates'
    mean length), next to the measured one."""
    from grammarrl.plan import GIB, plan_step, runtime_bytes

    largest = max(record, key=lambda out: policy_tokens(out.rollouts)).rollouts
    prompt = max(len(p) for p in largest.prompts)
    lengths = [len(g.token_ids) for group in largest.groups for g in group]
    candidate = -(-sum(lengths) // len(lengths))
    plan = plan_step(cfg, prompt, candidate, runtime_bytes(cfg))
    return {
        "plan_gb": round(plan.total / GIB, 3),
        "plan_parts_gb": {k: round(v / GIB, 3) for k, v in plan.parts.items()},
        "plan_error": round(plan.total / (peak_kb * 1024) - 1, 3),
        "plan_tokens": {"prompt": prompt, "candidate": candidate},
    }


def policy_tokens(rollouts: Any) -> int:
    """Tokens of a step's policy pass with a shared prefix: each prompt once, then its group's
    candidates (what the activation memory of the pass scales with)."""
    return sum(
        len(prompt) + sum(len(g.token_ids) for g in group)
        for prompt, group in zip(rollouts.prompts, rollouts.groups)
    )


def peak_rss_kb() -> int:
    """This process's peak resident memory in KiB. Linux: VmHWM, which belongs to the process's
    own address space; ru_maxrss would report the parent's RSS at fork when that is larger."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    _memory_probe()
