"""Multi-token verify steps of a :class:`~gdn_deploy.lm.model.HybridLM` from its decode states, and the commit.

A verify step runs L tokens per sequence (``input_ids [B, L]``, the first at ``positions[b]``) through every
layer from the decode states (:mod:`gdn_deploy.lm.model`'s layout):

- GDN layers: the conv over the L inputs from the stored window, then ``torch.ops.gdn.verify`` (the recurrent
  state is only read); what the commit needs is kept in a :class:`GDNPending`;
- attention layers: the L keys/values are written into the KV cache at their positions and each token attends to
  the slots up to its own position (:func:`attend_cached`); rejected tokens' slots lie beyond the next position,
  are masked there and overwritten by later steps, so attention needs no commit.

:func:`commit` then lands every GDN layer on the state after the first ``accepted[b]`` tokens: the recurrent
state through ``torch.ops.gdn.commit_`` (in place), the conv window shifted by the accepted count
(:func:`conv_commit`). Both work on padded ``[B, L]`` batches: GDN layers see them as packed sequences of
length L (``cu_seqlens = L * arange(B + 1)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from .attention import Attention
from .gdn import L2NORM_EPS, GDNBlock, _state32
from .norms import wide

__all__ = ["GDNPending", "attend_cached", "conv_commit", "gdn_verify", "gdn_commit", "verify_step", "commit",
           "uniform_cu_seqlens"]


@dataclass
class GDNPending:
    """What one GDN layer's commit needs: the pre-conv inputs and the verify op's factors."""
    mixed: Tensor          # [T, conv_dim] pre-conv inputs of the verified tokens
    commit_k: Tensor
    commit_delta: Tensor
    commit_g: Tensor


def uniform_cu_seqlens(B: int, L: int, device=None) -> Tensor:
    return (torch.arange(B + 1, device=device, dtype=torch.int32) * L).to(torch.int32)


def attend_cached(attn: Attention, x: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor):
    """x [B, L, hidden], positions [B, L] int, caches [B, Hkv, S, D] -> (y [B, L, hidden], k_cache, v_cache).

    Token (b, l) writes its key/value at slot ``positions[b, l]`` (no write when >= S) and attends to the slots
    ``<= positions[b, l]``: with L = 1 this is :meth:`Attention.decode`."""
    B, L, _ = x.shape
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    S = k_cache.shape[2]
    q, k, v, gate = attn._qkv(x.reshape(B * L, -1), positions.reshape(-1))
    slot = torch.arange(S, device=x.device)
    pos = positions.to(torch.long)
    write = slot[None, None, :] == pos[:, :, None]                               # [B, L, S]
    hit = write.any(1)[:, None, :, None]                                         # [B, 1, S, 1]
    src = write.to(torch.int32).argmax(1)                                        # [B, S]: which token writes
    idx = src[:, None, :, None].expand(B, Hkv, S, D)

    def put(cache: Tensor, new: Tensor) -> Tensor:
        rows = new.reshape(B, L, Hkv, D).permute(0, 2, 1, 3).to(cache.dtype)     # [B, Hkv, L, D]
        return torch.where(hit, torch.gather(rows, 2, idx), cache)

    k_cache, v_cache = put(k_cache, k), put(v_cache, v)
    qh = q.reshape(B, L, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)                # [B, Hkv, rep, L, D]
    scores = torch.matmul(qh, k_cache.to(q.dtype)[:, :, None].transpose(-1, -2)) * attn.scaling   # [.., L, S]
    scores = scores.masked_fill((slot[None, None, :] > pos[:, :, None])[:, None, None], float("-inf"))
    p = torch.softmax(wide(scores), dim=-1).to(q.dtype)
    o = torch.matmul(p, v_cache.to(q.dtype)[:, :, None])                         # [B, Hkv, rep, L, D]
    o = o.permute(0, 3, 1, 2, 4).reshape(B * L, H * D)
    return attn._out(o, None if gate is None else gate).reshape(B, L, -1), k_cache, v_cache


def conv_commit(conv_state: Tensor, mixed: Tensor, cu_seqlens: Tensor, accepted: Tensor) -> Tensor:
    """The conv window after the first ``accepted[n]`` (clamped to [0, T_n]) inputs of each sequence:
    the last W-1 rows of ``[window ; mixed[start : start + accepted]]``. conv_state [N, C, W-1], mixed [T, C]."""
    N, C, W1 = conv_state.shape
    cu = cu_seqlens.to(torch.long)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    j = torch.minimum(accepted.to(torch.long).clamp(min=0), lens)
    table = torch.cat([conv_state.to(mixed.dtype).transpose(1, 2).reshape(N * W1, C), mixed], dim=0)
    i = torch.arange(W1, device=mixed.device)
    rel = j[:, None] - W1 + i[None, :]                                           # [N, W-1]
    idx = torch.where(rel >= 0, N * W1 + starts[:, None] + rel,
                      torch.arange(N, device=mixed.device)[:, None] * W1 + j[:, None] + i[None, :])
    out = table.index_select(0, idx.reshape(-1)).reshape(N, W1, C).transpose(1, 2)
    return out.to(conv_state.dtype).contiguous()


def gdn_verify(block: GDNBlock, x: Tensor, cu_seqlens: Tensor, conv_state: Tensor, rec_state: Tensor):
    """x [T, hidden] packed verify tokens -> (y [T, hidden], GDNPending); the states are not changed."""
    mixed, z, b, a = block._project(x)
    conv_out, _ = block._varlen_conv(mixed, cu_seqlens, conv_state)
    q, k, v = block._split_qkv(conv_out)
    gt = block._gate_args(a, b)
    o, ck, cd, cg = torch.ops.gdn.verify(q, k, v, gt["g"], gt["beta"], cu_seqlens, _state32(rec_state), None,
                                         gt["A_log"], gt["dt_bias"], gate_mode=gt["gate_mode"], use_qk_l2norm=1,
                                         scale=0.0, l2norm_eps=L2NORM_EPS, state_mode=0)
    return block._output(o, z), GDNPending(mixed, ck, cd, cg)


def gdn_commit(pending: GDNPending, cu_seqlens: Tensor, accepted: Tensor, conv_state: Tensor, rec_state: Tensor):
    """(conv_state, rec_state) after the accepted tokens; ``rec_state`` is updated in place (and returned)."""
    torch.ops.gdn.commit_(rec_state, pending.commit_k.to(rec_state.dtype), pending.commit_delta.to(rec_state.dtype),
                          pending.commit_g.to(rec_state.dtype), cu_seqlens, accepted)
    return conv_commit(conv_state, pending.mixed, cu_seqlens, accepted), rec_state


def verify_step(model, input_ids: Tensor, positions: Tensor, states: Sequence):
    """input_ids [B, L], positions [B] (of each row's first token), decode states -> (hidden [B, L, hidden]
    before the final norm, states, pending). Attention caches come back with the L tokens written; GDN states
    are unchanged until :func:`commit`. ``model.norm`` + lm_head of the hidden give the logits."""
    B, L = input_ids.shape
    cu = uniform_cu_seqlens(B, L, input_ids.device)
    pos = positions.to(torch.long)[:, None] + torch.arange(L, device=input_ids.device)[None, :]
    h = model.embed_tokens(input_ids.reshape(-1))
    new_states, pending = [], []
    for layer, st in zip(model.layers, states):
        x = layer._mixer_in(h)
        if layer.layer_type == "linear_attention":
            y, pend = gdn_verify(layer.linear_attn, x, cu, *st)
            new_states.append(st)
            pending.append(pend)
        else:
            y, kc, vc = attend_cached(layer.self_attn, x.reshape(B, L, -1), pos, *st)
            y = y.reshape(B * L, -1)
            new_states.append((kc, vc))
            pending.append(None)
        h = layer._finish(h, y)
    return h.reshape(B, L, -1), new_states, pending


def commit(states: Sequence, pending: Sequence[Optional[GDNPending]], L: int, accepted: Tensor) -> list:
    """Decode states after the first ``accepted[b]`` of the L verified tokens of each row (see the module doc)."""
    B = accepted.shape[0]
    cu = uniform_cu_seqlens(B, L, accepted.device)
    acc = accepted.to(torch.int32)
    out = []
    for st, pend in zip(states, pending):
        out.append(st if pend is None else gdn_commit(pend, cu, acc, *st))
    return out
