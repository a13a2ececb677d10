"""The constrained decoder against brute force (no KV cache, fresh matchers) on the `tiny` model."""

from __future__ import annotations

import inspect
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grammarrl.decoding import BeamResult, ConstrainedDecoder, GrammarError
from grammarrl.evaluation.evaluate import decode_examples
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from tests.conftest import compose_config
from tests.support.decoding import (
    COLORS,
    FINITE_GRAMMAR,
    JSON_GRAMMAR,
    JSON_RE,
    MESSAGES,
    WORDS_GRAMMAR,
    Sharpened,
    WideLogits,
    assert_valid,
    brute_beam,
    brute_greedy,
    enumerate_paths,
    teacher_forced,
)

# --------------------------------------------------------------------------- brute force


# --------------------------------------------------------------------------- tests


def test_greedy_equals_masked_argmax_without_cache(model, tok, prompts):
    """Batched, left-padded, cached greedy == step-by-step masked argmax on full recomputation,
    with the three per-token records."""
    max_new = 20
    dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=max_new)
    gens = dec.greedy(prompts)
    assert len(gens) == len(prompts)
    for prompt, gen in zip(prompts, gens):
        tokens, lu, lc, lm = brute_greedy(model, tok, JSON_GRAMMAR, prompt, max_new)
        assert gen.kind == "greedy"
        assert gen.token_ids == tokens
        assert gen.finished and not gen.truncated
        np.testing.assert_allclose(gen.logp_unconstrained, lu, atol=2e-4)
        np.testing.assert_allclose(gen.logp_constrained, lc, atol=2e-4)
        np.testing.assert_allclose(gen.log_allowed_mass, lm, atol=2e-4)
        assert json.loads(gen.text)["color"] in COLORS


def test_greedy_is_independent_of_batch_composition(model, tok, prompts):
    dec = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=12)
    together = dec.greedy(prompts)
    alone = [dec.greedy([p])[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


def test_shared_prompt_prefix_is_prefilled_once(model, tok):
    """Prompts of one call with a long common prefix (a static system prompt) prefill it once;
    outputs are unchanged (== brute force without cache)."""
    system = "You label things. " * 30
    prompts = [
        encode_prompt(tok, [{"role": "system", "content": system}, {"role": "user", "content": m}])
        for m in MESSAGES
    ]
    shared = 0
    while all(p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    assert shared > 100
    fed = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kwargs: fed.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
        gens = dec.greedy(prompts)
    finally:
        hook.remove()
    prefill_tokens = sum(s[1] for s in fed if s[1] > 1)
    assert prefill_tokens == shared + sum(len(p) - shared for p in prompts)
    for prompt, gen in zip(prompts, gens):
        tokens, lu, _, _ = brute_greedy(model, tok, JSON_GRAMMAR, prompt, 20)
        assert gen.token_ids == tokens
        np.testing.assert_allclose(gen.logp_unconstrained, lu, atol=2e-4)


def test_beam_width_one_equals_greedy(model, tok, prompts):
    for grammar, max_new in ((JSON_GRAMMAR, 20), (WORDS_GRAMMAR, 10)):
        dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=max_new)
        greedy = dec.greedy(prompts)
        beams = dec.beam(prompts, beam_width=1, length_penalty=0.0)
        for g, b in zip(greedy, beams):
            assert isinstance(b, BeamResult)
            assert b.top.kind == "beam"
            assert b.top.token_ids == g.token_ids
            assert (b.top.finished, b.top.truncated) == (g.finished, g.truncated)
            assert b.top.sum_logp_constrained == pytest.approx(g.sum_logp_constrained, abs=1e-4)


def test_beam_matches_brute_force_beam_search(model, tok, prompts):
    """Forked matchers and reordered KV cache rows give the same search as recomputation."""
    width, max_new = 3, 16
    dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=max_new)
    results = dec.beam(prompts[:2], beam_width=width, length_penalty=0.0)
    for prompt, res in zip(prompts[:2], results):
        finished, _ = brute_beam(model, tok, JSON_GRAMMAR, prompt, width, max_new)
        assert [g.token_ids for g in res.finished] == [f[1] for f in finished]
        np.testing.assert_allclose(
            [g.sum_logp_constrained for g in res.finished], [f[0] for f in finished], atol=1e-3
        )
        assert res.top.token_ids == finished[0][1]
        scores = [g.sum_logp_constrained for g in res.finished]
        assert scores == sorted(scores, reverse=True)
        for g in res.finished:
            assert g.finished and g.kind == "beam"
            assert_valid(tok, JSON_GRAMMAR, g, max_new)


def short_or_long(model, tok, prompt: list[int]) -> tuple[str, str]:
    """(grammar, its short output): "short" | "long" where the short one is the digit the model
    prefers (two tokens with its end) and the long one five of the other digit, every token
    after the first forced: the plain sum keeps the short one, a penalty of 1 the long one."""
    first = ConstrainedDecoder(model, tok, 'start: "1" | "2"', max_new_tokens=2).greedy([prompt])
    short = first[0].text
    return f'start: "{short}" | "{("2" if short == "1" else "1") * 5}"', short


def test_beam_length_penalty_matches_brute_force(model, tok, prompts):
    """Finished hypotheses ranked by sum / length**length_penalty (end token counted) with HF's
    stopping rule. On "short" | "long" where every token after the first is forced, both have
    about the same sum: the plain sum keeps the short one, a penalty of 1 the long one."""
    width, max_new = 3, 10
    prompt = prompts[0]
    grammar, short = short_or_long(model, tok, prompt)
    dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=max_new)
    tops = {}
    for length_penalty in (0.0, 1.0, 2.0):
        res = dec.beam([prompt], width, length_penalty=length_penalty)[0]
        finished, _ = brute_beam(model, tok, grammar, prompt, width, max_new, length_penalty)
        assert [g.token_ids for g in res.finished] == [f[1] for f in finished]
        ranks = [g.sum_logp_constrained / len(g.token_ids) ** length_penalty for g in res.finished]
        np.testing.assert_allclose(ranks, [f[0] for f in finished], atol=1e-3)
        tops[length_penalty] = res.top.text
    assert tops[0.0] == short and len(tops[1.0]) == len(tops[2.0]) == 5


