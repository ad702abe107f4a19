"""Prefill that continues from earlier states, and multi-turn conversations on an export folder.

:func:`prefill` runs the prefill graph of a folder whose prefill takes every layer's past state
(``ExportFolder.prefill_continues``): N sequences of new tokens, each at its own past length, continuing from the
states a previous prefill or decode returned (GDN conv/recurrent states, KV caches ``[N, Hkv, S, D]``), so a second
turn or the next chunk of a long prompt costs only its new tokens. onnxruntime's GroupQueryAttention refuses a
batch of several sequences when a prompt continues from a past: such batches run in groups of rows
(:func:`.chunked_prefill.prefill_into`, which also feeds long prompts in pieces).

:class:`Conversation` keeps one sequence's states between turns: each :meth:`Conversation.turn` feeds the new
turn's ids (after the reply token the previous turn generated but did not feed) and generates the reply; with
``prefill_chunk``, a turn longer than that is prefilled in pieces (:mod:`.chunked_prefill`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..errors import UsageError
from .chunked_prefill import check_prefill_chunk, prefill_into
from .folder import ExportFolder
from .generation import state_holder
from .sampling import Sampler, SamplingConfig
from .states import STATE_DTYPES, StateHolder, TensorStates, empty_state_feed

__all__ = ["prefill", "check_states", "grow_states", "Conversation"]


def check_states(folder: ExportFolder, states: dict[str, Tensor], n: int, past: Sequence[int], new: Sequence[int]):
    """UsageError (one line) unless ``states`` are every state of the folder for ``n`` sequences with the sidecar's
    dtypes and shapes, and every sequence's past + padded new tokens fit the KV caches. Returns the capacity S."""
    want = [s.prefill_input for s in folder.states]
    if sorted(states) != sorted(want):
        raise UsageError(f"past states: expected {len(want)} tensors ({', '.join(want[:4])}, ...), got {len(states)}"
                         f" ({', '.join(sorted(states)[:4])}, ...)")
    S = None
    for s in folder.states:
        x = states[s.prefill_input]
        if x.dtype != STATE_DTYPES[s.dtype]:
            raise UsageError(f"past state {s.prefill_input}: dtype {str(x.dtype).replace('torch.', '')}, the graphs "
                             f"take {s.dtype}")
        if "S" in s.decode_shape and x.dim() == len(s.decode_shape):
            S = int(x.shape[s.decode_shape.index("S")]) if S is None else S
        shape = [n if d == "B" else (S if d == "S" else d) for d in s.decode_shape]
        if list(x.shape) != shape:
            raise UsageError(f"past state {s.prefill_input}: shape {list(x.shape)}, expected {shape}")
    L = max(new)
    for i, p in enumerate(past):
        if S is not None and p + L > S:
            raise UsageError(f"sequence {i}: past length {p} + {L} new tokens exceed the KV-cache capacity {S}")
    return S


def grow_states(folder: ExportFolder, states: dict[str, Tensor], capacity: int) -> dict[str, Tensor]:
    """KV caches zero-padded to ``capacity`` slots (kept when already that large)."""
    out = {}
    for s in folder.states:
        x = states[s.prefill_input]
        if s.kind == "attention":
            ax = s.decode_shape.index("S")
            if x.shape[ax] < capacity:
                pad = list(x.shape)
                pad[ax] = capacity - x.shape[ax]
                x = torch.cat([x, x.new_zeros(pad)], dim=ax)
        out[s.prefill_input] = x
    return out


