"""The rules speculative decoding is proven against, written out plainly (the engine does none of this itself: it
drafts with speculation.NgramIndex and verifies with each sequence's own sampler chain). tests/test_speculation.py
checks NgramIndex against lookup_draft and that each verification rule leaves the output what decoding one token at
a time gives."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lookup_draft(history: Sequence[int], *, n_max: int = 4, n_min: int = 1, k: int = 8) -> list[int]:
    """Prompt-lookup (n-gram) drafting: find the most recent earlier occurrence of the history's last n tokens
    (the longest n first, from n_max down to n_min) and propose the up to k tokens that followed it. Code edits,
    quoted summaries and RAG answers repeat their prompt, so these drafts are often right. [] when nothing
    matches."""
    size = len(history)
    if k <= 0 or size < 2:
        return []
    tokens = list(history)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        pattern = tokens[size - n:]
        first = pattern[0]
        # Earlier occurrences only: the match must end before the history's own suffix starts.
        for start in range(size - n - 1, -1, -1):
            if tokens[start] == first and tokens[start:start + n] == pattern:
                return tokens[start + n:start + n + k]
    return []


def accept_greedy(draft: Sequence[int], target: Sequence[int]) -> tuple[int, int]:
    """Temperature 0. target[i] is the target model's choice after the prefix and draft[:i] (len(draft) + 1
    entries, from one batched decode). Returns (drafts accepted, the token that follows them): the output is
    draft[:n] + [next], exactly what decoding one token at a time gives."""
    if len(target) != len(draft) + 1:
        raise ValueError(f"{len(target)} target tokens for {len(draft)} drafts: one more is needed")
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return n, int(target[n])


def accept_sampled(draft: Sequence[int], target_probs: np.ndarray, rng: np.random.Generator,
                   draft_probs: np.ndarray | None = None) -> tuple[int, int]:
    """Temperature > 0: the speculative sampling rule (Leviathan et al.; Chen et al.), which leaves the output's
    distribution the target's. target_probs[i] is the target's distribution after the prefix and draft[:i]
    (len(draft) + 1 rows); draft_probs[i] the drafter's when it sampled draft[i] (None: a lookup draft, a point
    mass on it). Draft i is accepted with probability min(1, p(d)/q(d)); at the first rejection the next token
    comes from the normalised max(0, p - q); if every draft is accepted, from the last row of p."""
    target_probs = np.asarray(target_probs, dtype=np.float64)
    if target_probs.shape[0] != len(draft) + 1:
        raise ValueError(f"{target_probs.shape[0]} target distributions for {len(draft)} drafts: one more is needed")
    for i, token in enumerate(draft):
        p = target_probs[i]
        if draft_probs is None:
            q = np.zeros_like(p)
            q[token] = 1.0
        else:
            q = np.asarray(draft_probs[i], dtype=np.float64)
        if rng.random() < min(1.0, p[token] / q[token] if q[token] > 0 else 0.0):
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, int(rng.choice(len(p), p=residual / total)) if total > 0 else int(rng.choice(len(p), p=p))
    last = target_probs[len(draft)]
    return len(draft), int(rng.choice(len(last), p=last / last.sum()))