def test_a_beam_has_no_length_penalty_of_its_own(model, tok, prompts):
    """The decoder has no default length penalty (it was 0.0 while the config's is 1.0): beam,
    rollout and beam evaluation refuse to run without one, so every caller passes the config's."""
    grammar, _ = short_or_long(model, tok, prompts[0])
    dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=10)
    for method in (ConstrainedDecoder.beam, ConstrainedDecoder.rollout):
        assert inspect.signature(method).parameters["length_penalty"].default is inspect._empty
    with pytest.raises(TypeError, match="length_penalty"):
        dec.beam(prompts[:1], 3)
    with pytest.raises(TypeError, match="length_penalty"):
        dec.rollout(prompts[:1], 1, 3)
    task = SimpleNamespace()
    with pytest.raises(ValueError, match="eval.length_penalty"):
        decode_examples(dec, tok, task, [], "beam", 3, 1, progress=False)


def test_the_rollout_benchmark_draws_the_configured_group(monkeypatch):
    """benchmarks/decoding.py times the rollout group training draws: the config's N, B,
    temperature and length penalty (here set on the bench's command line)."""
    from benchmarks.common import Bench
    from benchmarks.decoding import group_rollout

    drawn = []
    rollout = ConstrainedDecoder.rollout

    def recording(self, *args, **kwargs):
        call = inspect.signature(rollout).bind(self, *args, **kwargs)
        call.apply_defaults()
        drawn.append({k: v for k, v in call.arguments.items() if k not in ("self", "prompts")})
        return rollout(self, *args, **kwargs)

    monkeypatch.setattr(ConstrainedDecoder, "rollout", recording)
    overrides = ["data.dir=null", "task.max_new_tokens=4", "rollout.length_penalty=0.5"]
    result = group_rollout(Bench(model="tiny", overrides=overrides, repeats=1, quick=True), "wos")
    assert drawn and all(
        (call["num_samples"], call["beam_width"], call["temperature"], call["length_penalty"])
        == (3, 3, 1.0, 0.5)
        for call in drawn
    )
    assert result.details["length_penalty"] == 0.5


