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
        --out experiments/results/evidence3-spans/adapter-360
    python -m experiments.studies.evidence3_spans --report --out experiments/results/evidence3-spans/adapter-360

Without --adapter the frozen model is the policy (its KL term is 0). The report also re-weighs
the same spans for other λ (`by_lambda`): which spans the reward itself prefers to keep at each
mixing, at this adapter's outputs (not what training at that λ would produce).
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


def term_weights(lam: float, sigmas: tuple[float, float]) -> dict[str, float]:
    """The reward's weights of R_direct and R_reverse: (1−λ)/σ_direct and λ/σ_reverse."""
    return {"direct": (1 - lam) / sigmas[0], "reverse": lam / sigmas[1]}


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
    policy: torch.nn.Module | None, tokenizer: Any, scorer: ReferenceScorer, example: Example, texts
) -> dict[str, torch.Tensor]:
    """R_direct, R_reverse, log π_ref and log π_θ of each text (`policy` with its adapter;
    None: the frozen model is the policy, log π_θ = log π_ref)."""
    prompt = encode_prompt(tokenizer, scorer.task.forward_messages(example))
    stop = end_of_turn_id(tokenizer)
    ids = [tokenizer.encode(t, add_special_tokens=False) + [stop] for t in texts]
    ref = scorer.score(example, prompt, ids, list(texts))
    own = ref.ref_logp
    if policy is not None:
        with torch.no_grad():
            logps = sequence_logprobs(policy, [prompt + c for c in ids], [len(prompt)] * len(ids))
        own = torch.stack([lp.sum() for lp in logps])
    return {
        "direct": ref.direct.float(),
        "reverse": ref.reverse.float(),
        "ref_logp": ref.ref_logp.float(),
        "policy_logp": own.float(),
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


def by_lambda(
    rows: Sequence[Mapping[str, Any]],
    weights: Mapping[str, float],
    sigmas: tuple[float, float],
    lambdas: Sequence[float],
) -> list[dict[str, float]]:
    """Per λ: the share of right and of wrong spans the reward (without and with the run's KL
    term) prefers to keep, at the same outputs and adapter: the rows' terms re-weighted,
    (1−λ)/σ_direct and λ/σ_reverse in place of the run's `weights`."""
    out = []
    for lam in lambdas:
        new = term_weights(lam, sigmas)
        row: dict[str, float] = {"lambda": lam}
        for name, right in (("right", True), ("wrong", False)):
            chosen = [r for r in rows if r["right"] == right]
            paid = [sum(r[t] * new[t] / weights[t] for t in new) for r in chosen]
            n = max(len(chosen), 1)
            row[f"{name} kept without KL"] = sum(p > 0 for p in paid) / n
            row[f"{name} kept"] = sum(p + r["kl"] > 0 for p, r in zip(paid, chosen)) / n
        out.append(row)
    return out


def lambda_markdown(table: Sequence[Mapping[str, float]]) -> str:
    """`by_lambda` as a table."""
    head = ["λ", "right kept", "right kept without KL", "wrong kept", "wrong kept without KL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        cells = [f"{row['lambda']:.2f}"] + [f"{row[h]:.2f}" for h in head[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(found: Mapping[str, Mapping[str, float]]) -> str:
    """`summary` as a table."""
    lines = ["| split | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, row in found.items():
        cells = [f"{int(row['spans'])}"] + [f"{row[c]:+.3f}" for c in COLUMNS[1:5]]
        cells += [f"{row['kept']:.2f}", f"{row['kept without KL']:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def report(out: Path) -> str:
    """spans.md from a scored folder's spans.jsonl and spans.json: the summary, and the shares
    kept by λ (the run's σ's and β, from its config)."""
    settings = json.loads((out / "spans.json").read_text(encoding="utf-8"))["settings"]
    rows = [json.loads(line) for line in (out / "spans.jsonl").read_text("utf-8").splitlines()]
    cfg = run_config(Path(settings["run"]))
    weights = {t: settings[t] for t in ("direct", "reverse")}
    sigmas = (cfg.reward.sigma_direct, cfg.reward.sigma_reverse)
    text = markdown(summary(rows)) + "\nShares kept by λ (the same outputs, re-weighted):\n\n"
    text += lambda_markdown(by_lambda(rows, weights, sigmas, LAMBDAS))
    (out / "spans.md").write_text(text, encoding="utf-8")
    return text


def score_run(run: Path, step: int | None, adapter: Path | None, limit: int | None, out: Path):
    """Score every span of the run's dev outputs at `step` (module docstring) into `out`:
    spans.jsonl (one row per span) and spans.json (settings, summary)."""
    from tqdm.auto import tqdm

    from grammarrl.models.loading import load_adapter, load_model
    from grammarrl.tasks import load_task

    cfg = run_config(run)
    task = load_task(cfg)
    examples = dev_examples(run)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    policy = load_adapter(model, adapter).eval() if adapter is not None else None
    scorer = ReferenceScorer(policy if policy is not None else model, tokenizer, task)
    sigmas = (cfg.reward.sigma_direct, cfg.reward.sigma_reverse)
    weights = {**term_weights(cfg["lambda"], sigmas), "beta": cfg.beta}
    records = dev_rows(run, step)[:limit]

    def score(record, texts):
        return score_variants(policy, tokenizer, scorer, examples[record["uid"]], texts)

    golds = {uid: ex.target for uid, ex in examples.items()}
    rows = span_rows(tqdm(records, desc="dev outputs", unit="ex"), score, weights, golds)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "spans.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    meta = {"run": str(run), "step": step, "adapter": str(adapter) if adapter else None, **weights}
    meta["outputs"] = len(records)
    text = json.dumps({"settings": meta, "summary": summary(rows)}, indent=1)
    (out / "spans.json").write_text(text + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, nargs="?", help="a run directory (or its files)")
    parser.add_argument("--step", type=int, help="the validation step (default: the last)")
    parser.add_argument(
        "--adapter", type=Path, help="the policy's adapter (none: the frozen model)"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for spans.md/jsonl/json")
    parser.add_argument("--limit", type=int, help="only the first N outputs (a smoke run)")
    parser.add_argument("--report", action="store_true", help="only rewrite spans.md from --out")
    args = parser.parse_args(argv)
    if not args.report:
        if args.run is None:
            parser.error("a run directory is needed to score (or --report)")
        score_run(args.run, args.step, args.adapter, args.limit, args.out)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
