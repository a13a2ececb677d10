"""Keep a trained adapter in the repository's history, in bfloat16, out of its tree:

    python -m experiments.keep_adapter copy ADAPTER_DIR DEST_DIR     # bf16 weights + config
    git add -f DEST_DIR && git commit -m "..."                        # the weights enter history
    python -m experiments.keep_adapter record DEST_DIR --what "..."  # its manifest entry
    git rm --cached DEST_DIR/adapter_model.safetensors
    git add experiments/results/adapters.json && git commit -m "..."  # and leave the tree

(commit the index, not paths: `git commit -- PATH` would add the weights file back from disk.)
`copy` writes DEST_DIR/adapter_model.safetensors with every floating tensor rounded to
bfloat16 (half the float32 size; PEFT loads it into the LoRA layers' own dtype), beside the
adapter's `adapter_config.json` (PEFT's generated model card is left out: it names this
machine's cache path). `record` adds (or replaces) the weights file's entry in
`experiments/results/adapters.json` from the commit that holds it (HEAD): its blob, SHA-256 and
size, so that `make adapters` restores it. Outputs decoded with the bfloat16 copy can differ
slightly from the float32 adapter the training run evaluated.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from experiments.restore_adapters import MANIFEST, sha256

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def copy_bf16(adapter: Path, dest: Path) -> Path:
    """The adapter's files in `dest`, its weights rounded to bfloat16."""
    for name in (WEIGHTS, CONFIG):
        if not (adapter / name).is_file():
            raise SystemExit(f"error: {adapter / name} does not exist (not a saved adapter)")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(adapter / CONFIG, dest / CONFIG)
    tensors = {
        name: t.to(torch.bfloat16) if t.is_floating_point() else t
        for name, t in load_file(adapter / WEIGHTS).items()
    }
    save_file(tensors, dest / WEIGHTS, metadata={"format": "pt"})
    return dest / WEIGHTS


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"error: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def record(dest: Path, what: str, root: Path, manifest: Path = MANIFEST) -> dict:
    """The manifest entry of `dest`'s weights as HEAD holds them, added to the manifest."""
    path = (dest / WEIGHTS).resolve().relative_to(root.resolve()).as_posix()
    blob = _git(root, "rev-parse", f"HEAD:{path}")
    if _git(root, "hash-object", path) != blob:
        raise SystemExit(f"error: {path} differs from the copy HEAD holds; commit it first")
    entry = {
        "path": path,
        "blob": blob,
        "commit": _git(root, "rev-parse", "HEAD"),
        "sha256": sha256(root / path),
        "bytes": (root / path).stat().st_size,
        "what": what,
    }
    table = json.loads((root / manifest).read_text())
    table["adapters"] = [e for e in table["adapters"] if e["path"] != path] + [entry]
    (root / manifest).write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    copy = commands.add_parser("copy", help="the adapter's files, its weights in bfloat16")
    copy.add_argument("adapter", type=Path)
    copy.add_argument("dest", type=Path)
    keep = commands.add_parser("record", help="the committed weights' manifest entry")
    keep.add_argument("dest", type=Path)
    keep.add_argument("--what", required=True, help="what the adapter is, in one line")
    keep.add_argument("--root", type=Path, default=Path("."), help="the repository's root")
    args = parser.parse_args(argv)
    if args.command == "copy":
        written = copy_bf16(args.adapter, args.dest)
        print(json.dumps({"written": str(written), "bytes": written.stat().st_size}))
    else:
        print(json.dumps(record(args.dest, args.what, args.root), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