def test_beam_top_scores_at_least_greedy(model, tok, prompts):
    """A beam wide enough to be exhaustive on a finite language finds the exact best path, which
    scores at least greedy's; the narrow beams of the same search are checked on the JSON
    grammar below."""
    max_new = 8
    dec = ConstrainedDecoder(model, tok, FINITE_GRAMMAR, max_new_tokens=max_new)
    for prompt in prompts[:2]:
        paths = enumerate_paths(model, tok, FINITE_GRAMMAR, prompt)
        best_path, best = max(paths.items(), key=lambda kv: kv[1])
        res = dec.beam([prompt], beam_width=len(paths), length_penalty=0.0)[0]
        greedy = dec.greedy([prompt])[0]
        assert res.top.token_ids == list(best_path)
        assert res.top.sum_logp_constrained == pytest.approx(best, abs=1e-4)
        assert res.top.sum_logp_constrained >= greedy.sum_logp_constrained - 1e-5
        assert len(res.finished) == len(paths)  # every path ended in the search
    # Narrow beams over a larger language: not a theorem, but a check that beams do search.
    dec = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=6)
    greedy = dec.greedy(prompts)
    for width in (3, 5):
        for g, b in zip(greedy, dec.beam(prompts, width, length_penalty=0.0)):
            assert b.top.sum_logp_constrained >= g.sum_logp_constrained - 1e-5


def test_recorded_logprobs_equal_teacher_forcing(model, tok, prompts):
    max_new = 14
    dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=max_new)
    gen = torch.Generator().manual_seed(3)
    groups = dec.rollout(prompts, num_samples=3, beam_width=2, generator=gen, length_penalty=1.0)
    for prompt, group in zip(prompts, groups):
        assert [g.kind for g in group] == ["sample"] * 3 + ["beam"]
        for g in group:
            lu, lc, lm = teacher_forced(model, tok, JSON_GRAMMAR, prompt, g.token_ids)
            np.testing.assert_allclose(g.logp_unconstrained, lu, atol=2e-4)
            np.testing.assert_allclose(g.logp_constrained, lc, atol=2e-4)
            np.testing.assert_allclose(g.log_allowed_mass, lm, atol=2e-4)
            np.testing.assert_allclose(
                np.array(g.logp_constrained), np.array(lu) - np.array(lm), atol=2e-4
            )
            assert g.sum_logp_unconstrained == pytest.approx(sum(lu), abs=1e-3)


def chi_square_p(counts, probs, n):
    """p-value of observed path counts against path probabilities (rare paths grouped)."""
    from scipy.stats import chisquare

    common = [p for p in probs if probs[p] * n >= 5]
    observed = [counts.get(p, 0) for p in common]
    expected = [probs[p] * n for p in common]
    rest_obs, rest_exp = n - sum(observed), n - sum(expected)
    if rest_exp >= 5:
        observed.append(rest_obs)
        expected.append(rest_exp)
    assert len(observed) >= 3
    expected = np.array(expected) * sum(observed) / sum(expected)
    return chisquare(observed, expected).pvalue


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_samples_follow_the_masked_softmax(model, tok, prompts, temperature):
    """Chi-square goodness of fit of sampled token paths against the exact path distribution
    under softmax(masked logits / T), enumerated by brute force; the same test rejects the
    distribution of the other temperature (so it has power)."""
    pytest.importorskip("scipy.stats")
    sharp = Sharpened(model, scale=12.0)
    prompt = prompts[1]
    paths = enumerate_paths(sharp, tok, FINITE_GRAMMAR, prompt, temperature=temperature)
    probs = {p: math.exp(lp) for p, lp in paths.items()}
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-4)
    assert max(probs.values()) < 0.9  # a non-trivial distribution

    dec = ConstrainedDecoder(sharp, tok, FINITE_GRAMMAR, max_new_tokens=8)
    generator = torch.Generator().manual_seed(11)
    samples = [
        s
        for _ in range(3)
        for s in dec.sample([prompt], 500, temperature=temperature, generator=generator)[0]
    ]
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        assert s.finished and s.kind == "sample"
        counts[tuple(s.token_ids)] = counts.get(tuple(s.token_ids), 0) + 1
    assert set(counts) <= set(paths)
    assert chi_square_p(counts, probs, n) > 1e-3

    other_t = 0.6 if temperature == 1.0 else 1.0
    other = enumerate_paths(sharp, tok, FINITE_GRAMMAR, prompt, temperature=other_t)
    assert chi_square_p(counts, {p: math.exp(lp) for p, lp in other.items()}, n) < 1e-6

    # The recorded constrained log-probs are at temperature 1, whatever T sampled them.
    at_one = paths if temperature == 1.0 else other
    for s in samples[:20]:
        assert s.sum_logp_constrained == pytest.approx(at_one[tuple(s.token_ids)], abs=1e-4)


