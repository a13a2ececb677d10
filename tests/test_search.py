"""Inference-time methods on the `tiny` model: IS weights against brute force, SMC reduces to IS,
resampled particles keep exact per-token records, truncated particles weigh zero, Sample-Rerank
and posterior-mode selection, potentials, and mode=search end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.smc import ParticleSet, log_ess, smc
from grammarrl.errors import ConfigError
from grammarrl.job import validate
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.rl.reward import BidirectionalReward
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.search.methods import normalized_weights, posterior_draws, posterior_mode
from grammarrl.search.potentials import Potential, ReversePotential, TaskPotential, make_potential
from grammarrl.search.rerank import rerank
from grammarrl.tasks import load_task
from grammarrl.tasks.conll import closed_fields, field_penalty
from grammarrl.tasks.gloss import gloss_penalty, gloss_terms_of
from grammarrl.types import Example
from tests.conftest import compose_config
from tests.support.decoding import (
    WORDS_GRAMMAR,
    Sharpened,
    allowed_mask,
    assert_valid,
    fresh_matcher,
    full_logits,
    step_records,
    teacher_forced,
)
from tests.support.tasks import ToyTask

# The decoding tests' JSON grammar with numbers of at most 2 digits (a smaller space to enumerate).
JSON_GRAMMAR = r"""
start: "{\"color\": \"" COLOR "\", \"n\": " NUM "}"
COLOR: "red" | "green" | "blue" | "dark red"
NUM: /[0-9]{1,2}/
"""
MESSAGES = ["hi", "What colour is the sky on a clear day?", "x y z"]


@pytest.fixture(scope="module")
def model(tiny):
    return Sharpened(tiny[0], 4.0)  # peaked enough for the mask to matter, still random


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny[1]


@pytest.fixture(scope="module")
def prompts(tok):
    return [encode_prompt(tok, [{"role": "user", "content": m}]) for m in MESSAGES]


def brute_log_weight(model, tok, grammar, prompt, tokens, temperature=1.0):
    """log p(y)/q(y) from scratch: full forwards without cache, fresh matcher; p = unconstrained
    softmax, q = the masked softmax at `temperature`."""
    stop = end_of_turn_id(tok)
    matcher = fresh_matcher(tok, grammar)
    total = 0.0
    for i, t in enumerate(tokens):
        logits = full_logits(model, prompt + tokens[:i])
        masked, lse_all, _ = step_records(logits, allowed_mask(matcher, logits.numel()))
        log_q = torch.log_softmax(masked / temperature, -1)[t]
        total += float(logits[t] - lse_all) - float(log_q)
        if t != stop:
            assert matcher.consume_token(t)
    return total


class TextPotential:
    """A twist from plain functions of the text (for tests)."""

    def __init__(self, prefix=None, complete=None, on_prefix=True):
        self._prefix = prefix or (lambda p, text: 0.0)
        self._complete = complete or (lambda p, text: 0.0)
        self.on_prefix = on_prefix
        self.complete_calls = 0

    def prefix(self, prompt, text):
        return self._prefix(prompt, text)

    def complete(self, prompt, texts):
        self.complete_calls += 1
        return [self._complete(prompt, t) for t in texts]


# --------------------------------------------------------------------------- weights


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_is_weights_equal_p_over_q_by_brute_force(model, tok, prompts, temperature):
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    sets = smc(
        decoder,
        prompts[:2],
        4,
        ess_threshold=0.0,
        temperature=temperature,
        generator=torch.Generator().manual_seed(3),
    )
    checked = 0
    for prompt, ps in zip(prompts[:2], sets):
        assert len(ps.generations) == 4 and ps.resamples == 0
        for gen, logw, pot in zip(ps.generations, ps.log_weights, ps.potentials):
            assert_valid(tok, JSON_GRAMMAR, gen, 20)
            assert pot == 0.0
            expected = brute_log_weight(
                model, tok, JSON_GRAMMAR, prompt, gen.token_ids, temperature
            )
            assert logw == pytest.approx(expected, abs=2e-4)
            if temperature == 1.0:  # p/q of the masked softmax = the allowed mass
                assert logw == pytest.approx(sum(gen.log_allowed_mass), abs=1e-9)
            checked += 1
    assert checked == 8
    # the weights are not trivial: particles differ in weight
    assert max(sets[0].log_weights) - min(sets[0].log_weights) > 1e-3


def test_smc_without_resampling_is_decoder_sampling(model, tok, prompts):
    """Same generator seed: the particles are exactly decoder.sample's samples, and their
    weights the summed allowed mass (the proposal is unchanged by the particle loop; truncated
    outputs weigh zero)."""
    decoder = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=8)
    samples = decoder.sample(prompts, 5, generator=torch.Generator().manual_seed(11))
    sets = smc(decoder, prompts, 5, ess_threshold=0.0, generator=torch.Generator().manual_seed(11))
    for gens, ps in zip(samples, sets):
        assert [g.token_ids for g in gens] == [g.token_ids for g in ps.generations]
        assert [g.finished for g in gens] == [g.finished for g in ps.generations]
        for g, w in zip(gens, ps.log_weights):
            if g.finished:
                assert w == pytest.approx(sum(g.log_allowed_mass), abs=1e-6)
            else:
                assert w == -math.inf


def test_smc_with_constant_potential_and_no_resampling_reduces_to_is(model, tok, prompts):
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    const = -2.5
    twist = TextPotential(lambda p, t: const, lambda p, t: const, on_prefix=True)
    plain = smc(decoder, prompts, 6, ess_threshold=0.0, generator=torch.Generator().manual_seed(5))
    twisted = smc(
        decoder,
        prompts,
        6,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(5),
    )
    for a, b in zip(plain, twisted):
        assert [g.token_ids for g in a.generations] == [g.token_ids for g in b.generations]
        for wa, wb in zip(a.log_weights, b.log_weights):
            assert wb == pytest.approx(wa + const, abs=1e-9)
        # normalised weights (what selection and ESS see) are identical
        assert normalized_weights(a.log_weights) == pytest.approx(normalized_weights(b.log_weights))
        assert posterior_mode(a) == posterior_mode(b)
        assert b.proposal_log_weights == pytest.approx(a.log_weights)


def test_twist_telescopes_to_the_complete_potential(model, tok, prompts):
    """A prefix twist changes only the path; without resampling the final weight is
    p/q * Phi(y) whatever the prefix values were."""
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    twist = TextPotential(lambda p, t: -0.1 * len(t), lambda p, t: -1.0 if "red" in t else 0.0)
    plain = smc(decoder, prompts, 4, ess_threshold=0.0, generator=torch.Generator().manual_seed(2))
    twisted = smc(
        decoder,
        prompts,
        4,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(2),
    )
    for a, b in zip(plain, twisted):
        for g, wa, wb, pot in zip(a.generations, a.log_weights, b.log_weights, b.potentials):
            assert g.finished
            phi = -1.0 if "red" in g.text else 0.0
            assert pot == phi and wb == pytest.approx(wa + phi, abs=1e-9)


def test_resampling_forks_particles_with_exact_records(model, tok, prompts):
    """With resampling forced at every uneven step, every final particle still carries the
    per-token log-probs of teacher forcing (KV rows and matchers forked together), the
    population keeps N members, and resampling equalises the weights."""
    decoder = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=6)
    twist = TextPotential(lambda p, t: -1.5 * t.count("dog"), lambda p, t: -1.5 * t.count("dog"))
    sets = smc(
        decoder,
        prompts,
        6,
        twist=twist,
        ess_threshold=1.0,
        generator=torch.Generator().manual_seed(0),
        resample_generator=torch.Generator().manual_seed(1),
    )
    assert sum(ps.resamples for ps in sets) >= 3
    for prompt, ps in zip(prompts, sets):
        assert len(ps.generations) == len(ps.log_weights) == 6
        for gen in {id(g): g for g in ps.generations}.values():
            assert_valid(tok, WORDS_GRAMMAR, gen, 6)
            lu, lc, lm = teacher_forced(model, tok, WORDS_GRAMMAR, prompt, gen.token_ids)
            assert gen.logp_unconstrained == pytest.approx(lu, abs=2e-4)
            assert gen.logp_constrained == pytest.approx(lc, abs=2e-4)
            assert gen.log_allowed_mass == pytest.approx(lm, abs=2e-4)
        # potentials recorded = the twist of the particle's final text (truncated: -inf)
        for gen, pot in zip(ps.generations, ps.potentials):
            assert pot == (-1.5 * gen.text.count("dog") if gen.finished else -math.inf)


def test_resampling_follows_the_potential(model, tok, prompts):
    """A strong potential against a word steers SMC away from it (IS keeps the proposal's rate)."""
    decoder = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=4)
    twist = TextPotential(lambda p, t: -8.0 * t.count("cat"), lambda p, t: -8.0 * t.count("cat"))
    n = 12

    def cat_rate(threshold):
        sets = smc(
            decoder,
            prompts,
            n,
            twist=twist,
            ess_threshold=threshold,
            generator=torch.Generator().manual_seed(4),
            resample_generator=torch.Generator().manual_seed(4),
        )
        gens = [g for ps in sets for g in ps.generations]
        return sum("cat" in g.text for g in gens) / len(gens)

    assert cat_rate(1.0) < cat_rate(0.0)