def prefill(folder: ExportFolder, backend, prompts: Sequence[Sequence[int]], states: Optional[dict] = None,
            past: Optional[Sequence[int]] = None, capacity: Optional[int] = None,
            holder: Optional[StateHolder] = None, chunk: Optional[int] = None):
    """Prefill ``prompts`` (new token ids per sequence, >= 1 each) at past lengths ``past`` (default 0) continuing
    from ``states`` (default: zero states with KV caches of ``capacity`` slots, default just enough); with
    ``chunk``, at most that many tokens per call (:func:`~gdn_deploy.runtime.chunked_prefill.prefill_into`).
    Returns (logits [N, vocab] of each sequence's last token, the states after it, by input name). The states end
    up in ``holder`` (default: a new :class:`~gdn_deploy.runtime.states.TensorStates`; a
    :func:`~gdn_deploy.runtime.generation.state_holder`'s, e.g. onnxruntime's bound states, for decoding on): the
    returned tensors are its own, which a bound holder's next run updates in place."""
    if not folder.prefill_continues:
        raise UsageError(f"{folder.path}: its prefill graph starts from empty states (exported by an earlier "
                         "gdn-deploy); re-export it to continue a prompt")
    chunk = check_prefill_chunk(folder, chunk)
    N = len(prompts)
    past = [0] * N if past is None else [int(p) for p in past]
    if len(past) != N or any(p < 0 for p in past):
        raise UsageError(f"past lengths {past}: expected {N} integers >= 0")
    lens = [len(p) for p in prompts]
    if not N or min(lens) < 1:
        raise UsageError("prefill: every sequence needs at least one new token")
    if states is None:
        states = empty_state_feed(folder, N, capacity or max(p + max(lens) for p in past))
    check_states(folder, states, N, past, lens)
    holder = TensorStates(folder, backend) if holder is None else holder
    return prefill_into(holder, prompts, past, states, chunk), holder.prefill_states()


class Conversation:
    """One sequence's states across turns (prefill continues; nothing already fed is fed again)."""

    def __init__(self, folder: ExportFolder, backend, sampling: Optional[SamplingConfig] = None,
                 eos_token_ids: Optional[Sequence[int]] = None, prefill_chunk: Optional[int] = None):
        self.folder, self.backend, self.sampling = folder, backend, sampling
        self.prefill_chunk = check_prefill_chunk(folder, prefill_chunk)
        self.eos = set(folder.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.states: Optional[dict[str, Tensor]] = None
        self.fed: list[int] = []            # every token whose state is in self.states
        self.pending: list[int] = []        # the last reply token (generated, not fed yet)

    def turn(self, ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Feed ``ids`` (the next turn) and generate up to ``max_new_tokens`` (stops at an eos id)."""
        new = self.pending + [int(t) for t in ids]
        if not new:
            raise UsageError("a conversation turn needs at least one token")
        V, limit = self.folder.vocab_size, self.folder.max_positions
        bad = [t for t in new if not 0 <= t < V]
        if bad:
            raise UsageError(f"token id(s) {bad[:3]} outside the vocabulary [0, {V})")
        past = len(self.fed)
        if limit and past + len(new) + max_new_tokens > limit:
            raise UsageError(f"the conversation would reach {past + len(new) + max_new_tokens} tokens, beyond the "
                             f"model's position limit (max_position_embeddings={limit})")
        cap = past + len(new) + max_new_tokens
        states = None if self.states is None else grow_states(self.folder, self.states, cap)
        holder = state_holder(self.folder, self.backend)
        logits, _ = prefill(self.folder, self.backend, [new], states, [past], capacity=cap, holder=holder,
                            chunk=self.prefill_chunk)
        self.fed += new
        sampler = Sampler(self.sampling, [self.fed], V, device=logits.device)
        out: list[int] = []
        dev = self.backend.device
        for step in range(max_new_tokens):
            t = int(sampler(logits, [0])[0])
            out.append(t)
            if t in self.eos or step == max_new_tokens - 1:
                break
            feed = {"input_ids": torch.tensor([t], device=dev),
                    "positions": torch.tensor([len(self.fed)], device=dev)}
            logits = holder.run("decode", feed)["logits"]
            self.fed.append(t)
        self.states, self.pending = holder.prefill_states(), out[-1:]
        return out