def test_sampling_is_reproducible_and_rollout_shares_the_prompt(model, tok, prompts):
    dec = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=10)

    def run(seed):
        return dec.sample(prompts, 4, generator=torch.Generator().manual_seed(seed))

    a, b, c = run(5), run(5), run(6)
    ids = lambda groups: [[g.token_ids for g in grp] for grp in groups]
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    assert all(len(grp) == 4 for grp in a)
    assert len({tuple(g.token_ids) for g in a[0]}) > 1  # the samples of a prompt differ

    # Rollout: the same samples as sample() with the same seed, then the beam top-1; each
    # prompt prefilled exactly once (count forward calls with more than one input token).
    prefills = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kwargs: prefills.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        groups = dec.rollout(
            prompts,
            num_samples=4,
            beam_width=3,
            generator=torch.Generator().manual_seed(5),
            length_penalty=1.0,
        )
    finally:
        hook.remove()
    long_calls = [s for s in prefills if s[1] > 1]
    assert len(long_calls) == len(prompts)
    assert all(s[0] == 1 for s in long_calls)
    beams = dec.beam(prompts, beam_width=3, length_penalty=1.0)
    for grp, samples, beam in zip(groups, a, beams):
        assert len(grp) == 5
        assert [g.token_ids for g in grp[:4]] == [g.token_ids for g in samples]
        assert grp[4].kind == "beam" and grp[4].token_ids == beam.top.token_ids


def test_rollout_without_prefix_sharing_prefills_every_row_and_agrees(model, tok, prompts):
    """share_prefix=False (the benchmark's reference point) runs one prefill per row, N samples
    + 1 beam per prompt, and yields the same rollout as the shared decoder."""
    shared = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=10)
    unshared = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=10, share_prefix=False)
    prefills = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kwargs: prefills.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        alone = unshared.rollout(
            prompts, 3, 2, generator=torch.Generator().manual_seed(7), length_penalty=1.0
        )
    finally:
        hook.remove()
    assert len([s for s in prefills if s[1] > 1]) == len(prompts) * (3 + 1)
    together = shared.rollout(
        prompts, 3, 2, generator=torch.Generator().manual_seed(7), length_penalty=1.0
    )
    ids = lambda groups: [[g.token_ids for g in grp] for grp in groups]
    assert ids(alone) == ids(together)


def test_truncation_and_end_of_turn_only_where_accepting(model, tok, prompts):
    stop = end_of_turn_id(tok)
    dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=6)  # too short to close
    for g in dec.greedy(prompts) + [s for grp in dec.sample(prompts, 3) for s in grp]:
        assert g.truncated and not g.finished
        assert len(g.token_ids) == 6 and stop not in g.token_ids
        assert_valid(tok, JSON_GRAMMAR, g, 6)
    beams = dec.beam(prompts, beam_width=2, length_penalty=1.0)
    for b in beams:
        assert b.top.truncated and not b.top.finished and b.finished == []


