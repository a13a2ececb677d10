"""The candidate groups of mode=diagnose: per input, the greedy output and M constrained samples
(decoded together), and any list of written texts, scored with the training reward
(`grammarrl.rl.reward.Reward`: its two terms).

Written texts (a gold output, its perturbations) are scored as `rollout.collect_rollouts` scores
a training group. Decoded candidates take the direct pass from the decoder itself: the model
decodes frozen, so the unconstrained log-probabilities it records for every token (end-of-turn
included; `Generation.logp_unconstrained`) are log pi_ref(y_t | x, y_<t), the same numbers a
teacher-forced reference pass computes again (up to bfloat16 rounding of a batched pass), at no
cost; only the reverse pass needs the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.rl.reward import Reward
from grammarrl.rl.rewards import REVERSE, CandidateScores
from grammarrl.tasks.base import Task
from grammarrl.types import Example


@dataclass
class Group:
    """One input's candidates (the greedy output first) and their reward's two terms; an empty
    candidate (nothing decoded) is not valid and has NaN terms, as in training it takes no part."""

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


def reverse_means(reward: Reward, example: Example, texts: list[str]) -> torch.Tensor:
    """R_reverse of each text under the reward's reference, one pass per distinct text."""
    distinct = list(dict.fromkeys(texts))
    if not distinct:
        return torch.zeros(0, dtype=torch.float64)
    logps, _ = reward.scorer.reverse_logprobs(example, distinct)
    means = {text: float(lp.mean()) for text, lp in zip(distinct, logps)}
    return torch.tensor([means[text] for text in texts], dtype=torch.float64)


def decoded_group(reward: Reward, example: Example, gens: list[Generation]) -> Group:
    """One input's decoded candidates scored with `reward`: the direct pass from the decoder's
    log-probabilities (module docstring), the reverse pass from the reference."""
    kept = [g for g in gens if g.token_ids]
    texts = [g.text for g in kept]
    measured = CandidateScores(
        direct=torch.tensor(
            [sum(g.logp_unconstrained) / g.num_tokens for g in kept], dtype=torch.float64
        ),
        reverse=reverse_means(reward, example, texts) if REVERSE in reward.passes else None,
        ref_logp=None,
        lengths=torch.tensor([g.num_tokens for g in kept], dtype=torch.long),
    )
    terms = reward.terms(example, texts, measured)
    values = iter(zip(terms.direct.tolist(), terms.reverse.tolist()))
    pairs = [next(values) if g.token_ids else (math.nan, math.nan) for g in gens]
    return Group(
        example,
        [g.text for g in gens],
        [direct for direct, _ in pairs],
        [reverse for _, reverse in pairs],
        [g.finished for g in gens],
    )


def decoded_groups(
    decoder: ConstrainedDecoder,
    reward: Reward,
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
                decoded_group(reward, ex, gens) for ex, gens in zip(examples[batch], decoded)
            ]
        bar.update(len(decoded))
    bar.close()
    return groups


def written_group(
    reward: Reward, tokenizer: Any, task: Task, example: Example, texts: list[str]
) -> Group:
    """Distinct written outputs of one input (e.g. its gold output and perturbations of it),
    scored by the reference as a training group is."""
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    with torch.no_grad():
        scores = reward.score(
            example, prompt, [text_token_ids(tokenizer, t) for t in texts], list(texts)
        )
    return Group(example, list(texts), scores.direct.tolist(), scores.reverse.tolist())
