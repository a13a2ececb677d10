"""The GrammarRL LightningModule, per rank: the step of `train.objective` (RLOO:
`grammarrl.training.rloo_step`; amortised IS: `grammarrl.training.amortised`) and its logging,
greedy validation, and what a checkpoint holds beyond the adapter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.errors import GrammarRLError, ModelError
from grammarrl.models.chat import encode_prompt
from grammarrl.models.compute import ForwardCounter
from grammarrl.models.loading import enable_activation_checkpointing
from grammarrl.rl.reward import make_reward
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.runs.rng import gather_objects, rng_states, set_rng_states
from grammarrl.search.potentials import make_potential
from grammarrl.tasks.base import Task
from grammarrl.training.amortised import (
    AmortisedStep,
    amortised_metrics,
    amortised_sample,
    amortised_step_loss,
)
from grammarrl.training.policy import StepModels
from grammarrl.training.rloo_metrics import SignalWatch, identical_groups, rloo_metrics, rloo_sample
from grammarrl.training.rloo_step import StepOutputs, rloo_step_loss
from grammarrl.training.settings import StepSettings
from grammarrl.types import Example

log = logging.getLogger(__name__)


class NonFiniteLossError(GrammarRLError):
    """The loss became NaN or infinite: training stops before the update (last good checkpoint
    kept)."""


def validation_records(
    step: int,
    name: str,
    gens: Sequence[Generation],
    examples: Sequence[Example],
    items: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One validation slice's per-example outputs and scores, as `validation.jsonl` keeps them."""
    return [
        {"step": step, "slice": name, "uid": ex.uid, "prediction": gen.text, "scores": item}
        for gen, ex, item in zip(gens, examples, items)
    ]


def checkpoint_misfit(own: dict[str, torch.Size], saved: dict[str, torch.Tensor]) -> str:
    """How a checkpoint's weights differ from the trainable parameters (name -> shape): the
    missing, unexpected and wrong-shaped names, counted with an example each; "" when they fit."""
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    wrong = sorted(n for n in set(own) & set(saved) if tuple(saved[n].shape) != tuple(own[n]))
    return "; ".join(
        f"{what}: {len(names)} (e.g. {names[0]})"
        for what, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("wrong shape", wrong),
        )
        if names
    )


class GrammarRLModule(L.LightningModule):
    """Policy = base model + LoRA; reference = the same model with the adapter disabled."""

    def __init__(self, policy: torch.nn.Module, tokenizer: Any, task: Task, settings: StepSettings):
        super().__init__()
        self.settings = settings
        self.policy = policy
        self.tokenizer = tokenizer
        self.task = task
        share = settings.share_prefix
        if settings.gradient_checkpointing:  # only in train mode: rollouts and scoring keep caches
            enable_activation_checkpointing(policy)
        self.decoder = ConstrainedDecoder(
            policy, tokenizer, task.grammar(), settings.max_new_tokens, share_prefix=share
        )
        self.reward = make_reward(settings.reward, policy, tokenizer, task, share_prefix=share)
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
        if settings.amortised is not None:  # the Full IS potential, under pi_ref
            reference = make_reward(settings.reward, policy, tokenizer, task)
            self.potential = make_potential(settings.amortised.potential, task, reference)

    def setup(self, stage: str) -> None:
        # A distinct, reproducible sampling stream per rank (DDP: each rank rolls out its inputs).
        self.generator = torch.Generator(device="cpu").manual_seed(
            self.settings.seed + self.global_rank
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=self.settings.lr, weight_decay=self.settings.weight_decay
        )

    @property
    def scorer(self) -> ReferenceScorer:
        """The frozen reference's passes the reward is computed from."""
        return self.reward.scorer

    @property
    def models(self) -> StepModels:
        """The models a step runs (read at each step: a test may swap the decoder)."""
        return StepModels(self.policy, self.decoder, self.reward, self.tokenizer, self.task)

    def step_loss(self, batch: list[Example]) -> StepOutputs:
        """The RLOO step up to its loss (`rloo_step_loss`) with this module's models."""
        return rloo_step_loss(batch, self.models, self.settings, self.generator)

    def amortised_step_loss(self, batch: list[Example]) -> AmortisedStep:
        """The amortised-IS step up to its loss (`grammarrl.training.amortised`)."""
        return amortised_step_loss(
            batch, self.models, self.potential, self.settings, self.generator
        )

    def training_step(self, batch: list[Example], batch_idx: int) -> torch.Tensor | None:
        calls, tokens = self.counter.calls, self.counter.tokens
        if self.settings.amortised is not None:
            loss = self._amortised_training_step(batch)
        else:
            loss = self._rloo_training_step(batch)
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

    def _rloo_training_step(self, batch: list[Example]) -> torch.Tensor:
        """The RLOO step, logged (`grammarrl.training.rloo_metrics`)."""
        step = self.step_loss(batch)
        self.step_seconds = step.seconds  # logged with the trainer's phases by PhaseTimer
        if not torch.isfinite(step.loss).all():
            self._stop_on_nonfinite(
                step.loss, {"rewards": step.rewards, "policy log-probs": step.policy_logp}
            )
        identical = identical_groups(step.rollouts.groups, step.rollouts.valid)
        warning = self.signal.update(self.global_step, bool(identical.all()))
        if warning:
            log.warning(warning)
        self._log_train(rloo_metrics(step, identical), len(step.rollouts.examples))
        self.samples.append(rloo_sample(step, self.global_step))
        return step.loss

    def _amortised_training_step(self, batch: list[Example]) -> torch.Tensor | None:
        """The amortised-IS step, logged; None (no update) when no prompt had a target."""
        step = self.amortised_step_loss(batch)
        self.step_seconds = step.seconds
        if not torch.isfinite(step.loss).all():
            self._stop_on_nonfinite(step.loss, {"policy log-probs": step.policy_logp})
        self._log_train(amortised_metrics(step, self.settings), len(step.examples))
        self.samples.append(amortised_sample(step, self.global_step))
        return step.loss if step.policy_logp.numel() else None

    def _log_train(self, metrics: dict[str, torch.Tensor], size: int) -> None:
        """A training step's metrics, its reward in the progress bar, and the learning rate."""
        self.log_dict(metrics, batch_size=size, prog_bar=False)
        if "train/reward" in metrics:
            self.log("reward", metrics["train/reward"], prog_bar=True, batch_size=size)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)

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
            self.reward.score_output(ex, prompt, g.token_ids, g.text)
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
            # every rank validates every input: `trainer.use_distributed_sampler` is off
            self.validation_rows += validation_records(
                self.global_step, names[idx], gens, examples, scores.per_example
            )
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
                combined = self.settings.mixing.combine(direct, reverse)
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
        misfit = checkpoint_misfit(own, checkpoint.get("state_dict", {}))
        if misfit:
            raise ModelError(
                "the checkpoint does not fit this model and LoRA config (another base model, "
                f"lora.r or target modules?): {misfit}"
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
