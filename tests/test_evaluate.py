"""mode=eval and the shared results schema, on the tiny model and the bundled samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grammarrl.evaluation import evaluate as evaluate_module
from grammarrl.evaluation.evaluate import evaluate, run_eval
from grammarrl.evaluation.settings import EvalSettings
from grammarrl.runs.atomic import write_json
from grammarrl.runs.results import (
    REQUIRED_KEYS,
    build_results,
    mean_std,
    predictions_name,
    write_results,
)
from grammarrl.runs.rundir import run_dir
from grammarrl.tasks import load_task
from tests.conftest import compose_config

REPO = Path(__file__).resolve().parents[1]


def eval_config(*overrides: str):
    base = [
        "mode=eval",
        "model=tiny",
        "task=conll",
        "data.dir=null",
        "logger=none",
        "device=cpu",
        "eval.num_test_sets=3",
        "eval.test_size=4",
        "eval.batch_size=3",
        "task.max_new_tokens=48",
    ]
    return compose_config(base + list(overrides))


# ----- results.py --------------------------------------------------------------------------


def test_mean_std_and_prediction_file_names():
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2**0.5))
    assert mean_std([0.5]) == (0.5, 0.0)
    assert predictions_name("results") == "predictions.jsonl"
    assert predictions_name("results_beam") == "predictions_beam.jsonl"


def test_write_results_is_atomic_and_checks_the_schema(tmp_path):
    record = build_results(
        task="conll",
        model="tiny",
        decoding="greedy",
        metric="micro_f1",
        scores=[0.1, 0.3],
        validity=1.0,
        truncated=0.0,
        examples_per_second=2.0,
        config={"a": 1, "hydra": {"x": 1}},
        extra_key="kept",
    )
    assert list(record)[: len(REQUIRED_KEYS) - 1] == list(REQUIRED_KEYS[:-1])
    assert record["mean"] == pytest.approx(0.2) and record["config"] == {"a": 1}
    path = write_results(tmp_path, record, [{"uid": "u", "x": float("nan")}])
    assert json.loads(path.read_text())["extra_key"] == "kept"
    line = json.loads((tmp_path / "predictions.jsonl").read_text())
    assert line == {"uid": "u", "x": None}  # NaN is not JSON
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl", "results.json"]
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)
    with pytest.raises(ValueError, match="validity"):
        write_results(tmp_path, {k: v for k, v in record.items() if k != "validity"})

    class Boom:
        pass

    with pytest.raises(TypeError):  # a failed write leaves the old file and no temp file
        write_json(path, {"bad": Boom()})
    assert json.loads(path.read_text())["extra_key"] == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl", "results.json"]


def test_run_dir_without_hydra(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = run_dir(eval_config())
    assert path.is_dir() and path.name.endswith("_conll_tiny_eval")
    assert run_dir(eval_config()) != path


# ----- evaluate ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def task():
    return load_task(eval_config())


def test_evaluate_decodes_each_distinct_example_once(tiny, task, tmp_path, monkeypatch):
    model, tok = tiny
    cfg = eval_config()
    decoded: list[int] = []
    original = evaluate_module.ConstrainedDecoder.greedy

    def counting(self, prompts):
        decoded.append(len(prompts))
        assert len(prompts) <= cfg.eval.batch_size
        return original(self, prompts)

    monkeypatch.setattr(evaluate_module.ConstrainedDecoder, "greedy", counting)
    res = evaluate(
        EvalSettings.from_config(cfg), model, tok, task, "greedy", tmp_path, progress=False
    )

    sets = task.test_sets(3, 4, cfg.seed)
    uids = {ex.uid for s in sets for ex in s}
    assert len(uids) < 12  # the small sample pool makes the sets overlap
    assert sum(decoded) == len(uids) == res["num_unique_examples"]
    on_disk = json.loads((tmp_path / "results.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in on_disk
    assert on_disk["task"] == "conll" and on_disk["model"] == "tiny"
    assert on_disk["decoding"] == "greedy" and on_disk["metric"] == task.metric_name
    assert len(on_disk["scores"]) == 3 and on_disk["config"]["eval"]["test_size"] == 4
    assert on_disk["examples_per_second"] > 0
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    assert {"input", "gold", "prediction", "scores"} <= set(rows[0])
    # Every set's score is the task metric of its own rows; shared uids share predictions.
    for i, test_set in enumerate(sets):
        mine = [r for r in rows if r["set"] == i]
        assert [r["uid"] for r in mine] == [ex.uid for ex in test_set]
        expected = task.score([r["prediction"] for r in mine], test_set).value
        assert on_disk["scores"][i] == pytest.approx(expected)
    by_uid = {}
    for r in rows:
        assert by_uid.setdefault(r["uid"], r["prediction"]) == r["prediction"]
    unique_valid = {r["uid"]: r["valid"] for r in rows}
    assert on_disk["validity"] == pytest.approx(sum(unique_valid.values()) / len(unique_valid))
    for r in rows:
        assert r["valid"] == (r["finished"] and task.try_parse(r["prediction"]) is not None)


def test_score_rewards_gives_each_output_its_reference_reward(tiny, task, tmp_path):
    """eval.score_rewards: every row carries R_direct / R_reverse of its output, equal to the
    mean teacher-forced log-probs of the output's tokens (direct) and of the input given the
    output (reverse) under the model; per-set means are over the set's rows."""
    from grammarrl.decoding.scoring import sequence_logprobs
    from grammarrl.models.chat import encode_prompt

    model, tok = tiny
    cfg = eval_config("eval.score_rewards=true", "eval.num_test_sets=2")
    res = evaluate(
        EvalSettings.from_config(cfg), model, tok, task, "greedy", tmp_path, progress=False
    )
    rows = [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    sets = task.test_sets(2, 4, cfg.seed)
    examples = {ex.uid: ex for s in sets for ex in s}
    end = (
        tok.convert_tokens_to_ids("<|im_end|>")
        if "<|im_end|>" in tok.get_vocab()
        else tok.eos_token_id
    )
    for row in rows:
        ex = examples[row["uid"]]
        prompt = encode_prompt(tok, task.forward_messages(ex))
        output = tok.encode(row["prediction"], add_special_tokens=False) + [end]
        reverse_prompt = encode_prompt(tok, task.reverse_messages(row["prediction"]))
        x_ids = tok.encode(ex.input, add_special_tokens=False)
        with torch.no_grad():
            direct = sequence_logprobs(model, [prompt + output], [len(prompt)], share_prefix=False)[
                0
            ]
            reverse = sequence_logprobs(
                model, [reverse_prompt + x_ids], [len(reverse_prompt)], share_prefix=False
            )[0]
        if row["finished"] and len(output) == row["num_tokens"]:  # same tokenization as decoded
            assert row["reward_direct"] == pytest.approx(direct.mean().item(), abs=1e-4)
        assert row["reward_reverse"] == pytest.approx(reverse.mean().item(), abs=1e-4)
    for i, per_set in enumerate(res["per_set"]):
        mine = [r for r in rows if r["set"] == i]
        assert per_set["reward_direct"] == pytest.approx(
            sum(r["reward_direct"] for r in mine) / len(mine)
        )
        assert per_set["reward_reverse"] == pytest.approx(
            sum(r["reward_reverse"] for r in mine) / len(mine)
        )


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_eval_matches_the_decoder(tiny, task, tmp_path, length_penalty):
    from grammarrl.decoding import ConstrainedDecoder
    from grammarrl.models.chat import encode_prompt

    model, tok = tiny
    cfg = eval_config(
        "eval.decoding=beam",
        "eval.beam_width=2",
        "eval.num_test_sets=1",
        f"eval.length_penalty={length_penalty}",
    )
    res = evaluate(
        EvalSettings.from_config(cfg),
        model,
        tok,
        task,
        "beam",
        tmp_path,
        name="results_beam",
        progress=False,
    )
    assert res["decoding"] == "beam" and res["beam_width"] == 2
    assert res["length_penalty"] == length_penalty
    rows = [json.loads(x) for x in (tmp_path / "predictions_beam.jsonl").read_text().splitlines()]
    test_set = task.test_sets(1, 4, cfg.seed)[0]
    dec = ConstrainedDecoder(model, tok, task.grammar(), 48)
    tops = dec.beam(
        [encode_prompt(tok, task.forward_messages(ex)) for ex in test_set],
        2,
        length_penalty=length_penalty,
    )
    assert [r["prediction"] for r in rows] == [t.top.text for t in tops]


def test_run_eval_with_an_adapter(tiny, tmp_path, monkeypatch):
    """eval.adapter loads a saved PEFT adapter onto the base model: predictions change."""
    import copy

    from grammarrl.models.loading import add_lora

    model, _ = tiny
    cfg = eval_config("eval.num_test_sets=1")
    peft_model = add_lora(copy.deepcopy(model), cfg.lora)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    peft_model.save_pretrained(tmp_path / "adapter")

    monkeypatch.chdir(tmp_path)
    base = run_eval(cfg)
    adapted = run_eval(eval_config("eval.num_test_sets=1", f"eval.adapter={tmp_path / 'adapter'}"))
    assert adapted["adapter"] == "adapter"  # relative to the working directory
    preds = [
        [json.loads(x)["prediction"] for x in (Path(r["path"]).parent / "predictions.jsonl").open()]
        for r in (base, adapted)
    ]
    assert preds[0] != preds[1]


def test_cli_writes_into_the_hydra_run_dir(tmp_path, cache_dir):
    out = tmp_path / "run"
    env = dict(os.environ, GRAMMARRL_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "grammarrl.run", "mode=eval", "model=tiny", "task=wos",
         "data.dir=null", "logger=none", "device=cpu", "eval.num_test_sets=2",
         "eval.test_size=2", "task.max_new_tokens=32", f"hydra.run.dir={out}"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["task"] == "wos" and len(res["scores"]) == 2
    assert (out / "predictions.jsonl").is_file()
    assert "wos tiny greedy" in proc.stdout
