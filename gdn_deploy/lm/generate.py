"""Greedy generation with a :class:`HybridLM` in PyTorch: one packed prefill for all prompts, then one decode call
per step for the whole batch (sequences of different lengths share every call; a finished sequence stays in the
batch, its later tokens are dropped)."""
from __future__ import annotations

from typing import Sequence

import torch

from .model import HybridLM, decode_states_from_prefill

__all__ = ["greedy_generate", "check_prompt_lengths", "pack_prompts"]


def check_prompt_lengths(model: HybridLM, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """ValueError (one line) for an empty prompt, a token id outside the vocabulary, or prompt + new tokens
    beyond the model's position limit (``max_position_embeddings``)."""
    c = model.hybrid_config
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= int(t) < c.vocab_size]
        if bad:
            raise ValueError(f"prompt {i}: token id(s) {bad[:3]} outside the vocabulary [0, {c.vocab_size})")
        need = len(p) + max(int(max_new_tokens), 0)
        if c.max_position_embeddings and need > c.max_position_embeddings:
            raise ValueError(f"prompt {i}: {len(p)} tokens + {max_new_tokens} new exceed the model's position limit "
                             f"max_position_embeddings={c.max_position_embeddings}")


def pack_prompts(prompts: Sequence[Sequence[int]], device=None):
    """(input_ids [T] int64, cu_seqlens [N+1] int32) of the prompts concatenated."""
    ids = torch.tensor([int(t) for p in prompts for t in p], dtype=torch.long, device=device)
    cu = [0]
    for p in prompts:
        cu.append(cu[-1] + len(p))
    return ids, torch.tensor(cu, dtype=torch.int32, device=device)


@torch.no_grad()
def greedy_generate(model: HybridLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_token_ids: Sequence[int] = ()) -> list[list[int]]:
    """Generated token ids per prompt (argmax each step; stops a sequence at an eos id, which is kept)."""
    check_prompt_lengths(model, prompts, max_new_tokens)
    dev = model.embed_tokens.weight.device
    ids, cu = pack_prompts(prompts, dev)
    logits, states = model.forward_prefill(ids, cu, last_only=True)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    capacity = int(lens.max()) + max_new_tokens
    states = decode_states_from_prefill(model.hybrid_config, states, cu, capacity)
    eos = set(int(e) for e in eos_token_ids)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    positions = lens.clone()
    for step in range(max_new_tokens):
        nxt = logits.argmax(-1)
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                out[i].append(t)
                done[i] = t in eos
        if all(done) or step == max_new_tokens - 1:
            break
        logits, states = model.forward_decode(nxt, positions, states)
        positions = positions + 1
    return out
