"""The candidate groups of mode=diagnose: per input, the greedy output and M constrained samples
(decoded together), and any list of written texts, scored with the training reward.

Written texts (a gold output, its perturbations) are scored as `rollout.collect_rollouts` scores
a training group (`rewards.ReferenceScorer`). Decoded candidates take R_direct from the decoder
itself: the model decodes frozen, so the unconstrained log-probabilities it records for every
token (end-of-turn included; `Generation.logp_unconstrained`) are log pi_ref(y_t | x, y_<t),
the same numbers a teacher-forced reference pass computes again (up to bfloat16 rounding of a
batched pass), at no cost; only R_reverse needs a reference pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.tasks.base import Task
from grammarrl.types import Example


@dataclass
class Group:
    """One input's candidates (the greedy output first) and their rewards; an empty candidate
    (nothing decoded) is not valid and has NaN rewards, as in training it takes no part."""

    example: Example
    texts: list[str]
    direct: list[float]
    reverse: list[float]
    finished: list[bool] = field(default_factory=list)  # decoded: ended within the token cap

    @property
    def valid(self) -> list[bool]:
        return [not math.isnan(d) for d in self.direct]


def text_token_ids(tokenizer: Any, text: str) -> list[int]:
    """A text's natural tokens followed by the end-of-turn token: how a written output (a gold
    output, a perturbed one) is scored."""
    return [*tokenizer.encode(text, add_special_tokens=False), end_of_turn_id(tokenizer)]


def decoded_group(scorer: ReferenceScorer, example: Example, gens: list[Generation]) -> Group:
    """One input's decoded candidates: R_direct from the decoder's log-probabilities (module
    docstring), R_reverse from the reference, once per distinct non-empty text."""
    texts = [g.text for g in gens]
    distinct = list(dict.fromkeys(g.text for g in gens if g.token_ids))
    reverse = {}
    if distinct:
        logps, _ = scorer.reverse_logprobs(example, distinct)
        reverse = {text: float(lp.mean()) for text, lp in zip(distinct, logps)}
    return Group(
        example,
        texts,
        [sum(g.logp_unconstrained) / g.num_tokens if g.token_ids else math.nan for g in gens],
        [reverse[g.text] if g.token_ids else math.nan for g in gens],
        [g.finished for g in gens],
    )


def decoded_groups(
    decoder: ConstrainedDecoder,
    scorer: ReferenceScorer,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    num_samples: int,
    temperature: float,
    batch_size: int,
    generator: torch.Generator,
    progress: bool = True,
) -> list[Group]:
    """Per input: greedy + `num_samples` constrained samples at `temperature`, decoded
    `batch_size` inputs at a time, scored with the reward; in the order of `examples`."""
    from tqdm.auto import tqdm

    prompts = [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]
    groups: list[Group] = []
    bar = tqdm(total=len(examples), desc="diagnose: candidates", unit="input", disable=not progress)
    for start in range(0, len(examples), batch_size):
        batch = slice(start, start + batch_size)
        with torch.no_grad():
            decoded = decoder.sample(
                prompts[batch], num_samples, temperature, generator, with_greedy=True
            )
            groups += [
                decoded_group(scorer, ex, gens) for ex, gens in zip(examples[batch], decoded)
            ]
        bar.update(len(decoded))
    bar.close()
    return groups


def written_group(
    scorer: ReferenceScorer, tokenizer: Any, task: Task, example: Example, texts: list[str]
) -> Group:
    """Distinct written outputs of one input (e.g. its gold output and perturbations of it),
    scored by the reference as a training group is."""
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    with torch.no_grad():
        scores = scorer.score(
            example, prompt, [text_token_ids(tokenizer, t) for t in texts], list(texts)
        )
    return Group(example, list(texts), scores.direct.tolist(), scores.reverse.tolist())
