"""Where the frozen model's mass leaks off the grammar, candidate by candidate: what a KL to the
grammar-restricted reference (`kl_penalty=grammar`) charges longer outputs, next to what the
reward pays them.

    python -m experiments.grammar_mass +experiment=evidence2_cpu lambda=0.75 [--dev 24]

On the first `--dev` dev inputs, the rollout groups calibration draws (`calibration.dev_rollouts`:
N samples + beam top-1 of the frozen model), and per candidate: its tokens, its non-empty output
fields (`task.parse`), leak = Σ_t log π_ref(V_t | x, y_<t) (so log q_ref(y) − log π_ref(y) =
−leak, the grammar KL penalty's value at step 0 divided by β) and the combined reward under
`lambda` and `reward.sigma_direct`/`sigma_reverse` (when unset, the σ's of these groups).
Summary: within-group least-squares slopes (each group centred, so they compare candidates of
one input, as RLOO does) of −leak and of the reward on the field count and on the token count.
Writes JSON to `--out` and stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from grammarrl.job import compose_job_config, validate
from grammarrl.models.loading import load_model
from grammarrl.rl.calibration import CalibrationSettings, dev_rollouts, within_group_std
from grammarrl.rl.rloo import combine_rewards
from grammarrl.tasks import load_task
from grammarrl.training.policy import summed_per_candidate


def within_group_slope(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> float | None:
    """Least-squares slope of y on x after centring both within each group (rows) over its
    valid candidates; None when x does not vary within any group."""
    weight = valid.to(x.dtype)
    count = weight.sum(-1, keepdim=True).clamp(min=1)
    xc = (x - (x * weight).sum(-1, keepdim=True) / count) * weight
    yc = (y - (y * weight).sum(-1, keepdim=True) / count) * weight
    spread = float((xc * xc).sum())
    return float((xc * yc).sum()) / spread if spread > 0 else None


def filled_fields(task: Any, text: str) -> float:
    """Non-empty fields of an output (`task.parse` gives a dict of fields); NaN when it does
    not parse (an output cut at the token limit) or is not a dict."""
    try:
        parsed = task.parse(text)
    except ValueError:
        return float("nan")
    return float(sum(1 for v in parsed.values() if v)) if isinstance(parsed, dict) else float("nan")


def measure(cfg: Any, dev_size: int) -> dict[str, Any]:
    """Rollout groups of the frozen model on the dev inputs, per candidate and summarised."""
    task = load_task(cfg)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    dev = task.splits().dev[:dev_size]
    settings = CalibrationSettings.from_config(cfg)
    batches = dev_rollouts(settings, model, tokenizer, task, dev, "rollout groups")
    groups = [group for batch in batches for group in batch.groups]
    fields = torch.tensor([[filled_fields(task, g.text) for g in group] for group in groups])
    scored = torch.cat([b.valid for b in batches])
    valid = scored & ~fields.isnan()  # scored and parsed: cut outputs are left out
    fields = fields.nan_to_num(0.0)
    direct = torch.cat([b.direct for b in batches])
    reverse = torch.cat([b.reverse for b in batches])
    sigmas = (cfg.reward.sigma_direct, cfg.reward.sigma_reverse)
    if None in sigmas:  # not given: those of these groups, as calibration measures them
        sigmas = within_group_std(direct, valid), within_group_std(reverse, valid)
    reward = combine_rewards(direct, reverse, cfg["lambda"], *sigmas)
    leak = summed_per_candidate(groups, "log_allowed_mass")
    tokens = torch.tensor([[float(len(g.token_ids)) for g in group] for group in groups])
    slopes = {
        f"{name}_per_{unit}": within_group_slope(x, y, valid)
        for name, y in (("grammar_kl_at_step_0", -leak), ("reward", reward))
        for unit, x in (("field", fields), ("token", tokens))
    }
    return {
        "task": cfg.task.name,
        "model": cfg.model.name,
        "lambda": cfg["lambda"],
        "dev_inputs": len(dev),
        "candidates": int(valid.sum()),
        "left_out_unparsed": int((scored & ~valid).sum()),
        "sigmas": {"sigma_direct": sigmas[0], "sigma_reverse": sigmas[1]},
        "mean_grammar_kl_at_step_0": float((-leak)[valid].mean()),
        "mean_tokens": float(tokens[valid].mean()),
        "within_group_reward_std": float(within_group_std(reward, valid)),
        "within_group_slopes": slopes,
        "candidates_by_input": [
            [
                {
                    "text": g.text,
                    "tokens": int(t),
                    "fields": int(f),
                    "leak": round(float(lk), 3),
                    "reward": round(float(r), 4),
                }
                for g, t, f, lk, r, ok in zip(group, *rows, keep)
                if ok
            ]
            for group, *rows, keep in zip(groups, tokens, fields, leak, reward, valid)
        ],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. +experiment=evidence2_cpu"
    )
    parser.add_argument("--dev", type=int, default=24, help="dev inputs")
    parser.add_argument("--out", default="grammar_mass.json")
    args = parser.parse_args(argv)
    cfg = compose_job_config(args.overrides)
    validate(cfg)
    report = {"overrides": args.overrides, **measure(cfg, args.dev)}
    text = json.dumps(report, indent=2, ensure_ascii=False)
    Path(args.out).write_text(text + "\n")
    summary = {k: v for k, v in report.items() if k != "candidates_by_input"}
    print(json.dumps(summary, indent=2))
    return report


if __name__ == "__main__":
    main()
