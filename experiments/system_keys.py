"""What system a selection of a results file measures: its weights (frozen, an adapter
directory, or a training run with its trained keys), its decoding (greedy, beam(width)) or search
method with particles, potential and selection (a Sample-Rerank run also selects Full IS on its
particles), as a key (what pools measurements) and a readable label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.runs import BASELINE, Evaluation, format_number
from grammarrl.search.potentials import default_potential

SEARCH_NAMES = {"rerank": "Sample-Rerank", "is": "Full IS", "smc": "Full SMC"}


TRAINED_KEYS = (
    "lambda",
    "rollout.num_samples",
    "beta",
    "kl_penalty",
    "trainer.max_steps",
    "train.seed",
    "optim.lr",
)


Key = tuple[tuple[str, Any], ...]


def _adapter_name(adapter: str) -> str:
    """An adapter directory's name; a training run's `adapter` folder with its run's name."""
    path = Path(adapter)
    return (
        f"{path.parent.name}/{path.name}"
        if path.name in ("adapter", "adapter-best-dev")
        else path.name
    )


def weights_of(ev: Evaluation) -> tuple[Key, str]:
    """Which weights produced the outputs: frozen, an adapter directory, or a training run."""
    if ev.mode == "train" and ev.system != BASELINE:
        values = {key: ev.get(key) for key in TRAINED_KEYS}
        checkpoint = "best-dev" if "best_dev" in ev.name else "last"
        label = (
            f"trained λ={format_number(values['lambda'])} N={values['rollout.num_samples']} "
            f"β={format_number(values['beta'])} ({values['kl_penalty']}) "
            f"{values['trainer.max_steps']} steps seed {values['train.seed']}"
        )
        key = (("weights", "trained"), *values.items(), ("checkpoint", checkpoint))
        return key, label + (", best-dev checkpoint" if checkpoint == "best-dev" else "")
    adapter = ev.get("eval.adapter") or ev.results.get("adapter")
    if ev.system == BASELINE or not adapter:
        return (("weights", "frozen"),), "frozen"
    name = _adapter_name(str(adapter))
    return (("weights", "adapter"), ("adapter", name)), f"adapter {name}"


def decoding_of(ev: Evaluation, selection: str) -> tuple[Key, str]:
    """How the outputs were decoded and selected: greedy, beam(width), or a search method's
    selection among its particles."""
    if ev.mode != "search":
        if ev.decoding != "beam":
            return (("decoding", ev.decoding),), ev.decoding
        width = ev.results.get("beam_width") or ev.get("eval.beam_width")
        return (("decoding", "beam"), ("beam_width", width)), f"beam({width})"
    method = ev.decoding
    particles = ev.results.get("particles", ev.get("search.particles"))
    potential = (
        ev.results.get("potential") or ev.get("search.potential") or default_potential(method)
    )
    label = f"{SEARCH_NAMES.get(selection, selection)}({particles})"
    if selection != method:
        label += f" on {SEARCH_NAMES.get(method, method)} particles"
    if potential != default_potential(method):
        label += f", potential {potential}"
    key = (
        ("decoding", "search"),
        ("method", method),
        ("particles", particles),
        ("potential", potential),
        ("selection", selection),
    )
    return key, label


def system_key(ev: Evaluation, selection: str) -> tuple[Key, str]:
    """The key and label of the system that this selection of this results file measures."""
    weights, weights_label = weights_of(ev)
    decoding, decoding_label = decoding_of(ev, selection)
    key = (("task", ev.task), ("model", ev.model), *weights, *decoding)
    if ev.mode == "search" and weights_label == "frozen":
        return key, decoding_label
    return key, f"{weights_label} {decoding_label}"
