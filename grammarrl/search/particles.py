"""The particles of each distinct test example: the search loop of every search method
(`grammarrl.search.run`).

Examples go in length-sorted batches through `grammarrl.decoding.smc` with two seeded
generators (proposal and resampling), so one seed draws the same particles on every run; with a
`DrawProgress` (`grammarrl.search.resume`) a killed draw continues where it stopped.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.errors import GrammarRLError
from grammarrl.evaluation.evaluate import distinct_prompts
from grammarrl.search.potentials import BoundPotential, Potential
from grammarrl.search.resume import DrawProgress, Progress
from grammarrl.search.settings import SearchSettings
from grammarrl.tasks.base import Task
from grammarrl.types import Example


class _Timed:
    """A bound potential that also measures the time spent in it (cost accounting)."""

    def __init__(self, bound: BoundPotential):
        self.bound = bound
        self.on_prefix = bound.on_prefix
        self.seconds = 0.0

    def prefix(self, prompt: int, text: str) -> float:
        start = time.perf_counter()
        try:
            return self.bound.prefix(prompt, text)
        finally:
            self.seconds += time.perf_counter() - start

    def complete(self, prompt: int, texts: list[str]) -> list[float]:
        start = time.perf_counter()
        try:
            return self.bound.complete(prompt, texts)
        finally:
            self.seconds += time.perf_counter() - start


class _DrawState:
    """A draw under way: its generators, the particles so far, the potential's seconds and the
    forward-token counters at its start, as a progress file saves and restores them."""

    def __init__(self, seed: int, decoder: ConstrainedDecoder, potential: Potential):
        self.decoder, self.potential = decoder, potential
        self.generator = torch.Generator().manual_seed(seed)
        self.resample_generator = torch.Generator().manual_seed(seed + 1)
        self.populations: dict[str, ParticleSet] = {}
        self.potential_seconds = 0.0
        self.started = time.perf_counter()
        self.tokens0, self.potential0 = decoder.forward_tokens, potential.forward_tokens

    def restore(self, saved: DrawProgress, order: list[str]) -> None:
        """Continue from `saved`'s file, if there is one: its particles (the first of `order`),
        generator states, potential seconds and forward-token counts."""
        restored = saved.load()
        if restored is None:
            return
        self.populations = dict(restored.populations)
        if list(self.populations) != order[: len(self.populations)]:
            raise GrammarRLError(f"{saved.path}: its examples are not the first of this search")
        self.generator.set_state(restored.generator)
        self.resample_generator.set_state(restored.resample_generator)
        self.potential_seconds = restored.potential_seconds
        self.decoder.forward_tokens += restored.search_tokens
        self.potential.forward_tokens += restored.potential_tokens

    def progress(self, earlier_seconds: float) -> Progress:
        """The draw so far, as a progress file keeps it."""
        return Progress(
            self.populations,
            self.generator.get_state(),
            self.resample_generator.get_state(),
            earlier_seconds + time.perf_counter() - self.started,
            self.potential_seconds,
            self.decoder.forward_tokens - self.tokens0,
            self.potential.forward_tokens - self.potential0,
        )


def search_examples(
    decoder: ConstrainedDecoder,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    potential: Potential,
    settings: SearchSettings,
    seed: int,
    progress: bool = True,
    saved: DrawProgress | None = None,
) -> tuple[dict[str, ParticleSet], float]:
    """Particles of each distinct example (by uid) under `settings`, in length-sorted batches;
    also returns the seconds spent in the potential. With `saved`, the search continues from
    its progress file, if there is one, and writes it as it goes (`grammarrl.search.resume`):
    the particles, generators, potential seconds and the decoder's and potential's forward
    token counters go on from the saved ones."""
    from tqdm.auto import tqdm

    unique, prompts, order = distinct_prompts(tokenizer, task, examples)
    draw = _DrawState(seed, decoder, potential)
    if saved is not None:
        draw.restore(saved, order)
    done = len(draw.populations)
    bar = tqdm(
        total=len(order),
        initial=done,
        desc=f"search {settings.method}",
        unit="ex",
        disable=not progress,
    )
    for start in range(done, len(order), settings.batch_size):
        uids = order[start : start + settings.batch_size]
        twist = None
        if potential.name != "none":
            twist = _Timed(potential.bind([unique[uid] for uid in uids]))
        sets = smc(
            decoder,
            [prompts[uid] for uid in uids],
            settings.particles,
            twist=twist,
            ess_threshold=settings.ess_threshold,
            temperature=settings.temperature,
            generator=draw.generator,
            resample_generator=draw.resample_generator,
        )
        if twist is not None:
            draw.potential_seconds += twist.seconds
        draw.populations.update(zip(uids, sets))
        bar.update(len(uids))
        if saved is not None:
            saved.save(draw.progress(saved.earlier_seconds), len(draw.populations) == len(order))
    bar.close()
    return draw.populations, draw.potential_seconds
