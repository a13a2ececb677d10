"""Write the committed adapters' weights back from git history (`make adapters`):

    python -m experiments.restore_adapters [--manifest experiments/results/adapters.json]

The float32 LoRA weights the write-ups rely on (78 MB each) are kept out of the tracked tree, so
that a checkout stays small and the GPU check can copy it; their bytes live on in the history.
Each entry of the manifest names a weights file, its git blob and its SHA-256: a file already in
place with that hash is kept, any other is written again from the blob and checked. A shallow
clone lacks the blobs (`git fetch --unshallow` first). Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MANIFEST = Path("experiments/results/adapters.json")


class RestoreError(RuntimeError):
    """A weights file that cannot be restored, with what to do."""


def sha256(path: Path) -> str:
    """The file's SHA-256 (hex)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(root: Path, *args: str, check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], check=check, **kwargs)


def restore(entry: dict[str, Any], root: Path) -> str:
    """Put one manifest entry's file in place under `root`: "present" or "restored"."""
    target = root / entry["path"]
    if target.is_file() and sha256(target) == entry["sha256"]:
        return "present"
    if _git(root, "cat-file", "-e", entry["blob"], capture_output=True).returncode != 0:
        raise RestoreError(
            f"{entry['path']}: git object {entry['blob']} (commit {entry['commit'][:12]}) is not "
            f"in this clone; run `git fetch --unshallow` (a shallow clone) or clone without a "
            f"depth limit"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:
        _git(root, "cat-file", "blob", entry["blob"], stdout=out, check=True)
    if sha256(partial) != entry["sha256"]:
        partial.unlink()
        raise RestoreError(f"{entry['path']}: blob {entry['blob']} does not match its SHA-256")
    partial.replace(target)
    return "restored"


def restore_all(manifest: Path, root: Path) -> dict[str, str]:
    """Every entry of the manifest restored under `root`: path -> "present" | "restored"."""
    entries = json.loads(manifest.read_text())["adapters"]
    return {entry["path"]: restore(entry, root) for entry in entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository's root")
    args = parser.parse_args(argv)
    try:
        done = restore_all(args.root / args.manifest, args.root)
    except RestoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(done, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