def test_dead_particles_have_zero_weight(model, tok, prompts):
    decoder = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=4)
    twist = TextPotential(lambda p, t: 0.0, lambda p, t: float("-inf"), on_prefix=False)
    sets = smc(
        decoder,
        prompts[:1],
        4,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    ps = sets[0]  # finished: killed by the potential; truncated: outside L(G)
    assert all(w == -math.inf for w in ps.log_weights)
    assert normalized_weights(ps.log_weights) is None and log_ess(ps.log_weights) == -math.inf


def test_truncated_particles_have_zero_weight(model, tok, prompts):
    """An output cut at max_new_tokens is outside L(G): weight and potential zero (not the
    potential-free p/q, which would outweigh every finished output), so the ESS and normalised
    weights count finished particles only; all truncated: the weights vanish, an output is still
    chosen."""
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=13)
    twist = TextPotential(complete=lambda p, t: -3.0, on_prefix=False)
    sets = smc(
        decoder,
        prompts,
        6,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    mixed, cut = sets[0], sets[1]
    assert 0 < sum(g.truncated for g in mixed.generations) < 6
    assert all(g.truncated for g in cut.generations)
    for ps in sets:
        for gen, logw, pot in zip(ps.generations, ps.log_weights, ps.potentials):
            if gen.truncated:
                assert logw == pot == -math.inf
            else:
                assert pot == -3.0
                assert logw == pytest.approx(sum(gen.log_allowed_mass) - 3.0, abs=1e-9)
    finished = [w for g, w in zip(mixed.generations, mixed.log_weights) if g.finished]
    assert log_ess(mixed.log_weights) == pytest.approx(log_ess(finished))
    weights = normalized_weights(mixed.log_weights)
    assert all(w == 0.0 for w, g in zip(weights, mixed.generations) if g.truncated)
    assert normalized_weights(cut.log_weights) is None and log_ess(cut.log_weights) == -math.inf
    assert rerank(cut) == posterior_mode(cut)


def test_resampling_never_copies_a_truncated_particle(model, tok, prompts):
    """Particles complete at the cap live one more step (their end token is forced) beside the
    truncated ones: resampling then draws from the live particles only."""
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=12)
    sets = smc(
        decoder,
        prompts,
        6,
        twist=TextPotential(complete=lambda p, t: -3.0, on_prefix=False),
        ess_threshold=1.0,
        generator=torch.Generator().manual_seed(0),
        resample_generator=torch.Generator().manual_seed(0),
    )
    assert any(g.finished for ps in sets for g in ps.generations)
    truncated = [[g for g in ps.generations if g.truncated] for ps in sets]
    assert [len({id(g) for g in gens}) for gens in truncated] == [len(g) for g in truncated]
    for ps in sets:
        assert all(w == -math.inf for g, w in zip(ps.generations, ps.log_weights) if g.truncated)


