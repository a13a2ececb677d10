"""mode=diagnose: will label-free training help on this task, with this model? Answered in minutes,
before training, from the frozen model alone (docs/diagnose.md).

- `candidates`: greedy + M constrained samples per dev input, scored by the training reward;
- `selection`: the metric of greedy, of the best candidate per group (oracle) and of the
  reward's argmax per λ, and how full it is (`fullness`); without gold, the reward gap and how
  often the argmax moves;
- `crossfit`: the lift of reranking, λ chosen on one half of the labelled inputs and measured
  on the other, with its bootstrap interval;
- `perturb`: gold outputs with one field changed (or whole outputs swapped) that the grammar
  accepts;
- `concordance`: how often the direct, reverse and combined rewards prefer the gold output;
- `verdict`: the answer in plain words, the reranking λ and the training λ;
- `report`: diagnosis.md, diagnosis.json and diagnosis.png;
- `run`: the mode's entry point.
"""
