"""Cost accounting of greedy, beam and search evaluations (`grammarrl.evaluation.costs`): forward
token positions of a tiny run, predicted from its prompts and outputs, and the machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.evaluation.costs import counted, machine
from grammarrl.evaluation.evaluate import (
    decode_examples,
    distinct_prompts,
    evaluate,
    output_rewards,
)
from grammarrl.evaluation.settings import EvalSettings
from grammarrl.evaluation.test_sets import test_examples as drawn_examples
from grammarrl.tasks import load_task
from tests.conftest import compose_config
from tests.test_evaluate import eval_config

# ModelForward.min_shared_prefix: prompts of one call sharing this many tokens prefill them once
MIN_SHARED_PREFIX = 32


@pytest.fixture(scope="module")
def task():
    return load_task(eval_config())


def _prefill_tokens(batch: list[list[int]]) -> int:
    """Prefill of one decoding call: the prompts' common prefix once (kept one token short of
    the shortest prompt) when at least two share 32 tokens, else every prompt whole."""
    shared = min(len(os.path.commonprefix(batch)), min(map(len, batch)) - 1)
    if len(batch) < 2 or shared < MIN_SHARED_PREFIX:
        return sum(map(len, batch))
    return shared + sum(len(p) - shared for p in batch)


def _run(
    tiny, task, tmp_path: Path, *overrides: str, decoding: str = "greedy"
) -> tuple[dict, dict[str, dict], EvalSettings]:
    """An evaluation: its results and its predictions rows by uid."""
    model, tok = tiny
    settings = EvalSettings.from_config(eval_config(*overrides))
    res = evaluate(settings, model, tok, task, decoding, tmp_path, name="r", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "predictions_r.jsonl").read_text().splitlines()]
    return res, {r["uid"]: r for r in rows}, settings


def _prefills(tok, task, settings: EvalSettings, batch_size: int) -> tuple[int, list[str]]:
    """The prefill positions of the evaluation's decoding calls, and its uids in decoding order."""
    _, prompts, order = distinct_prompts(tok, task, drawn_examples(settings.test_sets, task)[1])
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return sum(_prefill_tokens([prompts[uid] for uid in batch]) for batch in batches), order


@pytest.mark.parametrize(("batch_size", "cap"), [(1, 48), (3, 48), (3, 16)])
def test_greedy_forward_tokens_are_prefill_plus_one_per_fed_back_token(
    tiny, task, tmp_path, batch_size, cap
):
    """Each distinct example once: its prompt's prefill (a prefix its batch shares once), then one
    position per generated token fed back, the last (end-of-turn or the cap) never is."""
    res, rows, settings = _run(
        tiny, task, tmp_path, f"eval.batch_size={batch_size}", f"task.max_new_tokens={cap}"
    )
    prefill, order = _prefills(tiny[1], task, settings, batch_size)
    decode = sum(rows[uid]["num_tokens"] - 1 for uid in order)
    assert len(order) == res["num_unique_examples"] == 10  # the sets share examples
    assert any(rows[uid]["truncated"] for uid in order) == (cap == 16)  # the tiny model's: 29
    if batch_size > 1:  # the shared prefix counts once
        assert prefill < _prefills(tiny[1], task, settings, 1)[0]
    assert res["forward_tokens"] == prefill + decode
    assert res["forward_tokens_per_output"] == pytest.approx((prefill + decode) / 10)
    assert res["reward_forward_tokens"] == res["reward_forward_tokens_per_output"] == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["forward_tokens"] == prefill + decode
    assert saved["machine"]["cpu_count"] == os.cpu_count() and saved["machine"]["cpu_model"]
    assert "cuda_device" not in saved["machine"] and saved["device"] == "cpu"


def test_beam_counts_at_least_its_best_hypothesis(tiny, task, tmp_path):
    """Beam search runs the prefill and, at least, every token of the output it returns but the
    last; its forward tokens per output are what the comparison plots."""
    res, rows, settings = _run(tiny, task, tmp_path, "eval.beam_width=2", decoding="beam")
    prefill, order = _prefills(tiny[1], task, settings, settings.batch_size)
    assert res["forward_tokens"] >= prefill + sum(rows[uid]["num_tokens"] - 1 for uid in order)
    assert res["forward_tokens_per_output"] == pytest.approx(res["forward_tokens"] / 10)