def test_completion_potential_is_scored_once_per_prompt_without_resampling(model, tok, prompts):
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    twist = TextPotential(complete=lambda p, t: -float(len(t)), on_prefix=False)
    smc(
        decoder,
        prompts,
        5,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert twist.complete_calls == len(prompts)  # deferred: one batch per prompt


def test_forward_tokens_count_prefill_and_decode_rows(model, tok, prompts):
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    gen = decoder.greedy(prompts[:1])[0]
    assert gen.finished
    assert decoder.forward_tokens == len(prompts[0]) + gen.num_tokens - 1
    before = decoder.forward_tokens
    sets = smc(
        decoder, prompts[:1], 3, ess_threshold=0.0, generator=torch.Generator().manual_seed(0)
    )
    lengths = [g.num_tokens for g in sets[0].generations]
    # one prefill, then every live row once per step after the first
    assert decoder.forward_tokens - before == len(prompts[0]) + sum(n - 1 for n in lengths)


# --------------------------------------------------------------------------- selection


def _gen(text, finished=True, logp=-1.0):
    return Generation([1], text, [logp], [logp], [0.0], finished, not finished, "sample")


def test_rerank_picks_the_argmax_of_the_potential(model, tok, prompts):
    decoder = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)

    def phi(p, text):
        return -abs(len(text) - 30) - 0.01 * sum(map(ord, text)) % 1

    twist = TextPotential(complete=phi, on_prefix=False)
    sets = smc(
        decoder,
        prompts,
        8,
        twist=twist,
        ess_threshold=0.0,
        generator=torch.Generator().manual_seed(9),
    )
    for ps in sets:
        i = rerank(ps)
        values = [phi(0, g.text) for g in ps.generations]
        assert ps.potentials == values
        assert values[i] == max(v for v, g in zip(values, ps.generations) if g.finished)
    # ties go to the higher proposal weight; complete beats a higher-potential truncated sample
    ps = ParticleSet(
        [_gen("a"), _gen("b"), _gen("c", finished=False)], [-3.0, -1.0, 5.0], [-1.0, -1.0, 0.0]
    )
    assert rerank(ps) == 1


