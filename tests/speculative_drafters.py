"""Drafters for the speculative-decoding tests: right, partly right (accept counts 0..K differing across the
batch in one step) and random, all from a known greedy continuation of each prompt."""
from __future__ import annotations

import torch


class PartlyRightDrafter:
    """Proposes the greedy continuation (``future[i]`` after prompt i) with the draft at index
    ``(calls + 2 * row) % (K + 1)`` replaced by a wrong token (index K: none replaced), so rows of one step accept
    different counts 0..K. ``rows``: the prompt index of each context, set by the caller before ``propose``."""

    def __init__(self, future, prompts, vocab: int, wrong_every: bool = True):
        self.full = [list(p) + list(f) for p, f in zip(prompts, future)]
        self.vocab, self.wrong_every, self.calls = vocab, wrong_every, 0
        self.rows: list[int] = list(range(len(prompts)))

    def propose(self, contexts, K, device):
        out = []
        for row, (r, ctx) in enumerate(zip(self.rows, contexts)):
            full = self.full[r]
            nxt = full[len(ctx):len(ctx) + K] if full[:len(ctx)] == list(ctx) else []
            d = (nxt + [ctx[-1]] * K)[:K]
            j = (self.calls + 2 * row) % (K + 1)
            if self.wrong_every and j < K:
                d[j] = (d[j] + 1) % self.vocab
            out.append(d)
        self.calls += 1
        return torch.tensor(out, dtype=torch.long, device=device).reshape(len(contexts), K)


class RandomDrafter:
    """Uniformly random drafts (seeded): almost always rejected."""

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab, self.gen = vocab, torch.Generator().manual_seed(seed)

    def propose(self, contexts, K, device):
        return torch.randint(0, self.vocab, (len(contexts), K), generator=self.gen).to(device)
