"""Public Hugging Face hub datasets (`data.source=hub`; needs internet, not used offline).

They return the same `Row`s as the local readers. ASLG-PC12 on the hub is one unsplit pool,
so it is split here with a fixed seed into the corpus' split sizes.
"""

from __future__ import annotations

import random
from typing import Any

from grammarrl.data.sources import Row, SkipLog
from grammarrl.errors import DataError

HUB_IDS = {"gloss": "achrafothman/aslg_pc12", "conll": "eriktks/conll2003"}
ASLG_DEV, ASLG_TEST = 2045, 2046  # the sizes of the corpus' own dev and test files


def _load(name: str, **kwargs: Any) -> Any:
    try:
        from datasets import load_dataset

        return load_dataset(name, **kwargs)
    except Exception as err:  # network, auth or format errors all mean: no data
        raise DataError(f"cannot load the hub dataset {name}: {err}") from err


def hub_rows(task: str, skips: SkipLog, seed: int = 0) -> list[Row]:
    """All rows of a task's public hub dataset."""
    if task == "gloss":
        pool = _load(HUB_IDS["gloss"], split="train")
        order = list(range(len(pool)))
        random.Random(seed).shuffle(order)
        split_of = {i: "test" for i in order[:ASLG_TEST]}
        split_of.update({i: "dev" for i in order[ASLG_TEST : ASLG_TEST + ASLG_DEV]})
        return [
            Row(
                split_of.get(i, "train"),
                {"text": r["text"], "gloss": r["gloss"]},
                f"{HUB_IDS['gloss']}:train:{i}",
            )
            for i, r in enumerate(pool)
        ]
    if task == "conll":
        data = _load(HUB_IDS["conll"], revision="refs/convert/parquet")
        rows = []
        for split, hub_split in (("train", "train"), ("dev", "validation"), ("test", "test")):
            names = data[hub_split].features["ner_tags"].feature.names
            for i, r in enumerate(data[hub_split]):
                tags = [names[t] for t in r["ner_tags"]]
                rows.append(
                    Row(
                        split,
                        {"tokens": list(r["tokens"]), "tags": tags},
                        f"{HUB_IDS['conll']}:{hub_split}:{i}",
                    )
                )
        return rows
    raise DataError(
        f"task {task}: no public hub dataset carries the WoS label names; put wos_labelled.jsonl "
        "and label_counts_raw_145.json under data.dir/wos (see docs/tasks.md) and use data.source=local"
    )
