"""The paper's split policy, shared by all tasks.

From pools `train`, `dev`, `test` of normalised examples:
- the test pool is the `test` pool as is (test sets are drawn from it later, one seed each);
- few-shot demonstrations are chosen deterministically (by the task) from the train pool;
- `train` is a seeded sample of the rest of the train pool (task.train_size; null: all of it);
- `dev` (calibration inputs) is a seeded sample of the dev pool (task.dev_size); the rest of the
  dev pool, in a seeded order, is kept as `dev_reserve` for validation slices larger than `dev`.
Train, dev and few-shot are de-duplicated by input and disjoint from each other and from the test
pool's inputs. A pool smaller than the configured size is used whole, and that is logged.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

from grammarrl.data.sources import SkipLog
from grammarrl.types import Example, Splits

log = logging.getLogger(__name__)

FewshotPicker = Callable[[list[Example], int], list[Example]]


def seeded_sample(pool: Sequence[Example], size: int | None, seed: int, what: str) -> list[Example]:
    """`size` examples of `pool` drawn with `seed` (in pool order), or all of them if fewer
    (logged) or `size` is None."""
    if size is None or size >= len(pool):
        if size is not None and size > len(pool):
            log.warning(
                "%s: %d examples wanted, only %d available: using all", what, size, len(pool)
            )
        return list(pool)
    chosen = set(random.Random(seed).sample(range(len(pool)), size))
    return [example for i, example in enumerate(pool) if i in chosen]


def unique_inputs(pool: Sequence[Example], exclude: set[str]) -> tuple[list[Example], int]:
    """The first example of each input not in `exclude`, and how many were left out."""
    seen = set(exclude)
    kept = []
    for example in pool:
        if example.input not in seen:
            seen.add(example.input)
            kept.append(example)
    return kept, len(pool) - len(kept)


def partition(
    pool: Sequence[Example], dev_size: int, test_fraction: float, seed: int
) -> dict[str, list[Example]]:
    """Split one labelled pool (WoS) into train/dev/test pools, deterministically by `seed`.

    Dev takes `dev_size` examples (at most a tenth of a small pool; `make_splits` says when it
    got fewer than task.dev_size), then the test pool takes `test_fraction` of the rest and the
    train pool what remains.
    """
    order = list(pool)
    random.Random(seed).shuffle(order)
    n_dev = min(dev_size, len(order) // 10)
    dev, rest = order[:n_dev], order[n_dev:]
    n_test = round(test_fraction * len(rest))
    return {"dev": dev, "test": rest[:n_test], "train": rest[n_test:]}


def make_splits(
    pools: dict[str, list[Example]],
    *,
    train_size: int | None,
    dev_size: int,
    num_fewshot: int,
    pick_fewshot: FewshotPicker,
    seed: int,
    skips: SkipLog,
    task: str,
) -> Splits:
    """Apply the split policy to the task's train/dev/test pools."""
    test_pool = list(pools["test"])
    test_inputs = {example.input for example in test_pool}
    train_pool, n_train_out = unique_inputs(pools["train"], test_inputs)
    fewshot = pick_fewshot(train_pool, num_fewshot) if num_fewshot else []
    if len(fewshot) < num_fewshot:
        log.warning("%s few-shot: %d wanted, only %d available", task, num_fewshot, len(fewshot))
    fewshot_inputs = {example.input for example in fewshot}
    rest = [example for example in train_pool if example.input not in fewshot_inputs]
    train = seeded_sample(rest, train_size, seed, f"{task} train")
    used = test_inputs | fewshot_inputs | {example.input for example in train}
    dev_pool, n_dev_out = unique_inputs(pools["dev"], used)
    dev = seeded_sample(dev_pool, dev_size, seed + 1, f"{task} dev")
    chosen = set(dev)
    dev_reserve = [example for example in dev_pool if example not in chosen]
    random.Random(seed + 2).shuffle(dev_reserve)
    skips.drop("duplicate_or_test_input", n_train_out + n_dev_out)
    log.info(
        "%s splits: train %d, dev %d, few-shot %d, test pool %d",
        task,
        len(train),
        len(dev),
        len(fewshot),
        len(test_pool),
    )
    return Splits(
        train=train,
        dev=dev,
        fewshot=fewshot,
        test_pool=test_pool,
        skipped=skips.as_dict(),
        dev_reserve=dev_reserve,
    )
