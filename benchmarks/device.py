"""`python -m benchmarks.device`: the prepared GPU check, one command, in under 8 minutes on one
H100 including its own set-up.

    python -m benchmarks.device_setup                      # once, here, with network
    python -m benchmarks.device                            # there: CUDA, Llama-3.2-1B's shapes
    python -m benchmarks.device --tiny --out /tmp/d.json   # anywhere: the same code, tiny shapes

1. Set-up: installs the carried wheels (`benchmarks.device_setup`) if Hydra, OmegaConf or
   llguidance are missing.
2. Tests: the `cuda`-marked tests (CUDA against CPU float32) in a pytest subprocess.
3. RL steps: real training steps (Lightning, LoRA, `GrammarRLModule`: rollout with grammar
   masks, reward scoring, policy pass, backward, optimizer) of a policy with Llama-3.2-1B's
   published shapes (`grammarrl.plan`'s architecture values, the 128,256-token head included),
   random weights, `model.dtype=auto` (bfloat16 on CUDA), on CoNLL at the paper's settings
   (8 prompts per step, N=3, B=3, 128 new tokens, 10-shot prompts with 80 hints); the time per
   phase of each step, and the peak memory next to `grammarrl.plan`'s prediction.
4. Evaluation: constrained greedy decoding, examples per second at batch 1 and batch 32.
Writes one JSON (default benchmarks/results/device-<gpu>.json) and prints a one-screen table.

The prompts are the real CoNLL prompts when the assets folder carries the data (the paper's
lengths), else the bundled samples' (shorter; the JSON says which and how long). The tokenizer
is SmolLM2's (49,152 tokens; Llama's is gated): the head's columns past it are masked, as the
decoder masks any padded vocabulary, so every matrix keeps Llama's shape."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks import device_setup

PAPER_STEP_S = (18.0, 65.0)  # 5-18 hours per 1,000 steps on one H100 (the paper's appendix)
GOAL_SHARE = 1 / 3  # ours: at most a third of the paper's step time
# Sizes per mode: the full check at the paper's settings, and --tiny for the suite on CPU.
MODES: dict[str, dict[str, Any]] = {
    "full": {
        "model": "1b",
        "batch_size": 8,
        "max_new_tokens": 128,
        "eval_batch": 32,
        "eval_one_by_one": 8,
    },
    "tiny": {
        "model": "tiny",
        "batch_size": 2,
        "max_new_tokens": 8,
        "eval_batch": 32,
        "eval_one_by_one": 2,
    },
}
STEPS = 3
CUDA_TESTS = "tests/test_cuda_parity.py"


def random_model(cfg: Any) -> Any:
    """A randomly initialised policy base with the model config's architecture (the paper's
    published values, offline), in `model.dtype` on `device`, with the float32 head that
    `load_model` gives half-precision weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from grammarrl.models.loading import float32_head, resolve_device, resolve_dtype
    from grammarrl.plan import model_config

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    config = model_config(cfg.model, cfg.cache_dir)
    config.max_position_embeddings = max(config.max_position_embeddings, 8192)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if dtype in (torch.float16, torch.bfloat16):
        float32_head(model)
    return model.eval()


def bench_class() -> type:
    """`Bench` whose models are `random_model` with the carried (or local) tokenizer: the
    benchmarks' real training step, without weights to download."""
    from benchmarks.common import Bench

    class RandomWeights(Bench):
        assets: Path = device_setup.ASSETS

        def load(self, cfg: Any) -> tuple[Any, Any]:
            return random_model(cfg), device_setup.load_carried_tokenizer(self.assets)

    return RandomWeights