def test_posterior_mode_groups_prefers_complete_and_breaks_ties_by_lm():
    ps = ParticleSet(
        [_gen("x"), _gen("y"), _gen("x"), _gen("z", finished=False)],
        [math.log(0.25), math.log(0.4), math.log(0.25), math.log(5.0)],
        [0.0] * 4,
    )
    assert ps.generations[posterior_mode(ps)].text == "x"  # 0.5 beats 0.4; z is truncated
    tie = ParticleSet([_gen("a", logp=-5.0), _gen("b", logp=-2.0)], [0.0, 0.0], [0.0, 0.0])
    assert posterior_mode(tie) == 1
    dead = ParticleSet(
        [_gen("a", logp=-5.0), _gen("b", logp=-2.0)], [-math.inf, -math.inf], [0.0, 0.0]
    )
    assert normalized_weights(dead.log_weights) is None and posterior_mode(dead) == 1


def test_posterior_draws_follow_the_weights():
    ps = ParticleSet(
        [_gen("a"), _gen("b"), _gen("c", finished=False)],
        [math.log(0.9), math.log(0.1), 10.0],
        [0.0] * 3,
    )
    draws = posterior_draws([ps], 400, seed=0)
    share = sum(d[0].text == "a" for d in draws) / 400
    assert 0.84 < share < 0.96  # truncated "c" is never drawn while complete ones exist
    assert all(d[0].text != "c" for d in draws)


# --------------------------------------------------------------------------- potentials


def _task_potential(name: str) -> Potential:
    return make_potential("task", load_task(compose_config([f"task={name}", "data.dir=null"])))


