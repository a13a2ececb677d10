"""A Lightning callback for the DDP tests (`callbacks`): each rank appends, per step, the
inputs it trained on, a digest of its sampling stream before the step and of its adapter after
the optimizer step, to `<out>/rank<r>.jsonl`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import lightning as L


def digest(*tensors: Any) -> str:
    sha = hashlib.sha1()
    for tensor in tensors:
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


class RankProbe(L.Callback):
    def __init__(self, out: str):
        self.out = Path(out)
        self.row: dict[str, Any] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.row = {
            "step": trainer.global_step,
            "uids": [ex.uid for ex in batch],
            "stream": digest(pl_module.generator.get_state()),
        }

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        params = [p for _, p in sorted(pl_module.named_parameters()) if p.requires_grad]
        self.row["adapter"] = digest(*params)
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(self.row) + "\n")