def test_random_model_outputs_are_valid(model, tok, prompts):
    max_new = 16
    for grammar in (JSON_GRAMMAR, WORDS_GRAMMAR, FINITE_GRAMMAR):
        dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=max_new)
        groups = dec.rollout(
            prompts,
            num_samples=40,
            beam_width=3,
            generator=torch.Generator().manual_seed(0),
            length_penalty=1.0,
        )
        gens = [g for grp in groups for g in grp] + dec.greedy(prompts)
        assert len(gens) >= 120
        for g in gens:
            assert_valid(tok, grammar, g, max_new)
        finished = [g for g in gens if g.finished]
        assert len(finished) >= len(gens) // 4  # the word list may run past max_new_tokens
        if grammar == JSON_GRAMMAR:  # NUM may have leading zeros: not JSON, check by regex
            for g in finished:
                assert JSON_RE.fullmatch(g.text), g.text


def test_logits_wider_than_the_vocabulary(model, tok, prompts):
    """Extra logits columns (padded embeddings) are never generated, but they are part of the
    full-vocabulary softmax of the unconstrained log-probs."""
    wide = WideLogits(model)
    dec = ConstrainedDecoder(wide, tok, JSON_GRAMMAR, max_new_tokens=20)
    vocab = len(tok)
    gens = dec.greedy(prompts) + [s for grp in dec.sample(prompts, 5) for s in grp]
    for g in gens:
        assert max(g.token_ids) < vocab
        assert_valid(tok, JSON_GRAMMAR, g, 20)
    g = gens[0]
    lu_wide, _, _ = teacher_forced(wide, tok, JSON_GRAMMAR, prompts[0], g.token_ids)
    lu_narrow, lc_narrow, _ = teacher_forced(model, tok, JSON_GRAMMAR, prompts[0], g.token_ids)
    np.testing.assert_allclose(g.logp_unconstrained, lu_wide, atol=2e-4)
    np.testing.assert_allclose(g.logp_constrained, lc_narrow, atol=2e-4)
    assert min(np.array(lu_narrow) - np.array(lu_wide)) > 0.05


def test_peft_model_and_training_mode(model, tok, prompts):
    import copy

    from grammarrl.models.loading import add_lora

    cfg = compose_config(["model=tiny"])

    peft_model = add_lora(copy.deepcopy(model), cfg.lora)
    with torch.no_grad():  # a non-trivial adapter
        gen = torch.Generator().manual_seed(0)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    peft_model.train()  # dropout on: the decoder must switch it off and restore the mode
    dec = ConstrainedDecoder(peft_model, tok, JSON_GRAMMAR, max_new_tokens=20)
    gens = dec.greedy(prompts)
    assert peft_model.training
    peft_model.eval()
    base = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20).greedy(prompts)
    assert [g.token_ids for g in gens] != [g.token_ids for g in base]  # the adapter matters
    for prompt, g in zip(prompts, gens):
        tokens, lu, _, _ = brute_greedy(peft_model, tok, JSON_GRAMMAR, prompt, 20)
        assert g.token_ids == tokens
        np.testing.assert_allclose(g.logp_unconstrained, lu, atol=2e-4)


def test_bad_grammar_is_a_clear_error(model, tok):
    with pytest.raises(GrammarError, match="grammar"):
        ConstrainedDecoder(model, tok, "start: undefined_rule", max_new_tokens=4)


@pytest.mark.parametrize("cascade", [None, False])
def test_cache_rows_never_read_another_prompts_kv(model, tok, monkeypatch, cascade):
    """Two prompts of different lengths in one rollout batch, with a grammar whose beams dead-end
    (after three digits only the end token is allowed), so beam groups shrink and regrow and
    sample rows finish mid-batch: slots shift across the prompt boundary while the row count
    stays the same. Every row's recorded log-probs must equal a from-scratch recomputation, with
    the prompt KV kept once (cascade, the default) and copied per row."""
    import grammarrl.decoding.forward as forward_module

    grammar = r"start: /[01]{1,3}/"
    prompts = [
        encode_prompt(tok, [{"role": "user", "content": m}])
        for m in ("hi", "What colour is the sky on a clear day, and why? " * 3)
    ]
    crossings = []
    real_plan = forward_module.plan_cache_update

    def recording_plan(old_prompts, new_prompts, sources, trim):
        if len(old_prompts) == len(new_prompts) and old_prompts != new_prompts and not trim:
            crossings.append((old_prompts, new_prompts))
        return real_plan(old_prompts, new_prompts, sources, trim)

    monkeypatch.setattr(forward_module, "plan_cache_update", recording_plan)
    dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=6, cascade=cascade)
    for seed in range(24):
        groups = dec.rollout(
            prompts,
            num_samples=2,
            beam_width=3,
            generator=torch.Generator().manual_seed(seed),
            length_penalty=1.0,
        )
        for prompt, group in zip(prompts, groups):
            for gen in group:
                lu, lc, _ = teacher_forced(model, tok, grammar, prompt, gen.token_ids)
                np.testing.assert_allclose(
                    gen.logp_unconstrained,
                    lu,
                    atol=2e-4,
                    err_msg=f"seed {seed}, {gen.kind} {gen.token_ids}",
                )
                np.testing.assert_allclose(gen.logp_constrained, lc, atol=2e-4)
    assert crossings, "the batch never shifted rows across prompts: the test lost its point"