def test_conll_potential_rules():
    sentence = "John Smith visited Germany and the Netherlands ."
    assert field_penalty(sentence, {"person": "John Smith", "location": "Germany"}) == 0.0
    assert field_penalty(sentence, {"person": "Paris"}) == -3.0  # not in the sentence
    assert field_penalty(sentence, {"location": "German"}) == -1.5  # only inside "Germany"
    assert field_penalty(sentence, {"location": "Germany", "misc": "Germany"}) == -1.0
    assert field_penalty(sentence, {"a": "Germany", "b": "Germany", "c": "Germany"}) == -2.0
    prefix = '{"person": "Paris", "organization": "Germ'
    assert closed_fields(prefix) == {"person": "Paris"}  # the open field is not judged yet
    ex = Example("u", sentence, "")
    pot = _task_potential("conll")
    assert isinstance(pot, TaskPotential) and pot.on_prefix
    assert pot.prefix(ex, prefix) == -3.0
    full = '{"person": "John Smith", "organization": "", "location": "Germa", "misc": ""}'
    assert pot.complete(ex, [full]) == [-1.5]


def test_gloss_potential_rules():
    src = "the committee approved the new budget for schools"
    good = gloss_terms_of("COMMITTEE APPROVE NEW-DESC BUDGET FOR SCHOOL", True)
    assert gloss_penalty(src, good, complete=True) == 0.0
    assert gloss_penalty(src, good + ["BANANA"], complete=True) == -0.5  # precision
    assert gloss_penalty(src, ["COMMITTEE", "BE", "NOT-DESC"], complete=False) == 0.0  # function
    missing = gloss_terms_of("COMMITTEE APPROVE", True)
    assert gloss_penalty(src, missing, complete=False) == 0.0  # coverage: complete only
    assert gloss_penalty(src, missing, complete=True) == -1.5  # new, budget, schools
    assert gloss_penalty(src, ["BUDGET"] * 2 + ["SCHOOL"], complete=False) == 0.0  # run of 2 ok
    assert gloss_penalty(src, ["BUDGET"] * 4, complete=False) == -1.0  # one run of >= 3
    assert gloss_penalty(src, ["BANANA"] * 7 + ["X"], complete=False) == -0.5 * 5 - 1.0  # capped
    pot = _task_potential("gloss")
    ex = Example("u", src, "")
    assert pot.prefix(ex, "COMMITTEE BAN") == 0.0  # the last term may still grow
    assert pot.prefix(ex, "COMMITTEE BANANA ") == -0.5


def test_reverse_potential_is_the_summed_reverse_likelihood(tiny):
    model, tok = tiny
    task = ToyTask(["alpha", "beta", "gamma"])
    scorer = ReferenceScorer(model, tok, task)
    pot = ReversePotential(BidirectionalReward(scorer), batch_size=2)
    ex = Example("u", "a short sentence about beta", "beta")
    texts = ["alpha", "beta", "gamma"]
    values = pot.complete(ex, texts)
    prompt = encode_prompt(tok, task.forward_messages(ex))
    cands = [tok.encode(t, add_special_tokens=False) for t in texts]
    ref = scorer.score(ex, prompt, cands, texts)
    n_x = len(scorer.input_ids(ex))
    assert values == pytest.approx([float(r) * n_x for r in ref.reverse], abs=1e-3)
    assert pot.forward_tokens > 0 and pot.forward_calls == 2
    static = len(scorer.reverse_static_prefix().tokens)  # cached: only the suffixes are run
    before, uneven = pot.forward_tokens, ["alpha", "a much longer candidate gloss here"]
    pot.complete(ex, uneven)
    assert pot.forward_tokens - before == sum(
        len(encode_prompt(tok, task.reverse_messages(t))) + n_x - static for t in uneven
    )
    bound = pot.bind([ex])
    assert bound.complete(0, ["beta", "beta"]) == pytest.approx([values[1]] * 2)


def test_potential_none_and_bind_memoises():
    calls = []

    class Counting(Potential):
        on_prefix = True

        def prefix(self, example, text):
            calls.append(text)
            return -1.0

    bound = Counting().bind([Example("u", "x", "")])
    assert bound.prefix(0, "ab") == bound.prefix(0, "ab") == -1.0
    assert calls == ["ab"]
    assert Potential().complete(Example("u", "x", ""), ["a", "b"]) == [0.0, 0.0]


# --------------------------------------------------------------------------- mode=search


