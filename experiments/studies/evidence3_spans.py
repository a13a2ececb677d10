"""Evidence III, part 1 (issue 45): what each term of the shaped reward pays for one span.

For every dev output of a trained adapter at one validation step of a run's record, and every
field it fills, the output with that field emptied is scored the way an RLOO step scores its
candidates: R_direct and R_reverse under the frozen reference, log π_θ(y|x) under the adapter
and log π_ref(y|x) (both unconstrained, teacher-forced on the re-tokenised output plus the end
of turn). The difference full − emptied of each term of the shaped reward

    r − β·(log π_θ − log π_ref),   r = (1−λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse

is what that term pays for keeping the span (λ, β, σ's: the run's). Spans are split by whether
they are right (the gold's value for the field) or wrong; per split, the mean payment of each
term, and the share of spans the whole shaped reward (and the reward without the KL term) would
keep.

    python -m experiments.studies.evidence3_spans experiments/results/evidence3-pilot --step 0 \\
        --adapter experiments/results/smollm2-cpu-2/adapter-lambda0.75-kl-reward-360steps \\
        --out experiments/results/evidence3-spans
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from experiments.dev_selection import dev_rows
from experiments.studies.evidence3 import dev_examples, run_config
from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.tasks.conll import FIELDS, conll_target, output_fields
from grammarrl.types import Example

TERMS = ("direct", "reverse", "kl")  # the shaped reward's terms, in `payments`' order
COLUMNS = ("spans", "direct", "reverse", "kl", "total", "kept", "kept without KL")


def variants(prediction: str) -> list[tuple[str | None, str]]:
    """(emptied field, output text): the output as is (None), then with each filled field
    emptied, in the task's own serialisation."""
    fields = output_fields(prediction)
    out: list[tuple[str | None, str]] = [(None, conll_target(fields))]
    out += [(f, conll_target({**fields, f: ""})) for f in FIELDS if fields[f]]
    return out


def payments(scores: Mapping[str, torch.Tensor], weights: Mapping[str, float]) -> torch.Tensor:
    """[variants, terms]: each variant's direct, reverse and KL term of the shaped reward."""
    return torch.stack(
        [
            weights["direct"] * scores["direct"],
            weights["reverse"] * scores["reverse"],
            -weights["beta"] * (scores["policy_logp"] - scores["ref_logp"]),
        ],
        dim=1,
    )


def score_variants(
    policy: torch.nn.Module, tokenizer: Any, scorer: ReferenceScorer, example: Example, texts
) -> dict[str, torch.Tensor]:
    """R_direct, R_reverse, log π_ref and log π_θ of each text (`policy` with its adapter)."""
    prompt = encode_prompt(tokenizer, scorer.task.forward_messages(example))
    stop = end_of_turn_id(tokenizer)
    ids = [tokenizer.encode(t, add_special_tokens=False) + [stop] for t in texts]
    ref = scorer.score(example, prompt, ids, list(texts))
    with torch.no_grad():
        own = sequence_logprobs(policy, [prompt + c for c in ids], [len(prompt)] * len(ids))
    return {
        "direct": ref.direct.float(),
        "reverse": ref.reverse.float(),
        "ref_logp": ref.ref_logp.float(),
        "policy_logp": torch.stack([lp.sum() for lp in own]).float(),
    }


def span_rows(
    records: Sequence[Mapping[str, Any]], score, weights: Mapping[str, float], golds
) -> list[dict[str, Any]]:
    """One row per filled field of each record's output: its value, right or wrong, and what
    each term pays for it (full − emptied). `score(record, texts)` scores a record's variants."""
    rows = []
    for record in records:
        found = variants(record["prediction"])
        paid = payments(score(record, [text for _, text in found]), weights)
        gold = output_fields(golds[record["uid"]])
        full = output_fields(record["prediction"])
        for index, (field, _) in enumerate(found[1:], start=1):
            diff = (paid[0] - paid[index]).tolist()
            rows.append(
                {
                    "uid": record["uid"],
                    "field": field,
                    "value": full[field],
                    "right": full[field] == gold[field],
                    **dict(zip(TERMS, diff)),
                }
            )
    return rows


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per split (right, wrong, all): spans, mean payment per term and in total, and the share
    of spans the shaped reward keeps (total > 0) and would keep without its KL term."""
    out = {}
    for name, keep in (("right", True), ("wrong", False), ("all", None)):
        chosen = [r for r in rows if keep is None or r["right"] == keep]
        n = len(chosen)
        mean = {t: sum(r[t] for r in chosen) / n if n else 0.0 for t in TERMS}
        totals = [sum(r[t] for t in TERMS) for r in chosen]
        out[name] = {
            "spans": n,
            **mean,
            "total": sum(totals) / n if n else 0.0,
            "kept": sum(t > 0 for t in totals) / n if n else 0.0,
            "kept without KL": sum(r["direct"] + r["reverse"] > 0 for r in chosen) / n
            if n
            else 0.0,
        }
    return out


def markdown(found: Mapping[str, Mapping[str, float]]) -> str:
    """`summary` as a table."""
    lines = ["| split | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, row in found.items():
        cells = [f"{int(row['spans'])}"] + [f"{row[c]:+.3f}" for c in COLUMNS[1:5]]
        cells += [f"{row['kept']:.2f}", f"{row['kept without KL']:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory (or its committed files)")
    parser.add_argument("--step", type=int, help="the validation step (default: the last)")
    parser.add_argument("--adapter", type=Path, required=True, help="the policy's adapter")
    parser.add_argument("--out", type=Path, required=True, help="folder for spans.md/jsonl/json")
    parser.add_argument("--limit", type=int, help="only the first N outputs (a smoke run)")
    args = parser.parse_args(argv)
    from tqdm.auto import tqdm

    from grammarrl.models.loading import load_adapter, load_model
    from grammarrl.tasks import load_task

    cfg = run_config(args.run)
    task = load_task(cfg)
    examples = dev_examples(args.run)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    policy = load_adapter(model, args.adapter)
    policy.eval()
    scorer = ReferenceScorer(policy, tokenizer, task)
    sigma = (cfg.reward.sigma_direct, cfg.reward.sigma_reverse)
    weights = {"direct": (1 - cfg["lambda"]) / sigma[0], "reverse": cfg["lambda"] / sigma[1]}
    weights["beta"] = cfg.beta
    records = dev_rows(args.run, args.step)[: args.limit]

    def score(record, texts):
        return score_variants(policy, tokenizer, scorer, examples[record["uid"]], texts)

    golds = {uid: ex.target for uid, ex in examples.items()}
    rows = span_rows(tqdm(records, desc="dev outputs", unit="ex"), score, weights, golds)
    found = summary(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "spans.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    meta = {"run": str(args.run), "step": args.step, "adapter": str(args.adapter), **weights}
    meta["outputs"] = len(records)
    text = json.dumps({"settings": meta, "summary": found}, indent=1)
    (args.out / "spans.json").write_text(text + "\n", encoding="utf-8")
    (args.out / "spans.md").write_text(markdown(found), encoding="utf-8")
    print(markdown(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
