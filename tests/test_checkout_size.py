"""The checkout stays small (issue 53): the tracked tree under 60 MiB, the committed adapters'
weights out of it and restorable from git history by `make adapters`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from experiments.restore_adapters import MANIFEST, RestoreError, restore_all, sha256
from grammarrl.errors import ModelError
from grammarrl.models.loading import check_adapter_dir

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60 * 2**20  # the GPU check copies the working tree, at most 64 MiB


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


def in_git_checkout() -> bool:
    return (ROOT / ".git").exists()


@pytest.mark.skipif(not in_git_checkout(), reason="not a git checkout")
def test_the_tracked_tree_is_under_60_mib():
    files = [f for f in git(ROOT, "ls-files", "-z").split("\0") if f and (ROOT / f).is_file()]
    sizes = {f: (ROOT / f).stat().st_size for f in files}
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    total = sum(sizes.values())
    assert total < LIMIT, (
        f"the tracked tree is {total / 2**20:.1f} MiB (limit {LIMIT / 2**20:.0f} MiB); largest: "
        + ", ".join(f"{f} ({sizes[f] / 2**20:.1f} MiB)" for f in largest)
    )


@pytest.mark.skipif(not in_git_checkout(), reason="not a git checkout")
def test_every_listed_adapter_is_ignored_and_its_blob_is_in_the_history():
    entries = json.loads((ROOT / MANIFEST).read_text())["adapters"]
    assert entries
    tracked = set(git(ROOT, "ls-files").splitlines())
    if git(ROOT, "rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone holds no history to restore from")
    for entry in entries:
        assert entry["path"] not in tracked
        assert git(ROOT, "check-ignore", entry["path"]).strip() == entry["path"]
        assert git(ROOT, "cat-file", "-s", entry["blob"]).strip() == str(entry["bytes"])
        assert git(ROOT, "rev-parse", f"{entry['commit']}:{entry['path']}").strip() == entry["blob"]
        assert (ROOT / Path(entry["path"]).parent / "adapter_config.json").is_file()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """A git repository whose history holds a weights file no longer tracked, and its manifest."""
    git(tmp_path, "init", "-q")
    weights = tmp_path / "results" / "adapter" / "adapter_model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(bytes(range(256)) * 64)
    git(tmp_path, "add", "results")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "weights")
    entry = {
        "path": "results/adapter/adapter_model.safetensors",
        "blob": git(
            tmp_path, "rev-parse", "HEAD:results/adapter/adapter_model.safetensors"
        ).strip(),
        "commit": git(tmp_path, "rev-parse", "HEAD").strip(),
        "sha256": sha256(weights),
        "bytes": weights.stat().st_size,
    }
    git(tmp_path, "rm", "-q", "--cached", entry["path"])
    weights.unlink()
    manifest = tmp_path / "adapters.json"
    manifest.write_text(json.dumps({"adapters": [entry]}))
    return tmp_path, manifest


def test_restore_writes_the_weights_back_and_replaces_a_damaged_copy(repo):
    root, manifest = repo
    weights = root / "results" / "adapter" / "adapter_model.safetensors"
    assert restore_all(manifest, root) == {"results/adapter/adapter_model.safetensors": "restored"}
    assert weights.read_bytes() == bytes(range(256)) * 64
    assert restore_all(manifest, root) == {"results/adapter/adapter_model.safetensors": "present"}
    weights.write_bytes(b"truncated")
    assert restore_all(manifest, root) == {"results/adapter/adapter_model.safetensors": "restored"}
    assert weights.read_bytes() == bytes(range(256)) * 64


def test_a_missing_blob_or_a_wrong_hash_is_a_clear_error(repo):
    root, manifest = repo
    entry = json.loads(manifest.read_text())["adapters"][0]
    manifest.write_text(json.dumps({"adapters": [{**entry, "sha256": "0" * 64}]}))
    with pytest.raises(RestoreError, match="does not match its SHA-256"):
        restore_all(manifest, root)
    assert not (root / entry["path"]).exists()
    manifest.write_text(json.dumps({"adapters": [{**entry, "blob": "1" * 40}]}))
    with pytest.raises(RestoreError, match="git fetch --unshallow"):
        restore_all(manifest, root)


def test_an_adapter_without_its_weights_names_make_adapters(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelError, match="no adapter weights .*make adapters"):
        check_adapter_dir(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    assert check_adapter_dir(tmp_path) == tmp_path
