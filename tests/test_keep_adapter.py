"""experiments/keep_adapter.py: an adapter kept in history in bfloat16, restored by
`make adapters` (experiments/restore_adapters.py) from the entry it records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from experiments.keep_adapter import WEIGHTS, copy_bf16, record
from experiments.restore_adapters import restore_all


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_an_adapter_kept_in_bf16_is_restored_from_its_recorded_entry(tmp_path):
    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    weights = {"lora_A": torch.randn(4, 8), "steps": torch.tensor([3])}
    save_file(weights, adapter / WEIGHTS)
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "README.md").write_text("base_model: /home/someone/.cache/model")
    repo = tmp_path / "repo"
    (repo / "experiments" / "results").mkdir(parents=True)
    manifest = repo / "experiments" / "results" / "adapters.json"
    manifest.write_text(json.dumps({"about": "test", "adapters": []}))
    _git(repo, "init", "-q")
    _git(
        repo,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "0",
    )

    dest = repo / "experiments" / "results" / "kept"
    copy_bf16(adapter, dest)
    kept = load_file(dest / WEIGHTS)
    assert kept["lora_A"].dtype == torch.bfloat16 and kept["steps"].dtype == torch.int64
    assert torch.equal(kept["lora_A"], weights["lora_A"].to(torch.bfloat16))
    assert (dest / "adapter_config.json").read_text() == '{"r": 4}'
    assert sorted(p.name for p in dest.iterdir()) == ["adapter_config.json", WEIGHTS]
    with pytest.raises(SystemExit, match="HEAD"):  # not committed yet
        record(dest, "a test adapter", repo)

    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kept")
    entry = record(dest, "a test adapter", repo)
    assert entry["path"] == "experiments/results/kept/adapter_model.safetensors"
    assert json.loads(manifest.read_text())["adapters"] == [entry]
    (dest / WEIGHTS).unlink()
    assert restore_all(manifest, repo) == {entry["path"]: "restored"}
    assert torch.equal(load_file(dest / WEIGHTS)["lora_A"], kept["lora_A"])


def test_the_bf16_copy_loads_as_an_adapter_and_moves_logits_little(cache_dir, tmp_path):
    """`load_adapter` (what eval.adapter uses) takes the bf16 copy; the logits stay within
    bf16 rounding of the float32 adapter's."""
    from grammarrl.models.loading import add_lora, load_adapter, load_model
    from grammarrl.training.policy import save_adapter
    from tests.conftest import compose_config

    cfg = compose_config(["model=tiny", "lora.r=4"])
    fresh = lambda: load_model(cfg.model, cache_dir, device="cpu")[0]
    policy = add_lora(fresh(), cfg.lora)
    generator = torch.Generator().manual_seed(0)  # not the global state other tests leave behind
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05, generator=generator)
    save_adapter(policy, tmp_path / "fp32")
    copy_bf16(tmp_path / "fp32", tmp_path / "bf16")
    ids = torch.arange(1, 9)[None]
    logits = {}
    for name in ("fp32", "bf16"):
        with torch.no_grad():
            logits[name] = load_adapter(fresh(), tmp_path / name)(ids).logits.float()
    moved = (logits["fp32"] - logits["bf16"]).abs().max().item()
    assert 0 < moved < 0.05
