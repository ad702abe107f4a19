"""Attention of a block of new tokens per sequence against that sequence's KV cache, writing the new rows first.

``cache_attention(q [N, L, H*D], k, v [N, L, Hkv*D], k_cache, v_cache [N, Hkv, S, D], past [N] int64,
num_heads, kv_heads, scale) -> (o [N, L, H*D], k_cache', v_cache')``:

- row ``i`` of sequence ``n`` is its token at position ``past[n] + i``: its key/value are written into slot
  ``past[n] + i`` of the caches (every one of the L rows, padding rows included: a sequence with fewer new tokens
  than L leaves rows in slots after its end, which later calls overwrite before anything reads them; so
  ``past[n] + L <= S`` is required);
- query ``i`` attends to slots ``0 .. past[n] + i`` of its own sequence (grouped-query: query head h reads kv head
  ``h // (H // Hkv)``), softmax in float32.

This is exactly onnxruntime's ``com.microsoft::GroupQueryAttention`` with ``seqlens_k = past + L - 1`` and
``total_sequence_length = max(past) + L``: the ONNX translation (:mod:`gdn_deploy.export.onnx_cache_attention`)
emits that one node for onnxruntime (its fused CPU / CUDA kernels; past and present caches of the same size S, so a
runtime may bind them to one buffer), and the TensorRT copy of a graph replaces it by a ``ScatterND`` row write
and the standard ONNX ``Attention`` (:func:`gdn_deploy.export.onnx_cache_attention.expand_cache_attention`).
The eager implementation below is the reference both are tested against.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .norms import wide

__all__ = ["cache_attention", "cache_attention_ref"]


def cache_attention_ref(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, past: Tensor,
                        num_heads: int, kv_heads: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The eager math of :func:`cache_attention` (see the module docstring)."""
    N, L = q.shape[0], q.shape[1]
    H, Hkv = num_heads, kv_heads
    S, D = k_cache.shape[2], k_cache.shape[3]
    pos = past.to(torch.long)[:, None] + torch.arange(L, device=q.device)[None, :]          # [N, L]
    if N and L and int(pos.max()) >= S:
        raise ValueError(f"cache attention: position {int(pos.max())} beyond the KV-cache capacity {S}")
    seq = torch.arange(N, device=q.device)[:, None, None].expand(N, L, Hkv)
    head = torch.arange(Hkv, device=q.device)[None, None, :].expand(N, L, Hkv)
    slot = pos[:, :, None].expand(N, L, Hkv)
    k_cache = k_cache.index_put((seq, head, slot), k.reshape(N, L, Hkv, D).to(k_cache.dtype))
    v_cache = v_cache.index_put((seq, head, slot), v.reshape(N, L, Hkv, D).to(v_cache.dtype))
    mask = torch.arange(S, device=q.device)[None, None, :] <= pos[:, :, None]                # [N, L, S]
    qh = q.reshape(N, L, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)                            # [N, Hkv, rep, L, D]
    kc, vc = k_cache.to(q.dtype)[:, :, None], v_cache.to(q.dtype)[:, :, None]               # [N, Hkv, 1, S, D]
    s = torch.matmul(qh, kc.transpose(-1, -2)) * scale                                       # [N, Hkv, rep, L, S]
    s = wide(s).masked_fill(~mask[:, None, None], float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1).to(q.dtype), vc)                               # [N, Hkv, rep, L, D]
    return o.permute(0, 3, 1, 2, 4).reshape(N, L, H * D), k_cache, v_cache


@torch.library.custom_op("gdn_export::cache_attention", mutates_args=())
def cache_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, past: Tensor,
                    num_heads: int, kv_heads: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """See the module docstring (one ONNX node when exported)."""
    o, kc, vc = cache_attention_ref(q, k, v, k_cache, v_cache, past, num_heads, kv_heads, scale)
    return o.contiguous(), kc.contiguous(), vc.contiguous()


@cache_attention.register_fake
def _(q, k, v, k_cache, v_cache, past, num_heads, kv_heads, scale):
    return q.new_empty(q.shape), k_cache.new_empty(k_cache.shape), v_cache.new_empty(v_cache.shape)