def test_search_config_validation():
    validate(compose_config(["mode=search", "search.method=smc"]))
    with pytest.raises(ConfigError, match="search.method"):
        validate(compose_config(["mode=search", "search.method=beam"]))
    with pytest.raises(ConfigError, match="search.potential"):
        validate(compose_config(["mode=search", "search.potential=channel"]))
    # WoS has no task potential (the paper's "n/a"): the job validates, so sweeps list it,
    # and stops with a clear error when it builds the potential
    validate(compose_config(["mode=search", "task=wos", "search.method=smc"]))
    with pytest.raises(ConfigError, match="no task-specific potential"):
        make_potential("task", ToyTask(["a"]))
    with pytest.raises(ConfigError, match="search.particles"):
        validate(compose_config(["mode=search", "search.particles=0"]))


def _search_cfg(tmp_path, method, extra=()):
    return compose_config(
        [
            "mode=search",
            "model=tiny",
            "task=conll",
            "logger=none",
            f"search.method={method}",
            "search.particles=3",
            "search.posterior_draws=5",
            "eval.num_test_sets=2",
            "eval.test_size=2",
            "eval.sampler_seeds=[0,5]",
            "task.max_new_tokens=16",
            f"cache_dir={tmp_path}/cache",
            *extra,
        ]
    )


def test_run_search_end_to_end_writes_results_and_pairs_rerank_with_is(tiny, tmp_path):
    from grammarrl.evaluation.settings import EvalSettings
    from grammarrl.search.run import search
    from grammarrl.search.settings import SearchSettings
    from grammarrl.tasks import load_task

    model, tok = tiny
    records = {}
    for method in ("is", "rerank", "smc"):
        cfg = _search_cfg(tmp_path, method, ["search.potential=task"] if method == "smc" else [])
        validate(cfg)
        task = load_task(cfg)
        out = tmp_path / method
        settings = SearchSettings.from_config(cfg.search)
        res = search(EvalSettings.from_config(cfg), settings, model, tok, task, out, progress=False)
        saved = json.loads((out / "results.json").read_text())
        rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert saved["decoding"] == method and saved["particles"] == 3
        assert saved["dtype"] == str(model.dtype).removeprefix("torch.")  # rows compare by it
        # two sampler seeds: every draw's per-set scores, their mean per set, one row per
        # (draw, set, example) with every selection's per-example score
        assert saved["sampler_seeds"] == [0, 5] and len(saved["scores_per_draw"]) == 2
        assert saved["scores"] == pytest.approx(
            [sum(s) / 2 for s in zip(*saved["scores_per_draw"])]
        )
        assert len(saved["scores"]) == 2 and len(rows) == 8
        assert [r["sampler_seed"] for r in rows] == [0] * 4 + [5] * 4
        assert [r["draw"] for r in rows] == [0] * 4 + [1] * 4
        assert all(r["selection_scores"][method] == r["scores"] for r in rows)
        assert saved["set_ids"] == [[r["uid"] for r in rows if r["set"] == i][:2] for i in (0, 1)]
        for key in ("mean_ess", "complete_selected", "weights_vanished", "posterior_weighted"):
            assert key in saved["diagnostics"]
        assert saved["cost"] > 0 and saved["cost_tokens"] > 1.0  # N rows decode vs one greedy
        assert all(len(r["particles"]) == 3 for r in rows)
        records[method] = (res, rows)
    (is_res, is_rows), (rr_res, rr_rows) = records["is"], records["rerank"]
    # same seed, same particles: rerank's output is derived from the IS population
    assert [r["particles"] for r in is_rows] == [r["particles"] for r in rr_rows]
    assert is_res["selections"]["rerank"]["scores"] == rr_res["scores"]
    assert rr_res["selections"]["is"]["scores"] == is_res["scores"]
    assert records["smc"][0]["potential"] == "task"
    assert is_res["potential"] == "reverse"