def run_cuda_tests(assets: Path) -> dict[str, Any]:
    """The `cuda`-marked tests in a pytest subprocess: counts, seconds, the failures' names."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
            + [f"--junitxml={report}", CUDA_TESTS],
            cwd=device_setup.REPO,
            env={**os.environ, device_setup.ASSETS_ENV: str(assets)},
            capture_output=True,
            text=True,
            check=False,
        )
        cases = ET.parse(report).getroot().iter("testcase") if report.is_file() else []
        outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
        for case in cases:
            kind = next(
                (
                    "failed" if c.tag in ("failure", "error") else "skipped"
                    for c in case
                    if c.tag in ("failure", "error", "skipped")
                ),
                "passed",
            )
            outcome[kind].append(case.get("name", "?"))
    return {
        "returncode": done.returncode,
        "passed": len(outcome["passed"]),
        "failed": outcome["failed"],
        "skipped": len(outcome["skipped"]),
        "seconds": round(time.perf_counter() - started, 1),
        "output_tail": done.stdout[-1500:] + done.stderr[-500:],
    }


def memory_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def measured_peak() -> dict[str, Any]:
    """The step's peak: on CUDA PyTorch's peak reserved memory plus what the process holds on
    the device outside the allocator (context, kernels, cuBLAS workspace: used - reserved, now);
    on CPU the peak resident memory."""
    import torch

    from benchmarks.rl_step import peak_rss_kb

    if not torch.cuda.is_available():
        return {"where": "cpu (peak RSS)", "peak_bytes": peak_rss_kb() * 1024}
    free, total = torch.cuda.mem_get_info()
    outside = (total - free) - torch.cuda.memory_reserved()
    reserved = torch.cuda.max_memory_reserved()
    return {
        "where": "cuda (peak reserved + outside the allocator)",
        "peak_bytes": reserved + outside,
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_reserved_bytes": reserved,
        "outside_allocator_bytes": outside,
        "device_total_bytes": total,
    }


def rl_steps(bench: Any, assets: Path) -> tuple[Any, dict[str, Any]]:
    """`STEPS` real training steps: phases per step, their median after the first, the prompts'
    and candidates' lengths, and the peak memory next to the plan."""
    from benchmarks.rl_step import PHASES, STEP_OVERRIDES, median_phases, planned, train_module
    from grammarrl.tasks import load_task

    cfg = bench.config(*STEP_OVERRIDES)
    placed = device_setup.place_hints(load_task(cfg), assets)
    record: list = []
    memory_reset()
    module, history = train_module(bench, STEPS, record=record)
    peak = measured_peak()
    prompts = [len(p) for out in record for p in out.rollouts.prompts]
    candidates = [len(g.token_ids) for out in record for grp in out.rollouts.groups for g in grp]
    truncated = [g.truncated for out in record for grp in out.rollouts.groups for g in grp]
    plan = planned(cfg, record, peak["peak_bytes"] // 1024)
    return module, {
        "steps_s": [{p: round(h[p], 4) for p in PHASES} for h in history],
        "median_after_first_s": median_phases(history, skip=1),
        "prompt_tokens": {"min": min(prompts), "median": statistics.median(prompts)}
        | {"max": max(prompts), "count": len(prompts)},
        "candidate_tokens": {"mean": round(statistics.mean(candidates), 1)}
        | {"max": max(candidates), "truncated_share": round(sum(truncated) / len(truncated), 3)},
        "hint_table_placed": placed,
        "memory": peak,
        **plan,
    }


def greedy_eval(bench: Any, module: Any, sizes: dict) -> dict[str, Any]:
    """Constrained greedy decoding of test prompts (the trained step's policy and decoder):
    examples per second one prompt at a time, and in one batch of `eval_batch`."""
    from benchmarks.common import real_prompts, timed
    from grammarrl.models.loading import resolve_device

    cfg = bench.config()
    _, prompts = real_prompts(cfg, module.tokenizer, sizes["eval_batch"])
    distinct = len(prompts)
    batch = [prompts[i % distinct] for i in range(sizes["eval_batch"])]
    single = batch[: sizes["eval_one_by_one"]]
    decoder = module.decoder
    # Lightning's teardown after `fit` left the policy on the CPU
    module.policy.to(resolve_device(cfg.device)).eval()
    decoder.greedy(single[:1])  # warm-up

    def one_by_one() -> list[int]:
        return [g.num_tokens for p in single for g in decoder.greedy([p])]

    def batched() -> list[int]:
        return [g.num_tokens for g in decoder.greedy(batch)]

    results = {}
    for name, fn, count in (
        ("batch_1", one_by_one, len(single)),
        ("batch_32", batched, len(batch)),
    ):
        seconds, _, tokens = timed(fn, 1)
        results[name] = {
            "examples": count,
            "seconds": round(seconds, 3),
            "examples_per_s": round(count / seconds, 3),
            "output_tokens_mean": round(statistics.mean(tokens), 1),
        }
    results["distinct_prompts"] = distinct
    results["batch_size"] = sizes["eval_batch"]
    return results


def package_versions() -> dict[str, str]:
    """Versions of what the numbers depend on (the device image has its own)."""
    from importlib.metadata import PackageNotFoundError, version

    names = ("torch", "transformers", "peft", "lightning", *device_setup.PACKAGES)
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:  # installed with --target: no metadata on the path
            found[name] = "?"
    return found


def gpu_slug() -> str:
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table(report: dict[str, Any]) -> str:
    """One screen: where, tests, the step's phases, memory against the plan, eval throughput."""
    step = report["rl_step"]
    med = step["median_after_first_s"]
    settings, setup = report["settings"], report["setup"]
    lines = [
        (
            f"device check ({report['mode']}): {report['machine'].get('cuda_device', 'CPU')}, "
            f"model {settings['model']} shapes, {settings['dtype']}, prompts: {settings['prompts']}"
        ),
        (
            f"set-up {setup['seconds']:.1f} s (installed: "
            f"{', '.join(setup['installed']) or 'nothing'})"
        ),
    ]
    tests = report["tests"]
    if tests is not None:
        lines.append(
            f"cuda tests: {tests['passed']} passed, {len(tests['failed'])} failed, "
            f"{tests['skipped']} skipped ({tests['seconds']:.0f} s)"
            + (f"  FAILED: {', '.join(tests['failed'])}" if tests["failed"] else "")
        )
    lines.append(
        f"RL step, {report['settings']['batch_size']} prompts x (N=3 + B=3), "
        f"{report['settings']['max_new_tokens']} new tokens; prompt tokens "
        f"{step['prompt_tokens']['min']}-{step['prompt_tokens']['max']}, candidates "
        f"{step['candidate_tokens']['mean']} tokens on average"
    )
    lines.append(f"  {'phase':<10}" + "".join(f"{f'step {i + 1}':>10}" for i in range(STEPS)))
    for phase in med:
        cells = "".join(f"{s[phase]:10.3f}" for s in step["steps_s"])
        lines.append(f"  {phase:<10}{cells}   median after the first {med[phase]:.3f} s")
    low, high = PAPER_STEP_S
    lines.append(
        f"  paper: {low:.0f}-{high:.0f} s per step on one H100; goal at most "
        f"{low * GOAL_SHARE:.0f}-{high * GOAL_SHARE:.0f} s; here {med['step']:.2f} s"
    )
    memory = step["memory"]
    lines.append(
        f"peak memory {memory['peak_bytes'] / 2**30:.2f} GiB ({memory['where']}); "
        f"plan {step['plan_gb']:.2f} GiB (error {step['plan_error']:+.1%})"
    )
    ev = report["eval"]
    lines.append(
        f"greedy eval: batch 1 {ev['batch_1']['examples_per_s']:.2f} ex/s, batch "
        f"{ev['batch_size']} {ev['batch_32']['examples_per_s']:.2f} ex/s "
        f"({ev['distinct_prompts']} distinct prompts)"
    )
    lines.append(f"total {report['total_s']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.device",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU, the test suite)")
    parser.add_argument("--out", default=None, help="JSON file (default results/device-<gpu>)")
    parser.add_argument("--assets", default=None, help="carried folder (default .device_assets)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the cuda tests")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    assets = device_setup.assets_dir(args.assets)
    installed = device_setup.install(assets)
    setup_s = time.perf_counter() - started

    import torch

    from benchmarks.__main__ import quiet_logging
    from benchmarks.common import machine, release_memory
    from grammarrl.decoding.cascade import supports_cascade
    from grammarrl.models.loading import resolve_device, resolve_dtype
    from grammarrl.runs.atomic import write_json

    quiet_logging()
    if not args.tiny and not torch.cuda.is_available():
        parser.error("the full check needs a CUDA device (Llama-3.2-1B's shapes); --tiny on CPU")
    mode = "tiny" if args.tiny else "full"
    sizes = MODES[mode]
    data = device_setup.real_data(assets)
    overrides = [
        "task=conll",
        f"data.dir={data or 'null'}",
        f"optim.batch_size={sizes['batch_size']}",
        f"task.max_new_tokens={sizes['max_new_tokens']}",
    ]
    bench = bench_class()(model=sizes["model"], overrides=overrides, repeats=1)
    bench.assets = assets
    cfg = bench.config()
    device = resolve_device(cfg.device)
    out = Path(
        args.out or device_setup.REPO / "benchmarks" / "results" / f"device-{gpu_slug()}.json"
    )
    report: dict[str, Any] = {
        "mode": mode,
        "machine": machine(),
        "settings": {
            **sizes,
            "steps": STEPS,
            "num_samples": int(cfg.rollout.num_samples),
            "beam_width": int(cfg.rollout.beam_width),
            "device": device.type,
            "dtype": str(resolve_dtype(cfg.model.dtype, device)).removeprefix("torch."),
            "prompts": "real CoNLL (carried)" if data else "bundled samples",
            "packages": package_versions(),
            # the data folder relative to the repository: no machine's path in a results file
            "overrides": [o.replace(f"{device_setup.REPO}/", "") for o in overrides],
        },
        "setup": {"seconds": round(setup_s, 1), "installed": installed},
        "paper_step_s": list(PAPER_STEP_S),
        "goal_step_s": [round(s * GOAL_SHARE, 1) for s in PAPER_STEP_S],
    }

    def save(done: str) -> None:
        """Write what is measured so far (a later section that fails keeps the earlier ones)."""
        report["total_s"] = round(time.perf_counter() - started, 1)
        write_json(out, report)
        print(f"[{report['total_s']:6.1f} s] {done}", flush=True)

    try:
        report["tests"] = None if args.skip_tests else run_cuda_tests(assets)
        save("cuda tests" if report["tests"] is not None else "cuda tests left out")
        module, report["rl_step"] = rl_steps(bench, assets)
        report["settings"]["cascade_attention"] = supports_cascade(module.policy)
        save(f"{STEPS} RL steps")
        report["eval"] = greedy_eval(bench, module, sizes)
        del module
        release_memory()
        save("greedy evaluation")
    except Exception as err:
        report["error"] = f"{type(err).__name__}: {str(err)[:2000]}"
        save(f"stopped: {report['error'][:200]}")
        raise
    print(f"{table(report)}; wrote {out}")
    tests = report["tests"]
    failed = tests is not None and (tests["failed"] or tests["returncode"] not in (0, 5))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
