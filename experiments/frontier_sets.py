"""The frontier study's test file for the CoNLL persons task: the persons of the sentences of
CoNLL's own frontier draw (seed 3 under the disjoint drawing, 3 sets × 100), so that the persons
row sees no CoNLL test sentence outside the draw the study was given:

    python -m experiments.frontier_sets [--seed 3] [OVERRIDES ...]   # data.dir, cache_dir

Reads the built-in conll task's draw and `<cache>/examples/conll_persons/test.jsonl` (written by
examples/conll_persons/make_data.py), writes `<cache>/examples/conll_persons/test_frontier.jsonl`
in the draw's order; evaluate with `task.test=<cache>/examples/conll_persons/test_frontier.jsonl`.
A sentence of the draw missing from the persons rows is an error, not a smaller file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grammarrl.job import compose_job_config
from grammarrl.tasks import load_task

FOLDER = Path("examples") / "conll_persons"
SETS, SIZE = 3, 100  # the study's draw of CoNLL (experiments/results/frontier/plan.yaml)


def line_key(uid: str) -> str:
    """`conll2003/test.txt:LINE` of an example id or a row's source, whatever precedes it."""
    name, line = uid.rsplit(":", 1)
    return f"{Path(name).parent.name}/{Path(name).name}:{line}"


def frontier_rows(seed: int, overrides: list[str]) -> tuple[list[dict], Path]:
    """The persons rows of CoNLL's draw at `seed`, in its order, and the folder they go to."""
    cfg = compose_job_config(["task=conll", *overrides])
    draw = [ex for test_set in load_task(cfg).test_sets(SETS, SIZE, seed) for ex in test_set]
    folder = Path(str(cfg.cache_dir)) / FOLDER
    if not (folder / "test.jsonl").is_file():
        raise SystemExit(
            f"error: {folder / 'test.jsonl'} does not exist; run "
            "examples/conll_persons/make_data.py first (same data.dir and cache_dir)"
        )
    rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    by_line = {line_key(row["source"]): row for row in rows}
    missing = [ex.uid for ex in draw if line_key(ex.uid) not in by_line]
    if missing:
        raise SystemExit(
            f"error: {len(missing)} sentences of the draw are not in {folder / 'test.jsonl'} "
            f"(first: {missing[0]}); run examples/conll_persons/make_data.py"
        )
    return [by_line[line_key(ex.uid)] for ex in draw], folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="data.dir=..., cache_dir=...")
    args = parser.parse_args(argv)
    rows, folder = frontier_rows(args.seed, args.overrides)
    out = folder / "test_frontier.jsonl"
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    named = sum(bool(row["output"]["persons"]) for row in rows)
    print(json.dumps({"file": str(out), "rows": len(rows), "with_persons": named}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
