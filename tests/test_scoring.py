"""Shared-prefix scoring equals independent full passes and a brute-force step-by-step pass."""

from __future__ import annotations

import torch

from grammarrl.decoding.scoring import common_prefix_length, sequence_logprobs


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 2], [1, 2]]) == 0


def _brute_force(model, seq, start):
    out = []
    with torch.no_grad():
        for t in range(start, len(seq)):
            logits = model(input_ids=torch.tensor([seq[:t]])).logits[0, -1]
            out.append(torch.log_softmax(logits.float(), -1)[seq[t]])
    return torch.stack(out)


def test_shared_prefix_equals_unshared_and_brute_force(tiny):
    model, _ = tiny
    prompt = [1, 200, 201, 202, 203, 204]
    seqs = [prompt + [10, 11, 2], prompt + [12, 2], prompt + [13, 14, 15, 16, 2]]
    starts = [len(prompt)] * 3
    with torch.no_grad():
        shared = sequence_logprobs(model, seqs, starts, share_prefix=True)
        plain = sequence_logprobs(model, seqs, starts, share_prefix=False)
    for s, p, seq in zip(shared, plain, seqs):
        assert s.shape == (len(seq) - len(prompt),)
        assert torch.allclose(s, p, atol=1e-5)
        assert torch.allclose(s, _brute_force(model, seq, len(prompt)), atol=1e-5)


def test_different_score_starts_and_prefix_beyond_start(tiny):
    model, _ = tiny
    # Reverse-reward shape: shared static prefix, differing candidate, then the same x.
    seqs = [[1, 7, 8, 9, 30, 31, 5, 6], [1, 7, 8, 9, 32, 5, 6]]
    starts = [6, 5]
    with torch.no_grad():
        shared = sequence_logprobs(model, seqs, starts)
    for s, seq, start in zip(shared, seqs, starts):
        assert torch.allclose(s, _brute_force(model, seq, start), atol=1e-5)
