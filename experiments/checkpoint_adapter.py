"""Save a training run's checkpoint (its LoRA weights) as a PEFT adapter directory, to evaluate
an interrupted run with `mode=eval eval.adapter=DIR`:

    python -m experiments.checkpoint_adapter RUN_DIR OUT_DIR

RUN_DIR is a `mode=train` job directory; its `checkpoints/last.ckpt` holds the LoRA weights and
the config the run trained with. OUT_DIR also gets `checkpoint_step.json` (the run and the
global step the weights are from)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from grammarrl.models.loading import add_lora, load_model
from grammarrl.runs.results import adapter_name
from grammarrl.training.callbacks import RUN_RECORD
from grammarrl.training.policy import save_adapter


def checkpoint_adapter(run: Path, out: Path) -> int:
    """Write the adapter of `run`'s last checkpoint to `out`; returns its global step."""
    checkpoint = torch.load(
        run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False
    )
    cfg = OmegaConf.create(checkpoint[RUN_RECORD]["config"])
    model, _ = load_model(cfg.model, cfg.cache_dir, "cpu")
    policy = add_lora(model, cfg.lora)
    state = {k.removeprefix("policy."): v for k, v in checkpoint["state_dict"].items()}
    missing, unexpected = policy.load_state_dict(state, strict=False)
    lora_missing = [k for k in missing if "lora_" in k]
    if unexpected or lora_missing:
        raise ValueError(
            f"{run}: the checkpoint does not fit this LoRA config "
            f"(unexpected {unexpected[:3]}, missing {lora_missing[:3]})"
        )
    save_adapter(policy, out)
    step = int(checkpoint["global_step"])
    (out / "checkpoint_step.json").write_text(
        json.dumps({"run": adapter_name(run), "global_step": step})
    )
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    step = checkpoint_adapter(args.run, args.out)
    print(f"wrote {args.out} (step {step})")


if __name__ == "__main__":
    main()
