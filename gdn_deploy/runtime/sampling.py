"""Choosing the next token from a batch of logits: greedy (the default) or sampling with the usual filters.

:class:`SamplingConfig` holds the settings; :class:`Sampler` applies them to ``logits [B, vocab]`` for one step,
batched, in float32, on the logits' device, in Hugging Face transformers' order:

1. repetition penalty over each sequence's prompt + generated ids (``penalty > 1``: a seen token's positive logit
   is divided by it, a negative one multiplied; HF ``RepetitionPenaltyLogitsProcessor``);
2. temperature (``logits / t``);
3. top-k: keep the k largest (ties at the k-th value kept);
4. top-p (nucleus): keep the smallest set of most likely tokens whose probability reaches p;
5. min-p: drop tokens whose probability is below ``min_p`` times the largest one;

then a draw from the softmax. Each prompt has its own ``torch.Generator``, seeded from the run's ``seed`` and the
prompt's index, and the draw is an exponential race (``argmax(p / E)``, ``E ~ Exp(1)`` from that generator), so a
sequence's tokens depend on the seed, its index and its own logits only: not on which other sequences share the
batch, join it or leave it. The same seed, prompts and settings give the same tokens on the same device.
``temperature == 0`` is greedy (argmax after the repetition penalty), and with the
default settings the chosen ids equal ``logits.argmax(-1)`` exactly. Filtered-out tokens get ``-inf``; at least
one token always survives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import UsageError

__all__ = ["SamplingConfig", "Sampler", "apply_repetition_penalty", "top_k_filter", "top_p_filter",
           "min_p_filter"]


@dataclass
class SamplingConfig:
    temperature: float = 0.0          # 0: greedy
    top_k: int = 0                    # 0: off
    top_p: float = 1.0                # 1: off
    min_p: float = 0.0                # 0: off
    repetition_penalty: float = 1.0   # 1: off
    seed: Optional[int] = None        # None: a random seed (reported as Sampler.seed)

    def __post_init__(self) -> None:
        def num(name, lo, hi, lo_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v > hi or v < lo \
                    or (lo_open and v == lo):
                rng = f"{'(' if lo_open else '['}{lo}, {hi}]"
                raise UsageError(f"--{name.replace('_', '-')} {v!r}: expected a number in {rng}")
        num("temperature", 0.0, 1e4)
        num("top_p", 0.0, 1.0, lo_open=True)
        num("min_p", 0.0, 1.0)
        num("repetition_penalty", 0.0, 1e4, lo_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise UsageError(f"--top-k {self.top_k!r}: expected an integer >= 0 (0: off)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2 ** 63):
            raise UsageError(f"--seed {self.seed!r}: expected an integer in [0, 2**63)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """logits [B, V] float, seen [B, V] bool (ids in the prompt or generated) -> penalised logits."""
    if penalty == 1.0:
        return logits
    pen = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, pen, logits)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the logits >= each row's k-th largest (-inf elsewhere); k <= 0 or k >= V: unchanged."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability sum reaches ``p`` (HF's rule: sort ascending
    and drop the tokens whose cumulative probability is <= 1 - p; the most likely token always stays)."""
    if p >= 1.0:
        return logits
    srt, order = torch.sort(logits, dim=-1, descending=False)
    cum = srt.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1.0 - p)
    drop[..., -1] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's largest probability."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < min_p * top, float("-inf"))   # the most likely token always stays


class Sampler:
    """Next-token choice for one generation run: ``sampler(logits, rows) -> ids [B]`` (int64, logits' device).

    ``prompts`` are the run's prompt ids; ``rows`` (a list of prompt indices, one per logits row) says which
    sequence each row is, so sequences may leave the batch between steps. The repetition penalty's seen-token
    mask is kept per prompt and updated with every chosen token."""

    def __init__(self, config: Optional[SamplingConfig], prompts: Sequence[Sequence[int]], vocab_size: int,
                 device=None):
        self.config = c = config or SamplingConfig()
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.seed = c.seed if c.seed is not None else int(torch.randint(0, 2 ** 62, (1,)).item())
        self.generators = []
        if not c.greedy:
            for i in range(len(prompts)):
                g = torch.Generator(device=self.device)
                g.manual_seed((self.seed + 0x9E3779B97F4A7C15 * (i + 1)) % 2 ** 63)
                self.generators.append(g)
        self.seen = None
        if c.repetition_penalty != 1.0:
            self.seen = torch.zeros(len(prompts), vocab_size, dtype=torch.bool, device=self.device)
            for i, p in enumerate(prompts):
                self.seen[i, torch.tensor([int(t) for t in p], dtype=torch.long, device=self.device)] = True

    def process(self, logits: Tensor, rows: Sequence[int]) -> Tensor:
        """The filtered float32 logits [B, V] (temperature applied) the draw is made from."""
        c = self.config
        x = logits.float().to(self.device)
        if self.seen is not None:
            x = apply_repetition_penalty(x, self.seen[torch.tensor(list(rows), device=self.device)],
                                         c.repetition_penalty)
        if c.greedy:
            return x
        x = x / c.temperature
        x = top_k_filter(x, c.top_k)
        x = top_p_filter(x, c.top_p)
        return min_p_filter(x, c.min_p)

    def __call__(self, logits: Tensor, rows: Sequence[int]) -> Tensor:
        x = self.process(logits, rows)
        if self.config.greedy:
            ids = x.argmax(-1)
        else:
            V = x.shape[-1]
            race = torch.stack([torch.empty(V, device=x.device).exponential_(generator=self.generators[i])
                                for i in rows])
            ids = (x.softmax(-1) / race).argmax(-1)
        if self.seen is not None:
            self.seen[torch.tensor(list(rows), device=self.device), ids] = True
        return ids
