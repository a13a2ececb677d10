"""train.objective=amortised_is and train.init_adapter on the tiny model: resampling, the
importance weights against mode=search's Full IS, one training run end to end, RLOO unchanged."""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import json
import math

import pytest
import torch
from omegaconf import DictConfig

from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.errors import ConfigError
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import add_lora, reference_mode
from grammarrl.search.particles import search_examples
from grammarrl.search.settings import SearchSettings
from grammarrl.tasks import load_task
from grammarrl.training.amortised import candidate_indices, resample
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.policy import policy_logp
from grammarrl.training.settings import StepSettings
from tests.conftest import compose_config, train_in
from tests.test_module import STEP

NEG_INF = float("-inf")
BASE = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "task.max_new_tokens=64",
    "search.particles=6",
    "rollout.num_samples=3",
]
AMORTISED = [*BASE, "train.objective=amortised_is"]


def make_module(tiny, overrides: list[str], trained: bool) -> GrammarRLModule:
    """A module over a fresh LoRA copy of the tiny model; `trained`: a non-zero adapter."""
    cfg = compose_config(overrides)
    torch.manual_seed(0)
    policy = add_lora(copy.deepcopy(tiny[0]), cfg.lora)
    if trained:
        randomise_lora_b(policy)
    module = GrammarRLModule(
        policy, tiny[1], load_task(cfg), StepSettings.from_config(cfg, 1.0, 1.0)
    )
    module.setup("fit")
    return module


def randomise_lora_b(policy: torch.nn.Module, seed: int = 1) -> None:
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


def test_resampling_draws_in_proportion_to_the_normalised_weights():
    log_weights = [math.log(5.0), math.log(3.0), math.log(2.0), NEG_INF]  # w = .5, .3, .2, 0
    picks = resample(log_weights, 4000, torch.Generator().manual_seed(7))
    expected = torch.multinomial(
        torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64),
        4000,
        replacement=True,
        generator=torch.Generator().manual_seed(7),
    )
    assert picks == sorted(expected.tolist())  # the same draws as the hand-computed weights
    counts = [picks.count(i) for i in range(4)]
    assert counts[3] == 0
    assert [c / 4000 for c in counts[:3]] == pytest.approx([0.5, 0.3, 0.2], abs=0.03)
    assert resample([NEG_INF, NEG_INF], 3, torch.Generator().manual_seed(0)) == []
    one = resample([0.0, NEG_INF], 3, torch.Generator().manual_seed(0))
    assert one == [0, 0, 0]


def _search_particles(module: GrammarRLModule, search: DictConfig, example, seed: int):
    """mode=search's Full IS particles of one example with the module's decoder and potential,
    under the `search` group the module was built with."""
    populations, _ = search_examples(
        module.decoder,
        module.tokenizer,
        module.task,
        [example],
        module.potential,
        SearchSettings.from_config(search),
        seed,
        progress=False,
    )
    (population,) = populations.values()
    return population


def _logp(model, prompt: list[int], outputs: list[list[int]], reference: bool) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        if reference:
            with reference_mode(model):
                logps = sequence_logprobs(model, [prompt + o for o in outputs], [len(prompt)] * 6)
        else:
            logps = sequence_logprobs(model, [prompt + o for o in outputs], [len(prompt)] * 6)
    return torch.stack([lp.sum() for lp in logps]).double()


@pytest.mark.parametrize(
    ("trained", "proposal"), [(False, "policy"), (True, "policy"), (True, "reference")]
)
def test_importance_weights_are_full_is_weights_retargeted_to_the_reference(
    tiny, trained, proposal
):
    """With a zero adapter (policy = reference) the weights are mode=search's IS weights of the
    same particles; with a trained adapter they differ by log p_ref(y) − log p_θ(y); with the
    frozen proposal (`train.proposal=reference`) the particles and weights are mode=search's
    with the adapter disabled, whatever the adapter."""
    overrides = [*AMORTISED, "search.batch_size=1", f"train.proposal={proposal}"]
    module = make_module(tiny, overrides, trained)
    example = module.task.splits().train[0]
    frozen = proposal == "reference"
    with reference_mode(module.policy) if frozen else contextlib.nullcontext():
        searched = _search_particles(module, compose_config(overrides).search, example, seed=11)
    module.generator.manual_seed(11)
    step = module.amortised_step_loss([example])
    (population,) = step.populations
    assert [g.token_ids for g in population.generations] == [
        g.token_ids for g in searched.generations
    ]
    idx = candidate_indices(searched)
    assert len(idx) == 6  # every particle of the tiny model completes within 64 tokens
    ours = torch.tensor(step.log_weights[0], dtype=torch.float64)
    theirs = torch.tensor([searched.log_weights[i] for i in idx], dtype=torch.float64)
    if not trained or frozen:
        assert ours == pytest.approx(theirs, abs=1e-3)
        return
    prompt = encode_prompt(module.tokenizer, module.task.forward_messages(example))
    outputs = [searched.generations[i].token_ids for i in idx]
    shift = _logp(module.policy, prompt, outputs, True) - _logp(
        module.policy, prompt, outputs, False
    )
    assert shift.abs().min() > 0.1  # the adapter moved the model: the targets differ
    assert ours - theirs == pytest.approx(shift, abs=1e-3)