@pytest.mark.parametrize("slack", [0, -1])
def test_output_completed_at_the_cap_is_finished_not_truncated(model, tok, prompts, slack):
    """An output the grammar completes at exactly max_new_tokens is finished and valid (its end
    token is forced, one past the cap); one token less of room truncates it. Greedy, beam,
    samples and SMC particles alike."""
    from grammarrl.decoding.smc import smc

    stop = end_of_turn_id(tok)
    grammar = r'start: "{\"n\": " /[0-9]{2}/ "}"'  # a fixed number of tokens, then only the end
    free = ConstrainedDecoder(model, tok, grammar, max_new_tokens=30).greedy(prompts[:1])[0]
    length = len(free.token_ids) - 1  # without the end token
    cap = length + slack
    dec = ConstrainedDecoder(model, tok, grammar, max_new_tokens=cap)
    gens = (
        dec.greedy(prompts)
        + [b.top for b in dec.beam(prompts, 2, length_penalty=1.0)]
        + [
            s
            for grp in dec.sample(prompts, 3, generator=torch.Generator().manual_seed(0))
            for s in grp
        ]
        + smc(dec, prompts[:1], 3, generator=torch.Generator().manual_seed(0))[0].generations
    )
    assert len(gens) == 3 + 3 + 9 + 3
    for g in gens:
        if slack == 0:
            assert g.finished and not g.truncated, g
            assert len(g.token_ids) == cap + 1 and g.token_ids[-1] == stop
            assert len(g.logp_unconstrained) == cap + 1
        else:
            assert g.truncated and not g.finished and len(g.token_ids) == cap
        assert_valid(tok, grammar, g, cap)
    assert gens[0].token_ids == free.token_ids or slack


DEAD_END = "A: /a/ & /b/"  # an empty language: llguidance stops and offers only the end token


def test_a_grammar_dead_end_is_an_error_not_a_finished_output(model, tok, prompts):
    """Where the grammar cannot continue, llguidance stops and allows only the end token; an
    output that is not accepted there is a dead end (error, not finished). With no way out at
    all, every row is empty and no beam survives."""
    stop = end_of_turn_id(tok)
    nothing = ConstrainedDecoder(model, tok, f"start: A\n{DEAD_END}", max_new_tokens=8)
    gens = (
        nothing.greedy(prompts)
        + [b.top for b in nothing.beam(prompts, 2, length_penalty=1.0)]
        + [s for grp in nothing.sample(prompts, 2) for s in grp]
    )
    for g in gens:
        assert g.token_ids == [] and not g.finished and not g.truncated and g.error
        assert "\n" not in g.error  # one line, not llguidance's state dump
    assert all(b.finished == [] for b in nothing.beam(prompts, 2, length_penalty=1.0))

    branch = ConstrainedDecoder(model, tok, f'start: "1" | "2" " " A\n{DEAD_END}', max_new_tokens=8)
    samples = [
        s
        for grp in branch.sample(prompts, 8, generator=torch.Generator().manual_seed(0))
        for s in grp
    ]
    dead = [s for s in samples if s.text.startswith("2")]
    assert dead and all(not s.finished and s.error and stop not in s.token_ids for s in dead)
    assert all(s.finished and s.text == "1" for s in samples if s not in dead)
