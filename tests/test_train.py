"""GrammarRL training end to end on the tiny model and the bundled samples."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import compose_config, train_in

TINY_TRAIN = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "trainer.max_steps=3",
    "optim.batch_size=2",
    "optim.lr=1e-3",
    "task.max_new_tokens=64",
    "task.dev_size=2",
    "trainer.val_check_interval=2",
    "train.val_size=2",
    "train.checkpoint_every_n_steps=2",
    "eval.num_test_sets=2",
    "eval.test_size=2",
    "eval.batch_size=4",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train in a scratch working directory (run dirs go under ./outputs), calibrating first."""
    work = tmp_path_factory.mktemp("work")
    cfg = compose_config(
        [
            *TINY_TRAIN,
            f"reward.calibration_file={work}/calibration.json",
            "train.eval_baseline=true",
            "train.eval_best_dev=true",
        ]
    )
    out, results = train_in(work, cfg)
    return work, out, results


def test_calibrated_first_and_stored(trained):
    work, _, _ = trained
    (entry,) = json.loads((work / "calibration.json").read_text())["conll/tiny/n3_b3"]
    assert entry["num_inputs"] >= 1 and entry["sigma_direct"] > 0 and entry["sigma_reverse"] > 0


def test_adapter_changed_and_saved(trained):
    _, out, _ = trained
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b)  # LoRA B starts at zero


def test_logged_rewards_are_finite_and_metrics_kept(trained):
    _, out, _ = trained
    import csv

    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").read_text().splitlines()))
    rewards = [float(r["train/reward"]) for r in rows if r.get("train/reward")]
    assert len(rewards) == 3 and all(math.isfinite(r) for r in rewards)
    kls = [float(r["train/kl"]) for r in rows if r.get("train/kl")]
    assert kls[0] == pytest.approx(0.0, abs=1e-4)  # step 0: policy == reference
    masses = [float(r["train/log_valid_mass"]) for r in rows if r.get("train/log_valid_mass")]
    assert len(masses) == 3 and all(m <= 0 for m in masses)
    # step 0: q_θ = q_ref, so log q_θ − log π_ref is minus the reference's log valid mass
    kl_grammar = [float(r["train/kl_grammar"]) for r in rows if r.get("train/kl_grammar")]
    assert kl_grammar[0] == pytest.approx(-masses[0], abs=1e-3) and kl_grammar[0] > 0
    assert any(r.get("val/dev_micro_f1") for r in rows)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and len(samples[0]["candidates"]) == 4  # N=3 samples + beam


def test_every_step_logs_its_time_per_phase(trained):
    """PhaseTimer logs perf/<phase>_seconds each step: the module's phases and the trainer's,
    and the step's total holds its phases."""
    import csv

    _, out, _ = trained
    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").read_text().splitlines()))
    phases = ("rollout", "scoring", "policy", "backward", "optimizer")
    timed = [r for r in rows if r.get("perf/step_seconds")]
    assert len(timed) == 3
    for row in timed:
        parts = [float(row[f"perf/{phase}_seconds"]) for phase in phases]
        assert all(p > 0 for p in parts) and sum(parts) <= float(row["perf/step_seconds"])


def test_validation_curves_start_at_step_0_with_greedy_rewards(trained):
    """Validation runs before the first step (step 0) and every val_check_interval steps, and
    logs the reward of the greedy outputs under the reference next to F1 and empty fields."""
    _, out, _ = trained
    import csv

    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").read_text().splitlines()))
    val = [r for r in rows if r.get("val/dev_micro_f1")]
    assert [int(float(r["val/dev_trained_steps"])) for r in val] == [0, 2]
    from omegaconf import OmegaConf

    from experiments.analysis import read_metrics
    from experiments.runs import Run

    assert [s for s, _ in read_metrics(Run(out, OmegaConf.create()))["val/dev_micro_f1"]] == [0, 2]
    for row in val:
        direct, reverse = float(row["val/dev_reward_direct"]), float(row["val/dev_reward_reverse"])
        assert direct < 0 and reverse < 0  # mean log-probs
        assert math.isfinite(float(row["val/dev_reward"]))
        assert 0.0 <= float(row["val/dev_empty_field_rate"]) <= 100.0
        assert 0.0 <= float(row["val/dev_validity"]) <= 1.0


def test_validation_keeps_every_example_of_each_slice_for_intervals(trained):
    """validation.jsonl: one row per (validation, slice, input) with the task's per-example
    item, so that a dev score can carry a bootstrap interval; the slices are train.val_size."""
    _, out, _ = trained
    rows = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert sorted({(r["step"], r["slice"]) for r in rows}) == [
        (0, "dev"),
        (0, "train"),
        (2, "dev"),
        (2, "train"),
    ]
    assert all(sum(1 for r in rows if (r["step"], r["slice"]) == (2, s)) == 2 for s in ("dev",))
    assert all({"tp", "fp", "fn"} <= set(r["scores"]) for r in rows)


