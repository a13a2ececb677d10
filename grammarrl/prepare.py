"""`mode=prepare task=T`: build and cache what a task needs, check it, print a summary.

Loads the splits and the vocabulary, computes the hints of every split input (cached under
cache_dir/hints), writes the grammar to cache_dir/grammars, compiles it with the model's
tokenizer and checks that every gold output of every split of the corpus is accepted.
The last line printed is one JSON object:
{"task", "splits": {name: size}, "vocab_size", "gold_accepted", "gold_total", "skipped_rows"}.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from grammarrl.models.loading import load_tokenizer
from grammarrl.tasks import load_task
from grammarrl.tasks.grammar_check import GrammarChecker

log = logging.getLogger(__name__)


def run_prepare(cfg: DictConfig) -> dict[str, Any]:
    started = time.perf_counter()
    task = load_task(cfg)
    splits = task.splits()
    sizes = {
        "train": len(splits.train),
        "dev": len(splits.dev),
        "fewshot": len(splits.fewshot),
        "test_pool": len(splits.test_pool),
    }
    source = getattr(task, "root", None) or f"hub ({cfg.data.source})"
    print(f"task {task.name}: data from {source}")
    print(f"  splits: {', '.join(f'{name} {size}' for name, size in sizes.items())}")
    print(f"  vocabulary: {task.vocab_size()}")

    new_hints = task.prepare_hints() if hasattr(task, "prepare_hints") else 0
    index = getattr(task, "hint_index", None)
    if index is not None:
        print(f"  hints: k={index.k} by {index.embedder}, {new_hints} new, cached in {index.path}")

    grammar = task.grammar()
    grammar_file = Path(str(cfg.cache_dir)) / "grammars" / f"{task.name}-{task.data_key}.lark"
    grammar_file.parent.mkdir(parents=True, exist_ok=True)
    grammar_file.write_text(grammar, encoding="utf-8")
    tokenizer = load_tokenizer(cfg.model, cfg.cache_dir)
    compile_start = time.perf_counter()
    checker = GrammarChecker(grammar, tokenizer)
    print(
        f"  grammar: {len(grammar):,} characters, compiled in "
        f"{time.perf_counter() - compile_start:.2f} s, written to {grammar_file}"
    )

    golds = [ex.target for pool in task.corpus.values() for ex in pool]
    rejected = set(checker.rejected(golds))
    accepted = sum(target not in rejected for target in golds)
    print(f"  gold outputs accepted by the grammar: {accepted}/{len(golds)}")
    for target in sorted(rejected)[:5]:
        print(f"    rejected: {target[:200]!r}")
    skipped = dict(splits.skipped)
    print(f"  rows left out: {skipped or 'none'}")
    print(f"  done in {time.perf_counter() - started:.1f} s")

    summary = {
        "task": task.name,
        "splits": sizes,
        "vocab_size": task.vocab_size(),
        "gold_accepted": accepted,
        "gold_total": len(golds),
        "skipped_rows": skipped,
    }
    print(json.dumps(summary))
    return summary
