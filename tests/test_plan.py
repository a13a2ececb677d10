"""`grammarrl.plan`: the meta-device count of what the policy pass saves equals the count on the
real model, the parts follow the model's dimensions, and the CLI plans the paper's models
without their weights or the hub."""

from __future__ import annotations

import json

import pytest
import torch

from grammarrl.job import compose_job_config
from grammarrl.plan import (
    GIB,
    build_policy,
    fused_attention,
    main,
    model_config,
    plan_step,
    saved_activation_bytes,
)

TINY = ["model=tiny", "task=conll", "data.dir=null", "logger=none"]
PROMPT, CANDIDATES = 50, [7, 12, 3, 9]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_meta_count_equals_the_real_models(dtype, checkpointing):
    cfg = compose_job_config(TINY)
    config = model_config(cfg.model, cfg.cache_dir)
    torch.manual_seed(0)
    real = build_policy(config, dtype, cfg.lora, checkpointing, device="cpu")
    meta = build_policy(config, dtype, cfg.lora, checkpointing, device="meta")
    measured = saved_activation_bytes(real, PROMPT, CANDIDATES)
    with fused_attention():
        planned = saved_activation_bytes(meta, PROMPT, CANDIDATES)
    assert planned == measured
    assert measured > 0


def test_checkpointing_keeps_less():
    cfg = compose_job_config(TINY)
    config = model_config(cfg.model, cfg.cache_dir)
    # A long prompt, short candidates: the layers' activations outweigh tiny's large logits.
    full, checkpointed = (
        saved_activation_bytes(build_policy(config, torch.float32, cfg.lora, ck), 400, [1] * 4)
        for ck in (False, True)
    )
    assert checkpointed < full / 2


def test_parts_follow_the_dimensions():
    cfg = compose_job_config([*TINY, "optim.batch_size=1"])
    plan = plan_step(cfg, 40, 10, runtime=123)
    r, h, i, kv, layers = cfg.lora.r, 64, 128, 64, 2  # tiny: 4 heads, 4 key-value heads
    lora = r * (9 * h + 3 * i + 2 * kv) * layers  # A and B of q, k, v, o, gate, up, down
    assert plan.trainable_parameters == lora
    assert plan.parts["trainable_state"] == 4 * 4 * lora  # float32 weights, grads, 2 moments
    assert plan.parts["runtime"] == 123
    assert plan.total == sum(plan.parts.values())
    two = plan_step(compose_job_config([*TINY, "optim.batch_size=2"]), 40, 10, runtime=123)
    three = plan_step(compose_job_config([*TINY, "optim.batch_size=3"]), 40, 10, runtime=123)
    per_input = three.parts["activations"] - two.parts["activations"]
    assert per_input > 0
    assert two.parts["activations"] - plan.parts["activations"] == per_input
    ddp = plan_step(
        compose_job_config([*TINY, "optim.batch_size=1", "trainer.devices=2"]), 40, 10, runtime=123
    )
    assert ddp.total - plan.total == ddp.parts["ddp_buckets"] == 4 * lora  # one float32 copy
    longer = plan_step(cfg, 80, 10, runtime=123)
    assert longer.parts["activations"] > plan.parts["activations"]


def test_8b_planned_in_bfloat16_for_cuda_without_weights():
    cfg = compose_job_config(["model=8b", "task=conll", "device=cuda", "optim.batch_size=1"])
    plan = plan_step(cfg, 1000, 128, runtime=0)
    assert plan.dtype == "bfloat16" and plan.device == "cuda"
    head = 128256 * 4096  # untied output projection, computed in float32 (float32_head)
    assert plan.frozen_parameters == 8_030_261_248
    assert plan.parts["frozen_weights"] == (8_030_261_248 - head) * 2 + head * 4
    with_checkpointing = plan_step(
        compose_job_config(
            [
                *["model=8b", "task=conll", "device=cuda", "optim.batch_size=1"],
                "train.gradient_checkpointing=true",
            ]
        ),
        1000,
        128,
        runtime=0,
    )
    assert with_checkpointing.parts["activations"] < plan.parts["activations"] / 4


def test_cli_prints_the_plan_and_its_json(capsys):
    code = main(
        [
            "model=1b",
            "task=conll",
            "device=cuda",
            "--prompt-tokens",
            "900",
            "--candidate-tokens",
            "64",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["model"] == "1b" and report["inputs_per_step"] == 8
    assert report["prompt_tokens"] == 900 and report["candidates"] == 4
    assert set(report["fits"]) == {"24GB", "40GB", "80GB"}
    assert report["total_gib"] == round(report["total"] / GIB, 3)
    assert "fits: 24GB" in out


def test_cli_names_a_model_it_cannot_plan(capsys, tmp_path):
    code = main(
        [
            "model=8b",
            "model.path=nobody/unknown-model",
            "task=conll",
            "device=cuda",
            "--prompt-tokens",
            "10",
        ]
    )
    assert code == 2
    assert "model.path=nobody/unknown-model" in capsys.readouterr().err


def test_cli_refuses_a_model_option_that_does_not_exist_in_one_line(capsys):
    """As `python -m grammarrl.run model=13b` does: one line naming the group's options."""
    assert main(["model=13b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err == "error: model=13b is invalid: expected one of 1b, 3b, 8b, smollm2, tiny\n"
    )


def test_fits_against_the_cards_reported_memory():
    from grammarrl.plan import CARDS_MIB, MemoryPlan

    def plan_of(total: int) -> MemoryPlan:
        return MemoryPlan("m", "t", "cuda", "bfloat16", 1, 1, 1, 1, 4, 1, False, {"all": total})

    assert plan_of(CARDS_MIB["24GB"] * 2**20).fits() == {"24GB": True, "40GB": True, "80GB": True}
    assert plan_of(CARDS_MIB["24GB"] * 2**20 + 1).fits()["24GB"] is False
    assert plan_of(CARDS_MIB["80GB"] * 2**20 + 1).fits() == {
        "24GB": False,
        "40GB": False,
        "80GB": False,
    }