def test_one_step_lowers_the_nll_of_its_targets(tiny):
    module = make_module(tiny, AMORTISED, trained=False)
    batch = module.task.splits().train[:2]
    step = module.amortised_step_loss(batch)
    assert step.policy_logp.shape == (2, 3)
    assert step.loss.item() == pytest.approx(-step.policy_logp.mean().item(), rel=1e-6)  # β·KL off
    assert all(len(t) == 3 for t in step.targets)
    optimizer = torch.optim.SGD([p for p in module.policy.parameters() if p.requires_grad], lr=1e-3)
    step.loss.backward()
    optimizer.step()
    prompts = [encode_prompt(module.tokenizer, module.task.forward_messages(ex)) for ex in batch]
    module.policy.eval()
    with torch.no_grad():
        after = policy_logp(module.policy, prompts, step.groups, module.settings.share_prefix)
    assert (-after.mean()).item() < step.parts["loss/pg"].item() - 1e-3


def test_kl_in_the_loss_adds_beta_times_the_targets_kl(tiny):
    module = make_module(tiny, [*AMORTISED, "kl_penalty=loss", "beta=0.5"], trained=True)
    step = module.amortised_step_loss(module.task.splits().train[:1])
    kl = (step.policy_logp - step.ref_logp).mean()
    assert abs(kl.item()) > 0.1
    assert step.loss.item() == pytest.approx((-step.policy_logp.mean() + 0.5 * kl).item(), rel=1e-5)


RLOO_STEP = [*STEP, "beta=0.1"]  # test_module's step, with a KL term


def test_rloo_step_unchanged_and_its_forward_passes_counted(tiny):
    """train.objective=rloo (the default): the same candidates and loss as before the objective
    existed (pinned from the code before it), and every model call of the step counted."""
    module = make_module(tiny, RLOO_STEP, trained=True)
    assert module.settings.amortised is None  # train.objective=rloo
    calls, tokens = module.decoder.forward_calls, module.decoder.forward_tokens
    step = module.step_loss(module.task.splits().train[:2])
    ids = [[g.token_ids for g in group] for group in step.rollouts.groups]
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    assert digest == "e7bc2994296e50ff"
    assert step.loss.item() == pytest.approx(0.03687116876244545, rel=1e-5)
    assert step.policy_logp[0, 0].item() == pytest.approx(-258.8743896484375, rel=1e-6)
    decoded = module.decoder.forward_calls - calls
    # the decoder's calls, plus the reference's and the loss's passes (one each per input at
    # least): the counter sees every forward of the model, whoever makes it
    assert module.counter.calls >= decoded + 2 * 2
    assert module.counter.tokens > module.decoder.forward_tokens - tokens


def test_config_validation_of_the_new_keys(tmp_path):
    from grammarrl.job import validate

    with pytest.raises(ConfigError, match="train.objective='ppo'"):
        validate(compose_config([*BASE, "train.objective=ppo"]))
    with pytest.raises(ConfigError, match="train.proposal='frozen'"):
        validate(compose_config([*AMORTISED, "train.proposal=frozen"]))
    with pytest.raises(ConfigError, match="train.proposal=reference .*amortised_is"):
        validate(compose_config([*BASE, "train.proposal=reference"]))
    with pytest.raises(ConfigError, match="train.init_adapter=.*adapter_config.json"):
        validate(compose_config([*BASE, f"train.init_adapter={tmp_path / 'none'}"]))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 128}))
    with pytest.raises(ConfigError, match="lora.r=64 .*8, the shape of train.init_adapter"):
        validate(compose_config([*BASE, f"train.init_adapter={tmp_path}"]))
    validate(compose_config([*BASE, f"train.init_adapter={tmp_path}", "lora.r=8"]))


