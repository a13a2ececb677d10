"""Writes the rows of the CoNLL persons example (task.yaml) from CoNLL-2003 in the data directory.

    python examples/conll_persons/make_data.py                     # data.dir: $GRAMMARRL_DATA_DIR
    python examples/conll_persons/make_data.py data.dir=../shared/data cache_dir=/tmp/cache

Takes the overrides `python -m grammarrl.run` takes (data.dir, cache_dir). Reads
conll2003/{train,valid,test}.txt under data.dir with the built-in CoNLL task's reader
(`grammarrl.tasks.conll.read_conll`, `bio_spans`) and writes
<cache_dir>/examples/conll_persons/{train,dev,test}.jsonl, never into the repository: the
spec reads them as `<cache>/examples/conll_persons/...`. One row per sentence that has at
least one entity of any type (the sentences the built-in `conll` task keeps):

    {"sentence": "...", "output": {"persons": ["Peter Blackburn"]}, "source": "conll2003/train.txt:8"}

`persons`: each distinct PER span once, in order of first mention; [] when the sentence names
no person. Deterministic: the same data gives the same files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grammarrl.data.sources import SkipLog, data_root, relative_uid, task_dir
from grammarrl.job import compose_job_config
from grammarrl.tasks.conll import bio_spans, read_conll

FOLDER = Path("examples") / "conll_persons"  # under cache_dir
FILES = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"}


def persons_rows(data_dir: Path) -> dict[str, list[dict]]:
    """The rows of each split (train, dev, test) from data_dir/conll2003."""
    rows: dict[str, list[dict]] = {split: [] for split in FILES}
    for row in read_conll(task_dir(data_dir, "conll2003", "conll_persons"), SkipLog("conll")):
        spans = bio_spans(row.fields["tokens"], row.fields["tags"])
        if spans:
            persons = list(dict.fromkeys(span for kind, span in spans if kind == "PER"))
            rows[row.split].append(
                {
                    "sentence": " ".join(row.fields["tokens"]),
                    "output": {"persons": persons},
                    "source": relative_uid(row.where, data_dir),
                }
            )
    return rows


def main(overrides: list[str]) -> Path:
    """Write the three files under the configured cache_dir; returns their folder."""
    cfg = compose_job_config(overrides)
    if cfg.data.dir is None:
        raise SystemExit("error: data.dir is not set (give data.dir=DIR or set GRAMMARRL_DATA_DIR)")
    out = Path(str(cfg.cache_dir)) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in persons_rows(data_root(cfg.data.dir)).items():
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (out / FILES[split]).write_text(text, encoding="utf-8")
        print(f"{out / FILES[split]}: {len(rows)} sentences")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