def test_reward_scoring_is_counted_apart_from_generation(tiny, task, tmp_path):
    """eval.score_rewards: generation counts the same; the scoring pass runs at least every
    output token (direct) and every input token (reverse) once, and exactly what a pass of its
    own over the same outputs runs."""
    model, tok = tiny
    plain, _, _ = _run(tiny, task, tmp_path / "plain")
    scored, rows, settings = _run(tiny, task, tmp_path / "scored", "eval.score_rewards=true")
    assert scored["forward_tokens"] == plain["forward_tokens"]
    examples = drawn_examples(settings.test_sets, task)[1]
    inputs = {ex.uid: tok.encode(ex.input, add_special_tokens=False) for ex in examples}
    least = sum(row["num_tokens"] + len(inputs[uid]) for uid, row in rows.items())
    assert scored["reward_forward_tokens"] >= least
    assert scored["reward_forward_tokens_per_output"] == pytest.approx(
        scored["reward_forward_tokens"] / 10
    )
    assert scored["reward_seconds"] > 0
    decoder = ConstrainedDecoder(model, tok, task.grammar(), settings.max_new_tokens)
    outputs = decode_examples(
        decoder, tok, task, examples, "greedy", 0, settings.batch_size, progress=False
    )
    with counted(model) as again:
        output_rewards(settings.reward, model, tok, task, examples, outputs, progress=False)
    assert again.tokens == scored["reward_forward_tokens"]


def test_counted_reads_the_forward_calls_inside_the_block_only(tiny):
    model, _ = tiny
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    with torch.no_grad():
        with counted(model) as first:
            model(input_ids=ids)
            model(input_ids=ids[:, :3])
        model(input_ids=ids)  # outside: not counted
        with counted(model) as second:
            model(input_ids=ids[:1, :2])
    assert (first.tokens, second.tokens) == (8 + 6, 2) and first.seconds > 0
    hooks = len(model._forward_pre_hooks)
    with counted(model):
        pass
    assert len(model._forward_pre_hooks) == hooks  # one hook per model, however often counted


def test_machine_names_the_gpu_only_for_a_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    assert machine("cuda:0")["cuda_device"] == "Fake GPU"
    assert "cuda_device" not in machine("cpu")
    assert machine("cpu")["torch_threads"] == torch.get_num_threads()


def test_search_records_generation_potential_and_scoring_per_output(tiny, tmp_path):
    """A Sample-Rerank run: one draw's generation and potential tokens, each also per output,
    the scoring pass apart, the machine."""
    from grammarrl.search.run import search
    from grammarrl.search.settings import SearchSettings

    model, tok = tiny
    # 48 new tokens: the tiny model's particles finish (a cut one weighs zero, no potential runs)
    cfg = compose_config(
        ["mode=search", "model=tiny", "task=conll", "logger=none", "search.method=rerank",
         "search.particles=2", "eval.num_test_sets=1", "eval.test_size=2",
         "eval.sampler_seeds=[0,1]", "eval.score_rewards=true", "task.max_new_tokens=48",
         f"cache_dir={tmp_path}/cache"]
    )  # fmt: skip
    search_task = load_task(cfg)
    settings = SearchSettings.from_config(cfg.search)
    res = search(
        EvalSettings.from_config(cfg), settings, model, tok, search_task, tmp_path, progress=False
    )
    assert res["num_unique_examples"] == 2
    for name in ("forward_tokens", "potential_forward_tokens", "reward_forward_tokens"):
        assert res[name] > 0
        assert res[f"{name}_per_output"] == pytest.approx(res[name] / 2)
    assert res["cost_tokens"] == pytest.approx(
        (res["forward_tokens"] + res["potential_forward_tokens"])
        / res["greedy_baseline"]["forward_tokens"]
    )
    assert res["machine"]["cpu_count"] == os.cpu_count()