def test_a_run_of_another_objective_or_init_adapter_is_not_continued(tmp_path):
    """A run dir recorded before the keys existed reads as rloo from a fresh adapter; a job with
    another objective or start adapter is refused there (no skip, no resume)."""
    from grammarrl.runs import rundir
    from grammarrl.runs.atomic import write_json

    cfg = compose_config(["model=tiny", "mode=train", "logger=none"])
    rundir.commit(cfg, tmp_path, rundir.Plan())
    write_json(tmp_path / "results.json", {"mean": 0.5})
    record = json.loads((tmp_path / "job.json").read_text())
    for key in ("objective", "init_adapter"):
        del record["config"]["train"][key]
    write_json(tmp_path / "job.json", record)
    assert rundir.plan_job(cfg, tmp_path).done == {"mean": 0.5}
    (tmp_path / "start").mkdir()
    for change, named in (
        ("train.objective=amortised_is", "train.objective=rloo"),
        (f"train.init_adapter={tmp_path / 'start'}", "train.init_adapter=None"),
    ):
        other = compose_config(["model=tiny", "mode=train", "logger=none", change])
        with pytest.raises(rundir.RunDirConflict, match=rf"{named} \(now"):
            rundir.plan_job(other, tmp_path)


@pytest.fixture(scope="module")
def amortised_run(tiny, tmp_path_factory):
    """Two amortised-IS steps in Lightning, from a saved non-zero adapter (train.init_adapter)."""
    work = tmp_path_factory.mktemp("amortised")
    cfg = compose_config(["model=tiny"])
    torch.manual_seed(0)
    start = add_lora(copy.deepcopy(tiny[0]), cfg.lora)
    randomise_lora_b(start, seed=3)
    start.save_pretrained(work / "start")
    cfg = compose_config(
        [
            *AMORTISED,
            f"train.init_adapter={work / 'start'}",
            "reward.sigma_direct=1.0",
            "reward.sigma_reverse=1.0",
            "trainer.max_steps=2",
            "optim.batch_size=2",
            "optim.lr=1e-3",
            "trainer.val_check_interval=2",
            "train.val_size=2",
            "eval.num_test_sets=1",
            "eval.test_size=2",
        ]
    )
    out, results = train_in(work, cfg)
    return work, out, results, start


def test_training_starts_from_the_init_adapter(amortised_run, tiny):
    work, out, _, start = amortised_run
    task = load_task(compose_config(AMORTISED))
    rows = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    first = [r for r in rows if r["step"] == 0 and r["slice"] == "dev"]
    dev = {ex.uid: ex for ex in task.splits().dev}
    from grammarrl.decoding import ConstrainedDecoder

    decoder = ConstrainedDecoder(start, tiny[1], task.grammar(), 64)
    start.eval()
    prompts = [encode_prompt(tiny[1], task.forward_messages(dev[r["uid"]])) for r in first]
    greedy = [g.text for g in decoder.greedy(prompts)]
    assert first and [r["prediction"] for r in first] == greedy  # step 0 is the saved adapter
    from safetensors.torch import load_file

    saved = load_file(str(work / "start" / "adapter_model.safetensors"))
    trained = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert saved.keys() == trained.keys()
    assert any(not torch.equal(saved[k], trained[k]) for k in saved)  # and training moved it


def test_training_logs_the_amortised_metrics_and_records_the_keys(amortised_run):
    _, out, results, _ = amortised_run
    rows = list(csv.DictReader((out / "metrics" / "metrics.csv").read_text().splitlines()))

    def column(name: str) -> list[float]:
        return [float(r[name]) for r in rows if r.get(name)]

    for name in ("train/nll", "train/ess", "train/reward", "train/kl", "train/no_targets"):
        assert len(column(name)) == 2 and all(math.isfinite(v) for v in column(name)), name
    assert all(1.0 <= e <= 6.0 for e in column("train/ess"))
    passes = column("train/forward_passes")
    assert len(passes) == 2 and 0 < passes[0] < passes[1]  # cumulative
    tokens = column("train/forward_tokens")
    assert 0 < tokens[0] < tokens[1]
    config = next(iter(results.values()))["config"]["train"]
    assert config["objective"] == "amortised_is" and config["init_adapter"].endswith("start")