def test_checkpoint_adapter_matches_the_saved_adapter(trained, tmp_path):
    """experiments.checkpoint_adapter: the last checkpoint's LoRA weights, saved as an adapter,
    equal the adapter training saved from the same final state."""
    from experiments.checkpoint_adapter import checkpoint_adapter

    _, out, _ = trained
    assert checkpoint_adapter(out, tmp_path / "adapter") == 3
    ours = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert set(ours) == set(saved)
    assert all(torch.equal(ours[k], saved[k]) for k in saved)


def test_results_written_for_trained_and_baseline(trained):
    _, out, _ = trained
    for name in ("results", "results_baseline"):
        data = json.loads((out / f"{name}.json").read_text())
        assert data["metric"] == "micro_f1" and len(data["scores"]) == 2
        assert data["validity"] == 1.0
    assert (out / "checkpoints" / "last.ckpt").is_file()
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3
    assert all("lora_" in k for k in ckpt["state_dict"])  # only the adapter, not the base


def test_results_name_the_adapter_that_produced_them(trained):
    work, out, _ = trained
    adapter = json.loads((out / "results.json").read_text())["adapter"]
    assert adapter == str((out / "adapter").relative_to(work))  # the run's working directory
    assert json.loads((out / "results_baseline.json").read_text())["adapter"] is None


def test_the_dev_best_step_keeps_its_adapter_and_is_evaluated(trained):
    """Dev is validated at steps 0 and 2 of 3: step 0 (the frozen model) never counts, so step 2
    is the dev-best trained step; its adapter is kept, recorded in checkpoints, and evaluated
    next to the last step's."""
    work, out, results = trained
    best = json.loads((out / "best_dev.json").read_text())
    assert best["step"] == 2 and best["metric"] == "val/dev_micro_f1"
    import csv

    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").read_text().splitlines()))
    at_2 = [
        r for r in rows if r.get("val/dev_trained_steps") and float(r["val/dev_trained_steps"]) == 2
    ]
    assert best["value"] == pytest.approx(float(at_2[0]["val/dev_micro_f1"]))
    kept = load_file(str(out / "adapter-best-dev" / "adapter_model.safetensors"))
    last = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    lora_b = [k for k in kept if "lora_B" in k]
    assert any(kept[k].abs().max() > 0 for k in lora_b)  # trained (LoRA B starts at zero)
    assert not all(torch.equal(kept[k], last[k]) for k in lora_b)  # not the last step's
    record = json.loads((out / "results_best_dev.json").read_text())
    assert record["adapter"] == str((out / "adapter-best-dev").relative_to(work))
    assert len(record["scores"]) == 2 and results["best_dev"]["path"]
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("BestDevAdapter")]
    assert state["best"]["step"] == 2  # a resumed run compares against it


def test_the_dev_best_evaluation_decoded_with_the_kept_weights(trained, tmp_path):
    """results_best_dev's predictions are those of the kept adapter loaded on its own (mode=eval),
    not the last step's: the tiny model's outputs are alike, their log-probabilities are not."""
    from grammarrl.evaluation.evaluate import evaluate, load_evaluated_model
    from grammarrl.evaluation.settings import EvalSettings
    from grammarrl.tasks import load_task

    _, out, _ = trained
    cfg = compose_config([*TINY_TRAIN, "mode=eval", f"eval.adapter={out / 'adapter-best-dev'}"])
    model, tokenizer = load_evaluated_model(cfg.model, cfg.cache_dir, cfg.device, cfg.eval.adapter)
    task = load_task(cfg)
    evaluate(
        EvalSettings.from_config(cfg), model, tokenizer, task, "greedy", tmp_path, progress=False
    )

    def logps(path):
        return [json.loads(line)["logp_constrained"] for line in path.read_text().splitlines()]

    again = logps(tmp_path / "predictions.jsonl")
    assert logps(out / "predictions_best_dev.jsonl") == pytest.approx(again, abs=1e-4)
    assert logps(out / "predictions.jsonl") != pytest.approx(again, abs=1e-4)


def test_the_training_seed_is_its_own():
    """`train.seed` follows `seed` unless set; set alone, it reorders training's inputs (and
    reseeds LoRA init and rollouts) while `seed` still draws the same test sets."""
    from grammarrl.tasks import load_task
    from grammarrl.training.datamodule import DataSettings, GrammarRLDataModule

    def training_order(cfg) -> list[list[str]]:
        data = GrammarRLDataModule(load_task(cfg), DataSettings.from_config(cfg))
        data.setup()
        return [[ex.uid for ex in batch] for batch in data.train_dataloader()]

    steps = ["trainer.max_steps=6"]
    default, other = (
        compose_config([*TINY_TRAIN, *steps]),
        compose_config([*TINY_TRAIN, *steps, "train.seed=1"]),
    )
    assert default.train.seed == default.seed == 0 and other.seed == 0
    assert compose_config([*TINY_TRAIN, "seed=4"]).train.seed == 4
    assert training_order(default) != training_order(other)
    assert training_order(default) == training_order(compose_config([*TINY_TRAIN, *steps]))
