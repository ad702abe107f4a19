"""Greedy generation from an export folder with any backend.

One prefill call for all prompts (packed, ``cu_seqlens``; sequences of different lengths), then one decode call
per step for the whole batch: every sequence at its own position, its states carried from the previous call.
A sequence that emits an end-of-sequence id (the sidecar's ``generation.eos_token_ids`` unless given) stops and
leaves the batch (its state rows are dropped), so sequences finish at different times.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import UsageError
from ..lm.model import scatter_packed
from .folder import ExportFolder

__all__ = ["GenerationResult", "generate", "check_prompts", "pack_prompts"]


@dataclass
class GenerationResult:
    tokens: list[list[int]]                 # generated ids per prompt (an eos id included when it stopped one)
    prefill_logits: Tensor                  # [N, vocab] float32: each prompt's last-token logits
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0                  # tokens produced by decode calls (batch rows summed over steps)
    finished: list[bool] = field(default_factory=list)   # stopped by an eos id


def check_prompts(folder: ExportFolder, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """UsageError (one line) for n < 1, an empty prompt, an id outside the vocabulary, or prompt + n beyond the
    model's position limit."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UsageError(f"-n/--max-new-tokens {max_new_tokens!r}: expected an integer >= 1")
    if not prompts:
        raise UsageError("no prompts: give at least one (--ids 1,2,3 or -p TEXT)")
    V, limit = folder.vocab_size, folder.max_positions
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise UsageError(f"prompt {i} is empty: every prompt needs at least one token")
        bad = [t for t in p if not 0 <= int(t) < V]
        if bad:
            raise UsageError(f"prompt {i}: token id(s) {bad[:3]} outside the vocabulary [0, {V})")
        if limit and len(p) + max_new_tokens > limit:
            raise UsageError(f"prompt {i}: {len(p)} tokens + {max_new_tokens} new exceed the model's position limit "
                             f"(max_position_embeddings={limit}); shorten the prompt or lower -n")


def pack_prompts(prompts: Sequence[Sequence[int]], device=None) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids [T] int64, cu_seqlens [N+1] int32, positions [T] int64) of the prompts concatenated."""
    ids = torch.tensor([int(t) for p in prompts for t in p], dtype=torch.long, device=device)
    cu = [0]
    for p in prompts:
        cu.append(cu[-1] + len(p))
    pos = torch.tensor([j for p in prompts for j in range(len(p))], dtype=torch.long, device=device)
    return ids, torch.tensor(cu, dtype=torch.int32, device=device), pos


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dim(d, sizes: dict) -> int:
    return int(sizes[d]) if isinstance(d, str) else int(d)


def generate(folder: ExportFolder, backend, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             eos_token_ids: Optional[Sequence[int]] = None) -> GenerationResult:
    check_prompts(folder, prompts, max_new_tokens)
    dev = backend.device
    ids, cu, pos = pack_prompts(prompts, dev)
    N, T = len(prompts), int(ids.shape[0])
    if folder.interop:
        from ..export.interop import require_equal_lengths
        require_equal_lengths(cu)
    feed = {"input_ids": ids, "cu_seqlens": cu}
    if folder.has_positions:
        feed["positions"] = pos
    for s in folder.states:
        if s.prefill_input:                       # pure-GDN LM exports start prefill from given (zero) states
            shape = [_dim(d, {"B": N}) for d in s.decode_shape]
            feed[s.prefill_input] = torch.zeros(shape, dtype=torch.float32, device=dev)
    _sync(dev)
    t0 = time.perf_counter()
    out = backend.run("prefill", feed)
    _sync(dev)
    t_prefill = time.perf_counter() - t0
    logits = out["logits"]
    if logits.shape[0] != N:                      # every token's logits: keep each sequence's last
        logits = logits.index_select(0, (cu[1:].long() - 1).to(logits.device))
    prefill_logits = logits.float().cpu()
    lens = [len(p) for p in prompts]
    capacity = max(lens) + max_new_tokens
    states: dict[str, Tensor] = {}
    for s in folder.states:
        x = out[s.prefill_output]
        states[s.decode_input] = scatter_packed(x, cu.to(x.device), capacity) if s.kind == "attention" else x
    eos = set(folder.eos_token_ids if eos_token_ids is None else eos_token_ids)
    tokens: list[list[int]] = [[] for _ in prompts]
    finished = [False] * N
    alive = list(range(N))                        # prompt index of each batch row
    positions = torch.tensor(lens, dtype=torch.long, device=dev)
    t_decode, steps, produced = 0.0, 0, 0
    for step in range(max_new_tokens):
        nxt = logits.float().argmax(-1)
        keep = []
        for row, t in enumerate(nxt.tolist()):
            i = alive[row]
            tokens[i].append(t)
            if t in eos:
                finished[i] = True
            else:
                keep.append(row)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(alive):                # finished sequences leave the batch
            rows = torch.tensor(keep, dtype=torch.long)
            alive = [alive[r] for r in keep]
            nxt, positions = nxt[rows.to(nxt.device)], positions[rows.to(positions.device)]
            states = {k: v.index_select(0, rows.to(v.device)) for k, v in states.items()}
        feed = {"input_ids": nxt.to(dev), **states}
        if folder.has_positions:
            feed["positions"] = positions.to(dev)
        _sync(dev)
        t0 = time.perf_counter()
        out = backend.run("decode", feed)
        _sync(dev)
        t_decode += time.perf_counter() - t0
        steps, produced = steps + 1, produced + len(alive)
        logits = out["logits"]
        states = {s.decode_input: out[s.decode_output] for s in folder.states}
        positions = positions + 1
    return GenerationResult(tokens, prefill_logits, t_prefill, t_decode, steps, produced, finished)
