"""The GrammarRL LightningModule: rollout -> reward -> RLOO advantages -> loss, per rank."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.errors import GrammarRLError, ModelError
from grammarrl.models.chat import encode_prompt
from grammarrl.models.compute import ForwardCounter
from grammarrl.models.loading import enable_activation_checkpointing
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.rl.rloo import combine_rewards, grammarrl_loss, kl_shaped_rewards, rloo_advantages
from grammarrl.rl.rollout import RolloutBatch, collect_rollouts
from grammarrl.runs.rng import gather_objects, rng_states, set_rng_states
from grammarrl.runs.timing import clock
from grammarrl.search.methods import ess
from grammarrl.search.potentials import default_potential, make_potential
from grammarrl.tasks.base import Task
from grammarrl.training.amortised import candidate_indices, resample, target_log_weights
from grammarrl.types import Example

log = logging.getLogger(__name__)


class NonFiniteLossError(GrammarRLError):
    """The loss became NaN or infinite: training stops before the update (last good checkpoint
    kept)."""


@dataclass
class StepOutputs:
    """What one RL step computed before backward."""

    rollouts: RolloutBatch
    rewards: torch.Tensor  # [inputs, N+1]
    advantages: torch.Tensor  # [inputs, N+1]
    policy_logp: torch.Tensor  # [inputs, N+1], log pi_theta(y|x) with gradient
    loss: torch.Tensor
    parts: dict[str, torch.Tensor]
    seconds: dict[str, float]  # wall time per phase: rollout, scoring, policy


@dataclass
class AmortisedStep:
    """What one amortised-IS step computed before backward (`train.objective=amortised_is`).
    Per prompt: its particles, the target log weights of its candidates (`candidate_indices`),
    and the resampled targets (indices into the particles; none when every weight vanished).
    The tensors cover the prompts with targets only: [prompts with targets, rollout.num_samples]."""

    examples: list[Example]
    populations: list[ParticleSet]
    log_weights: list[list[float]]
    targets: list[list[int]]
    policy_logp: torch.Tensor  # log pi_theta(y|x) of the targets, with gradient
    ref_logp: torch.Tensor  # log pi_ref(y|x) of the targets
    direct: torch.Tensor  # R_direct of the targets
    reverse: torch.Tensor | None  # R_reverse of the targets (search.potential=reverse only)
    loss: torch.Tensor
    parts: dict[str, torch.Tensor]
    seconds: dict[str, float]

    @property
    def groups(self) -> list[list[Generation]]:
        """The target outputs of each prompt with targets."""
        return [
            [pop.generations[i] for i in picks]
            for pop, picks in zip(self.populations, self.targets)
            if picks
        ]


def summed_per_candidate(groups: list[list[Generation]], field: str) -> torch.Tensor:
    """A per-token `Generation` field summed over each candidate's output, [inputs, N+1], as
    the rollout policy computed it. `log_allowed_mass`: Σ_t log π_θ(V_t | x, y_<t), the log of
    its unconstrained mass on the tokens the grammar allowed (the logged `kl` on constrained
    samples is KL(q_θ‖q_ref) plus the change of this sum from π_ref's); `logp_constrained`:
    log q_θ(y|x), the grammar-constrained policy's log-probability of the output."""
    return torch.tensor([[sum(getattr(g, field)) for g in group] for group in groups])


def policy_train_mode(policy: torch.nn.Module, dropout: bool) -> None:
    """Training mode (gradient checkpointing only acts in it) with every dropout layer off
    unless `dropout`: then log pi_theta is the deterministic policy that produced the rollouts."""
    policy.train()
    if not dropout:
        for module in policy.modules():
            if isinstance(module, torch.nn.Dropout):
                module.eval()


def identical_groups(groups: list[list[Any]], valid: torch.Tensor) -> torch.Tensor:
    """Per group: True when all its valid candidates are the same output (or fewer than two are
    valid). Such a group gives RLOO nothing to compare: every advantage is 0."""
    flags = []
    for group, ok in zip(groups, valid.tolist()):
        outputs = {tuple(g.token_ids) for g, keep in zip(group, ok) if keep}
        flags.append(len(outputs) <= 1)
    return torch.tensor(flags)


class SignalWatch:
    """Collects the steps at which every rollout group was identical (no learning signal) and
    reports each stretch of them once, with its step range, when it ends."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.last: int | None = None

    def update(self, step: int, silent: bool) -> str | None:
        """Record one step; returns a warning when a silent stretch has just ended."""
        if silent:
            self.start = step if self.start is None else self.start
            self.last = step
            return None
        return self.flush()

    def flush(self) -> str | None:
        """The warning for a stretch still open (at the end of training), else None."""
        if self.start is None:
            return None
        message = (
            f"steps {self.start}-{self.last}: every rollout group's candidates were "
            "identical, so RLOO had no signal (all advantages 0) and the policy moved only "
            "through the KL term; the rollouts have collapsed (see train/identical_groups)"
        )
        self.start = self.last = None
        return message


class GrammarRLModule(L.LightningModule):
    """Policy = base model + LoRA; reference = the same model with the adapter disabled."""

    def __init__(
        self,
        cfg: DictConfig,
        policy: torch.nn.Module,
        tokenizer: Any,
        task: Task,
        sigma_direct: float,
        sigma_reverse: float,
    ):
        super().__init__()
        self.cfg = cfg
        self.policy = policy
        self.tokenizer = tokenizer
        self.task = task
        self.sigma_direct = sigma_direct
        self.sigma_reverse = sigma_reverse
        share = cfg.train.share_prefix
        if cfg.train.gradient_checkpointing:  # only in train mode: rollouts and scoring keep caches
            enable_activation_checkpointing(policy)
        self.decoder = ConstrainedDecoder(
            policy, tokenizer, task.grammar(), cfg.task.max_new_tokens, share_prefix=share
        )
        self.scorer = ReferenceScorer(policy, tokenizer, task, share_prefix=share)
        self.strict_loading = False  # checkpoints hold only the adapter (trainable) weights
        self.samples: list[dict[str, Any]] = []
        # every validation's per-example record (step, slice, uid, prediction, the task's item):
        # what an interval on a dev score is computed from (validation.jsonl)
        self.validation_rows: list[dict[str, Any]] = []
        self.last_checkpoint_step: int | None = None  # global step of the last checkpoint saved
        self.step_seconds: dict[str, float] = {}  # this step's rollout, scoring, policy times
        self.signal = SignalWatch()
        # model forward calls and token positions of the training steps (train/forward_passes)
        self.counter = ForwardCounter(policy)
        self.forward_passes = 0
        self.forward_tokens = 0
        if cfg.train.objective == "amortised_is":  # the Full IS potential, under pi_ref
            name = cfg.search.potential or default_potential("is")
            self.potential = make_potential(name, task, policy, tokenizer)

    def setup(self, stage: str) -> None:
        # A distinct, reproducible sampling stream per rank (DDP: each rank rolls out its inputs).
        self.generator = torch.Generator(device="cpu").manual_seed(
            self.cfg.train.seed + self.global_rank
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=self.cfg.optim.lr, weight_decay=self.cfg.optim.weight_decay
        )

    def _policy_logp(self, prompts: list[list[int]], groups: list) -> torch.Tensor:
        """log pi_theta(y|x), unconstrained, summed over tokens, with gradient: [inputs, N+1]."""
        rows = []
        for prompt, group in zip(prompts, groups):
            token_logp = sequence_logprobs(
                self.policy,
                [prompt + g.token_ids for g in group],
                [len(prompt)] * len(group),
                share_prefix=self.cfg.train.share_prefix,
            )
            rows.append(torch.stack([lp.sum() for lp in token_logp]))
        return torch.stack(rows)

    def step_loss(self, batch: list[Example]) -> StepOutputs:
        """One RL step up to the loss: rollouts and reference scores without gradient, rewards,
        log pi_theta with gradient from the same deterministic policy that rolled out (LoRA
        dropout only with `train.policy_dropout`), RLOO advantages (of the rewards less
        β·KL with `kl_penalty=reward` or `grammar`), the loss. `rewards` are the task rewards
        alone."""
        self.policy.eval()  # rollouts and reference scoring without dropout
        with torch.no_grad():
            out = collect_rollouts(
                self.decoder,
                self.scorer,
                self.tokenizer,
                self.task,
                batch,
                self.cfg.rollout,
                self.generator,
            )
        rewards = combine_rewards(
            out.direct, out.reverse, self.cfg["lambda"], self.sigma_direct, self.sigma_reverse
        )
        policy_train_mode(self.policy, dropout=self.cfg.train.policy_dropout)
        started = clock()
        policy_logp = self._policy_logp(out.prompts, out.groups)
        seconds = {**out.seconds, "policy": clock() - started}
        ref_logp = out.ref_logp.to(policy_logp.device)
        beta, shaped = self.cfg.beta, rewards
        if self.cfg.kl_penalty != "loss":  # β·KL in each candidate's reward, none in the loss
            own = policy_logp  # "reward": the unconstrained log π_θ; "grammar": log q_θ
            if self.cfg.kl_penalty == "grammar":
                own = summed_per_candidate(out.groups, "logp_constrained").to(ref_logp.device)
            shaped, beta = kl_shaped_rewards(rewards, own, ref_logp, beta), 0.0
        advantages = rloo_advantages(shaped, out.valid).to(policy_logp.device)
        loss, parts = grammarrl_loss(policy_logp, ref_logp, advantages, beta, out.valid)
        return StepOutputs(out, rewards, advantages, policy_logp, loss, parts, seconds)

    def amortised_step_loss(self, batch: list[Example]) -> AmortisedStep:
        """One amortised-IS step up to the loss (`grammarrl.training.amortised`): Full IS particles of
        the current policy, weighted towards p_ref·Φ, `rollout.num_samples` targets resampled
        per prompt, and the loss mean −log pi_theta(y|x) over the targets (+ β·KL to pi_ref
        with `kl_penalty=loss`; the other placements have no reward to shape: no KL term)."""
        search, count = self.cfg.search, int(self.cfg.rollout.num_samples)
        self.policy.eval()
        started = clock()
        prompts = [encode_prompt(self.tokenizer, self.task.forward_messages(ex)) for ex in batch]
        twist = self.potential.bind(list(batch)) if self.potential.name != "none" else None
        populations = smc(
            self.decoder,
            prompts,
            int(search.particles),
            twist=twist,
            ess_threshold=0.0,
            temperature=float(search.temperature),
            generator=self.generator,
        )
        rolled_out = clock()
        log_weights, targets, ref_logp, direct, reverse = [], [], [], [], []
        for ex, prompt, pop in zip(batch, prompts, populations):
            idx = candidate_indices(pop)
            gens = [pop.generations[i] for i in idx]
            ref = self.scorer.forward_logprobs(prompt, [g.token_ids for g in gens]) if idx else []
            sums = [float(lp.sum()) for lp in ref]
            logw = target_log_weights([pop.log_weights[i] for i in idx], gens, sums)
            picks = resample(logw, count, self.generator)
            log_weights.append(logw)
            targets.append([idx[j] for j in picks])
            if picks:
                ref_logp.append(torch.stack([ref[j].sum() for j in picks]))
                direct.append(torch.stack([ref[j].mean() for j in picks]))
                x_tokens = len(self.scorer.input_ids(ex))
                reverse.append(torch.tensor([pop.potentials[idx[j]] / x_tokens for j in picks]))
        seconds = {"rollout": rolled_out - started, "scoring": clock() - rolled_out}
        kept = [(p, pop, t) for p, pop, t in zip(prompts, populations, targets) if t]
        policy_train_mode(self.policy, dropout=self.cfg.train.policy_dropout)
        started = clock()
        policy_logp = (
            self._policy_logp(
                [p for p, _, _ in kept], [[pop.generations[i] for i in t] for _, pop, t in kept]
            )
            if kept
            else torch.zeros(0, count)
        )
        seconds["policy"] = clock() - started
        ref_logp = torch.stack(ref_logp).to(policy_logp.device) if kept else policy_logp.detach()
        beta = self.cfg.beta if self.cfg.kl_penalty == "loss" else 0.0
        loss, parts = grammarrl_loss(policy_logp, ref_logp, torch.ones_like(policy_logp), beta)
        return AmortisedStep(
            examples=list(batch),
            populations=populations,
            log_weights=log_weights,
            targets=targets,
            policy_logp=policy_logp,
            ref_logp=ref_logp,
            direct=torch.stack(direct) if kept else torch.zeros(0, count),
            reverse=torch.stack(reverse) if kept and self.potential.name == "reverse" else None,
            loss=loss,
            parts=parts,
            seconds=seconds,
        )

    def training_step(self, batch: list[Example], batch_idx: int) -> torch.Tensor | None:
        calls, tokens = self.counter.calls, self.counter.tokens
        if self.cfg.train.objective == "amortised_is":
            loss = self._amortised_training_step(batch)
        else:
            step = self.step_loss(batch)
            self.step_seconds = step.seconds  # logged with the trainer's phases by PhaseTimer
            if not torch.isfinite(step.loss).all():
                self._stop_on_nonfinite(
                    step.loss, {"rewards": step.rewards, "policy log-probs": step.policy_logp}
                )
            self._log_step(step.rollouts, step.rewards, step.advantages, step.loss, step.parts)
            loss = step.loss
        self.forward_passes += self.counter.calls - calls
        self.forward_tokens += self.counter.tokens - tokens
        self.log_dict(
            {
                "train/forward_passes": float(self.forward_passes),
                "train/forward_tokens": float(self.forward_tokens),
            },
            batch_size=1,
        )
        return loss

    def _amortised_training_step(self, batch: list[Example]) -> torch.Tensor | None:
        """The amortised-IS step, logged; None (no update) when no prompt had a target."""
        step = self.amortised_step_loss(batch)
        self.step_seconds = step.seconds
        if not torch.isfinite(step.loss).all():
            self._stop_on_nonfinite(step.loss, {"policy log-probs": step.policy_logp})
        self._log_amortised(step)
        return step.loss if step.policy_logp.numel() else None

    def _log_amortised(self, step: AmortisedStep) -> None:
        """Per step: the loss, its NLL and KL parts, the ESS of the target weights, the share of
        prompts without targets, the particles' validity, and of the targets what RLOO logs
        of its candidates (rewards under pi_ref, length, distinct outputs, grammar mass)."""
        particles = [g for pop in step.populations for g in pop.generations]
        groups = step.groups
        size = len(step.examples)
        metrics = {
            "train/loss": step.loss.detach(),
            "train/nll": step.parts["loss/pg"],
            "train/kl": step.parts["kl"],
            "train/ess": torch.tensor([ess(w) if w else 0.0 for w in step.log_weights]).mean(),
            "train/no_targets": torch.tensor([not t for t in step.targets]).float().mean(),
            "train/validity": torch.tensor([g.finished for g in particles]).float().mean(),
            "train/truncated": torch.tensor([g.truncated for g in particles]).float().mean(),
        }
        if groups:
            device = step.direct.device
            targets = [g for group in groups for g in group]
            constrained = summed_per_candidate(groups, "logp_constrained").to(device)
            metrics.update(
                {
                    "train/reward_direct": step.direct.mean(),
                    "train/candidate_tokens": torch.tensor(
                        [len(g.token_ids) for g in targets], dtype=torch.float
                    ).mean(),
                    "train/distinct_targets": torch.tensor(
                        [len({tuple(g.token_ids) for g in group}) / len(group) for group in groups]
                    ).mean(),
                    "train/log_valid_mass": summed_per_candidate(groups, "log_allowed_mass").mean(),
                    "train/kl_grammar": (constrained - step.ref_logp.detach().cpu()).mean(),
                }
            )
            if step.reverse is not None:
                rewards = combine_rewards(
                    step.direct,
                    step.reverse,
                    self.cfg["lambda"],
                    self.sigma_direct,
                    self.sigma_reverse,
                )
                metrics.update(
                    {"train/reward": rewards.mean(), "train/reward_reverse": step.reverse.mean()}
                )
        self.log_dict(metrics, batch_size=size, prog_bar=False)
        if "train/reward" in metrics:
            self.log("reward", metrics["train/reward"], prog_bar=True, batch_size=size)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        self.samples.append(
            {
                "step": self.global_step,
                "input": step.examples[0].input,
                "candidates": [step.populations[0].generations[i].text for i in step.targets[0]],
            }
        )

    def _stop_on_nonfinite(self, loss, tensors: dict[str, torch.Tensor]) -> None:
        """Raise before backward/optimizer step: the adapter and last.ckpt stay the last good
        ones."""
        step = self.global_step
        bad = [name for name, t in tensors.items() if not torch.isfinite(t).all()]
        callback = self.trainer.checkpoint_callback if self._trainer is not None else None
        path = getattr(callback, "last_model_path", "") or ""
        kept = (
            f"last good checkpoint: {path} (after {self.last_checkpoint_step} steps)"
            if path and self.last_checkpoint_step is not None
            else "no checkpoint was saved yet"
        )
        raise NonFiniteLossError(
            f"training stopped: the loss is {loss.item()} at step {step + 1} "
            f"(global_step {step}){' from non-finite ' + ' and '.join(bad) if bad else ''}; "
            f"no update was applied; {kept}"
        )

    def _log_step(self, out, rewards, advantages, loss, parts) -> None:
        gens = [g for group in out.groups for g in group]
        device = rewards.device  # rewards, scores and advantages share a device
        valid = out.valid.to(device)
        best = rewards.masked_fill(~valid, float("-inf")).argmax(dim=-1)
        beam_best = (best == rewards.shape[-1] - 1).float().mean()

        def valid_mean(values: torch.Tensor) -> torch.Tensor:
            return values[valid].mean()

        def sums(field: str) -> torch.Tensor:
            return summed_per_candidate(out.groups, field).to(device)

        identical = identical_groups(out.groups, out.valid)
        warning = self.signal.update(self.global_step, bool(identical.all()))
        if warning:
            log.warning(warning)
        metrics = {
            "train/loss": loss.detach(),
            "train/loss_pg": parts["loss/pg"],
            "train/kl": parts["kl"],
            "train/reward": valid_mean(rewards),
            "train/reward_direct": valid_mean(out.direct),
            "train/reward_reverse": valid_mean(out.reverse),
            "train/empty_candidates": (~valid).float().mean(),
            "train/advantage_std": advantages[valid].std(),
            "train/advantage_abs": valid_mean(advantages.abs()),
            "train/validity": torch.tensor([g.finished for g in gens], dtype=torch.float).mean(),
            "train/truncated": torch.tensor([g.truncated for g in gens], dtype=torch.float).mean(),
            "train/beam_best_share": beam_best,
            "train/identical_groups": identical.float().mean(),
            "train/candidate_tokens": torch.tensor(
                [len(g.token_ids) for g in gens], dtype=torch.float
            ).mean(),
            "train/log_valid_mass": valid_mean(sums("log_allowed_mass")),
            "train/kl_grammar": valid_mean(sums("logp_constrained") - out.ref_logp.to(device)),
        }
        self.log_dict(metrics, batch_size=len(out.examples), prog_bar=False)
        self.log("reward", metrics["train/reward"], prog_bar=True, batch_size=len(out.examples))
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        first = out.groups[0]
        self.samples.append(
            {
                "step": self.global_step,
                "input": out.examples[0].input,
                "candidates": [g.text for g in first],
                "rewards": [round(v, 4) for v in rewards[0].tolist()],
            }
        )

    def on_train_end(self) -> None:
        warning = self.signal.flush()
        if warning:
            log.warning(warning)

    def validation_step(
        self, batch: list[Example], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Greedy outputs of the current policy, and their reward under the frozen reference
        (what training maximises): does training raise the reward of what greedy emits?"""
        self.policy.eval()
        prompts = [encode_prompt(self.tokenizer, self.task.forward_messages(ex)) for ex in batch]
        with torch.no_grad():
            gens = self.decoder.greedy(prompts)
        rewards = [
            self.scorer.score_output(ex, prompt, g.token_ids, g.text)
            for ex, prompt, g in zip(batch, prompts, gens)
        ]
        self._val_preds.setdefault(dataloader_idx, []).extend(zip(gens, batch, rewards))

    def on_validation_epoch_start(self) -> None:
        self._val_preds: dict[int, list] = {}

    def on_validation_epoch_end(self) -> None:
        """Per validation slice: the task metric, validity, the task's scalar details (CoNLL:
        empty_field_rate) and the mean reward of the greedy outputs (combined, direct, reverse;
        over the outputs with tokens)."""
        names = self.trainer.datamodule.val_names
        for idx, rows in self._val_preds.items():
            gens, examples, rewards = zip(*rows)
            scores = self.task.score([g.text for g in gens], list(examples))
            self._record_validation(names[idx], gens, examples, scores.per_example)
            prefix = f"val/{names[idx]}_"
            # Lightning logs a validation at the step index of the last trained batch, so the
            # one before training and the one after the first step share step 0: this says which.
            metrics = {
                "trained_steps": self.global_step,
                scores.metric: scores.value,
                "validity": scores.validity,
                **{k: v for k, v in scores.details.items() if isinstance(v, (int, float))},
            }
            scored = [r for r in rewards if r is not None]
            if scored:
                direct, reverse = torch.tensor(scored, dtype=torch.float64).T
                combined = combine_rewards(
                    direct, reverse, self.cfg["lambda"], self.sigma_direct, self.sigma_reverse
                )
                metrics.update(
                    reward=combined.mean().item(),
                    reward_direct=direct.mean().item(),
                    reward_reverse=reverse.mean().item(),
                )
            for key, value in metrics.items():
                self.log(
                    prefix + key,
                    float(value),
                    batch_size=len(gens),
                    add_dataloader_idx=False,
                    prog_bar=idx == 0 and key == scores.metric,
                    sync_dist=True,
                )

    def _record_validation(
        self,
        name: str,
        gens: Sequence[Generation],
        examples: Sequence[Example],
        items: Sequence[dict[str, Any]],
    ) -> None:
        """Keep one validation slice's per-example outputs and scores (every rank validates
        every input: `trainer.use_distributed_sampler` is off)."""
        self.validation_rows += [
            {
                "step": self.global_step,
                "slice": name,
                "uid": ex.uid,
                "prediction": gen.text,
                "scores": item,
            }
            for gen, ex, item in zip(gens, examples, items)
        ]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if k in trainable
        }
        # What an exact resume needs beyond weights, optimizer and loop progress: the sampling
        # stream, the global RNGs (LoRA dropout) and the rollout samples logged so far.
        # Every rank's streams: rank 0 writes the file, and each rank resumes its own.
        checkpoint["grammarrl"] = {
            "ranks": gather_objects({"generator": self.generator.get_state(), "rng": rng_states()}),
            "samples": list(self.samples),
            "validation_rows": list(self.validation_rows),
            "forward_passes": self.forward_passes,
            "forward_tokens": self.forward_tokens,
        }
        self.last_checkpoint_step = int(checkpoint.get("global_step", self.global_step))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check that the checkpoint holds exactly this adapter (strict_loading is off because
        the base weights are not saved), then restore the RNG streams."""
        own = {n: p.shape for n, p in self.named_parameters() if p.requires_grad}
        saved = checkpoint.get("state_dict", {})
        missing = sorted(set(own) - set(saved))
        unexpected = sorted(set(saved) - set(own))
        wrong = sorted(n for n in set(own) & set(saved) if tuple(saved[n].shape) != tuple(own[n]))
        if missing or unexpected or wrong:
            detail = "; ".join(
                f"{what}: {len(names)} (e.g. {names[0]})"
                for what, names in (
                    ("missing", missing),
                    ("unexpected", unexpected),
                    ("wrong shape", wrong),
                )
                if names
            )
            raise ModelError(
                "the checkpoint does not fit this model and LoRA config (another base model, "
                f"lora.r or target modules?): {detail}"
            )
        state = checkpoint.get("grammarrl")
        if state is None:
            return
        if not hasattr(self, "generator"):
            self.setup("fit")
        ranks = state.get("ranks", [state])  # a checkpoint from before per-rank states: one
        if len(ranks) != self.trainer.world_size:
            raise ModelError(
                f"the checkpoint holds the sampling streams of {len(ranks)} "
                f"process(es); this run has {self.trainer.world_size}: resume with "
                f"trainer.devices={len(ranks)}, or start afresh (train.resume=null)"
            )
        own = ranks[self.global_rank]
        self.generator.set_state(own["generator"])
        set_rng_states(own["rng"])
        self.samples = list(state.get("samples", []))
        self.validation_rows = list(state.get("validation_rows", []))
        self.forward_passes = int(state.get("forward_passes", 0))
        self.forward_tokens = int(state.get("forward_tokens", 0))
        self.last_checkpoint_step = int(checkpoint.get("global_step", 0))