def test_adapter_proposal_with_reference_potentials(tiny, tmp_path, monkeypatch):
    """eval.adapter: the trained adapter is the LM of the proposal (particles change), while
    the reverse potential is still pi_ref's (adapter disabled: same values as the base model)."""
    import copy

    from grammarrl.models.loading import add_lora
    from grammarrl.search.run import run_search

    model, tok = tiny
    cfg = _search_cfg(
        tmp_path,
        "is",
        [
            "search.particles=2",
            "eval.test_size=1",
            "eval.num_test_sets=1",
            "eval.sampler_seeds=[0]",
            "search.greedy_baseline=false",
        ],
    )
    policy = add_lora(copy.deepcopy(model), cfg.lora)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    adapter_dir = tmp_path / "adapter"
    policy.save_pretrained(adapter_dir)

    task = ToyTask(["alpha", "beta"])
    ex = Example("u", "a sentence about alpha", "alpha")
    base_values = ReversePotential(BidirectionalReward(ReferenceScorer(model, tok, task))).complete(
        ex, ["alpha", "beta"]
    )
    peft_values = ReversePotential(
        BidirectionalReward(ReferenceScorer(policy, tok, task))
    ).complete(ex, ["alpha", "beta"])
    assert peft_values == pytest.approx(base_values, abs=1e-4)

    monkeypatch.chdir(tmp_path)  # run_search writes outputs/... under the working directory
    # the fixture's model (copied: attaching an adapter modifies the base model in place)
    monkeypatch.setattr(
        "grammarrl.models.loading.load_model", lambda *args, **kwargs: (copy.deepcopy(model), tok)
    )
    plain = run_search(cfg)
    cfg.eval.adapter = str(adapter_dir)
    adapted = run_search(cfg)
    # named relative to the working directory (the repository), the same on every machine
    assert adapted["adapter"] == "adapter" and plain["adapter"] is None

    def particles(results):
        path = Path(results["path"]).with_name("predictions.jsonl")
        return [json.loads(line)["particles"] for line in path.read_text().splitlines()]

    first, first0 = particles(adapted)[0], particles(plain)[0]
    assert [p["logp_unconstrained"] for p in first] != [p["logp_unconstrained"] for p in first0]


def test_a_killed_search_resumes_from_its_progress_and_draws_the_same(tiny, tmp_path, monkeypatch):
    """Killed in its second draw's second example, the search run again in the same directory
    continues from its progress file: the same particles, scores and forward token counts as
    an uninterrupted run, and no progress file left behind."""
    from grammarrl.evaluation.settings import EvalSettings
    from grammarrl.search import particles, resume
    from grammarrl.search import run as search_run
    from grammarrl.search.settings import SearchSettings

    model, tok = tiny
    # 64 tokens: outputs complete, so the reverse potential runs and its counter is checked too
    cfg = _search_cfg(tmp_path, "is", ["search.greedy_baseline=false", "task.max_new_tokens=64"])
    task, settings = load_task(cfg), SearchSettings.from_config(cfg.search)

    def run(out: Path) -> tuple[dict, list[dict]]:
        search_run.search(
            EvalSettings.from_config(cfg), settings, model, tok, task, out, progress=False
        )
        rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        return json.loads((out / "results.json").read_text()), rows

    whole, whole_rows = run(tmp_path / "whole")
    monkeypatch.setattr(resume, "SAVE_EVERY_SECONDS", 0.0)
    calls, real_smc = [], particles.smc

    def killed_at_the_sixth_example(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # 4 distinct examples a draw: the second draw's second
            raise KeyboardInterrupt
        return real_smc(*args, **kwargs)

    monkeypatch.setattr(particles, "smc", killed_at_the_sixth_example)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "resumed")
    saved = sorted(p.name for p in (tmp_path / "resumed" / resume.FOLDER).iterdir())
    assert saved == ["draw0_seed0.pt", "draw1_seed5.pt"]
    monkeypatch.setattr(particles, "smc", real_smc)
    resumed, resumed_rows = run(tmp_path / "resumed")
    assert len(calls) == 6  # the patched search stopped; nothing of it ran again
    assert resumed_rows == whole_rows
    for key in ("scores", "scores_per_draw", "selections", "diagnostics", "forward_tokens"):
        assert resumed[key] == whole[key], key
    assert resumed["potential_forward_tokens"] == whole["potential_forward_tokens"] > 0
    assert not (tmp_path / "resumed" / resume.FOLDER).exists()
