"""Prefill that continues from past states, in one call or in pieces (chunked prefill).

:func:`prefill_into` prefills N sequences of new tokens, each at its own past length, from given states (zero states
for a fresh prompt) into a state holder, on a folder whose prefill graph takes every layer's past state
(``ExportFolder.prefill_continues``). With ``chunk``, no call takes more than ``chunk`` tokens: a longer prompt is
fed as consecutive pieces, each continuing from the states the previous piece left (its positions continue), so the
prefill's working memory (the chunked GDN form's per-chunk matrices, attention scores) is bounded by the chunk,
not by the prompt. The KV caches are sized by the caller for the whole prompt (+ new tokens) from the start.

onnxruntime's GroupQueryAttention (CPU and CUDA) refuses a batch of several sequences when a prompt continues from a
past, so a batch that cannot run in one call runs in groups of rows, each with its own one-group state holder: a
row with a past or more than ``chunk`` tokens on its own (piece after piece), neighbouring fresh short rows together
(at most ``chunk`` tokens per call). The rows' states are then joined into the batch's holder, in row order.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from ..errors import UsageError
from .folder import ExportFolder
from .states import StateHolder, TensorStates, last_token_logits, pack_prompts, prefill_feed

__all__ = ["check_prefill_chunk", "prefill_into", "row_groups"]


def check_prefill_chunk(folder: ExportFolder, chunk) -> Optional[int]:
    """``chunk`` as an int (None: prefill in one call), or UsageError (one line) for a value < 1 or a folder whose
    prefill does not continue from past states."""
    if chunk is None:
        return None
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise UsageError(f"--prefill-chunk {chunk!r}: expected an integer >= 1 (the most tokens one prefill call "
                         "takes)")
    if not folder.prefill_continues:
        raise UsageError(f"--prefill-chunk: the prefill graph of {folder.path} starts from empty states (a pure-GDN "
                         "LM, or a hybrid export of an earlier gdn-deploy): leave out --prefill-chunk")
    return chunk


def run_prefill(holder: StateHolder, prompts: Sequence[Sequence[int]], past: Sequence[int]) -> Tensor:
    """One prefill call: ``prompts`` at past lengths ``past`` from the holder's states (left there updated);
    the last tokens' logits ``[N, vocab]``."""
    dev = holder.backend.device
    ids, cu, _ = pack_prompts(prompts, dev)
    pos = torch.tensor([p + j for p, q in zip(past, prompts) for j in range(len(q))], dtype=torch.long, device=dev)
    return last_token_logits(holder.run("prefill", prefill_feed(holder.folder, ids, cu, pos))["logits"], cu)


def row_groups(lens: Sequence[int], past: Sequence[int], chunk: Optional[int]) -> list[list[int]]:
    """Rows in order, grouped for separate prefills: a row with a past or more than ``chunk`` new tokens alone;
    neighbouring fresh rows together while their tokens sum to at most ``chunk`` (no limit when None)."""
    groups: list[list[int]] = []
    room: float = -1                            # tokens the last group still takes (-1: none, it is a lone row)
    for i, (n, p) in enumerate(zip(lens, past)):
        alone = p > 0 or (chunk is not None and n > chunk)
        if not alone and n <= room:
            groups[-1].append(i)
            room -= n
        else:
            groups.append([i])
            room = -1 if alone else (math.inf if chunk is None else chunk - n)
    return groups


def _pieces(ids: Sequence[int], chunk: Optional[int]) -> list[Sequence[int]]:
    if chunk is None:
        return [ids]
    return [ids[a:a + chunk] for a in range(0, len(ids), chunk)]


def prefill_into(holder: StateHolder, prompts: Sequence[Sequence[int]], past: Sequence[int],
                 states: Mapping[str, Tensor], chunk: Optional[int] = None) -> Tensor:
    """Prefill ``prompts`` (>= 1 new token each) at past lengths ``past`` from ``states`` (every layer's, by
    prefill input name, N rows, KV caches large enough) into ``holder``; each sequence's last-token logits
    ``[N, vocab]``. One call when the batch allows it, else groups of rows (module docstring); with ``chunk``, at
    most ``chunk`` tokens per call."""
    N, lens = len(prompts), [len(p) for p in prompts]
    ort = getattr(holder.backend, "name", "") == "onnxruntime"
    if (chunk is None or max(lens) <= chunk) and not (N > 1 and any(past) and max(lens) > 1 and ort):
        holder.load(states)
        return run_prefill(holder, prompts, past)
    logits, parts = [], []
    for rows in row_groups(lens, past, chunk):
        one = TensorStates(holder.folder, holder.backend)
        one.capacity = holder.capacity
        one.load({k: v[rows[0]:rows[-1] + 1] for k, v in states.items()})
        if len(rows) > 1:
            logits.append(run_prefill(one, [prompts[i] for i in rows], [past[i] for i in rows]))
        else:
            at = past[rows[0]]
            for piece in _pieces(prompts[rows[0]], chunk):
                out = run_prefill(one, [piece], [at])
                at += len(piece)
            logits.append(out)
        parts.append(one.prefill_states())
    holder.load({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    return torch.cat(logits)
