"""Decode attention over pooled KV caches that reads only each sequence's filled part.

``decode_attention(q [B, H, D], k_pool, v_pool [P, Hkv, S, D], slots [B] int64, lengths [B] int64, scale)``
-> ``o [B, H, D]`` (q's dtype): row b attends to positions ``0 .. lengths[b]-1`` of pool row ``slots[b]``
(grouped-query: query head h reads kv head ``h // (H // Hkv)``), softmax and sums in float32.

- ``"triton"`` (CUDA, when triton imports): programs per (row, kv head, sequence chunk) stream the row's first
  ``lengths[b]`` cached positions in blocks with an online softmax (flash-decoding: the chunks split a long
  cache over the GPU when the batch is small; a second kernel combines their partial sums): bytes read = the
  filled part only, no host sync, graph-capturable (the partial sums' workspace comes from torch's allocator);
- ``"torch"``: the same math on the whole capacity with a length mask (any device; the reference).

Slots and lengths are trusted to lie in ``[0, P)`` and ``[1, S]``: the engine (gdn_deploy.runtime.cuda_engine)
owns them; the torch path clamps, the Triton path clamps the length to S.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["decode_attention", "triton_available"]

try:  # pragma: no cover - triton is a CUDA-only dependency
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001  (ImportError, or a broken triton install)
    triton = None


def triton_available() -> bool:
    return triton is not None and torch.cuda.is_available()


def _torch_attention(q, k_pool, v_pool, slots, lengths, scale):
    B, H, D = q.shape
    Hkv, S = k_pool.shape[1], k_pool.shape[2]
    k = k_pool.index_select(0, slots).float()                                  # [B, Hkv, S, D]
    v = v_pool.index_select(0, slots).float()
    qh = q.float().reshape(B, Hkv, H // Hkv, D)
    s = torch.matmul(qh, k.transpose(-1, -2)) * scale                          # [B, Hkv, rep, S]
    ln = lengths.clamp(1, S)[:, None, None, None]
    s = s.masked_fill(torch.arange(S, device=q.device) >= ln, float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), v)                              # [B, Hkv, rep, D]
    return o.reshape(B, H, D).to(q.dtype)


if triton is not None:  # pragma: no cover - compiled and tested on the GPU (tests/kernels/test_cuda_engine.py)
    @triton.jit
    def _decode_attn_kernel(Q, K, V, O, M_WS, L_WS, SLOTS, LENS, scale, S, CHUNK,
                            s_qb, s_qh, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs, s_ob, s_oh, s_os,
                            REP: tl.constexpr, REP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
                            BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
        """Program (b, kv head, split): positions [split * CHUNK, (split + 1) * CHUNK) of the row's first L.
        SPLIT=False: the normalised output into O[b, h]. SPLIT=True: the unnormalised sums into O[b, h, split]
        and the running max / sum into M_WS, L_WS [B, H, NSPLIT] (combined by _combine_kernel)."""
        b = tl.program_id(0)
        hk = tl.program_id(1)
        sp = tl.program_id(2)
        slot = tl.load(SLOTS + b).to(tl.int64)
        L = tl.minimum(tl.load(LENS + b).to(tl.int32), S)
        lo = sp * CHUNK
        hi = tl.minimum(L, lo + CHUNK)
        r = tl.arange(0, REP_P)
        d = tl.arange(0, D_P)
        n = tl.arange(0, BLOCK_N)
        rmask = r < REP
        dmask = d < D
        qmask = rmask[:, None] & dmask[None, :]
        q = tl.load(Q + b.to(tl.int64) * s_qb + (hk * REP + r)[:, None] * s_qh + d[None, :], mask=qmask,
                    other=0.0).to(tl.float32) * scale
        m = tl.full([REP_P], float("-inf"), tl.float32)
        l_sum = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D_P], tl.float32)
        kbase = K + slot * s_kp + hk * s_kh
        vbase = V + slot * s_vp + hk * s_vh
        for start in range(lo, hi, BLOCK_N):
            idx = start + n
            nmask = idx < hi
            lmask = nmask[:, None] & dmask[None, :]
            k = tl.load(kbase + idx[:, None].to(tl.int64) * s_ks + d[None, :], mask=lmask, other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)                  # [REP_P, BLOCK_N]
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            v = tl.load(vbase + idx[:, None].to(tl.int64) * s_vs + d[None, :], mask=lmask, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m = m_new
        heads = hk * REP + r
        if SPLIT:
            ns = tl.num_programs(2)
            tl.store(O + b.to(tl.int64) * s_ob + heads[:, None] * s_oh + sp * s_os + d[None, :], acc, mask=qmask)
            ws = (b.to(tl.int64) * (REP * tl.num_programs(1)) + heads) * ns + sp
            tl.store(M_WS + ws, m, mask=rmask)
            tl.store(L_WS + ws, l_sum, mask=rmask)
        else:
            o = acc / l_sum[:, None]
            tl.store(O + b.to(tl.int64) * s_ob + heads[:, None] * s_oh + d[None, :], o.to(O.dtype.element_ty),
                     mask=qmask)

    @triton.jit
    def _combine_kernel(ACC, M_WS, L_WS, O, NSPLIT, s_ob, s_oh,
                        D: tl.constexpr, D_P: tl.constexpr, NS_P: tl.constexpr):
        """Program (b, h): o = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i over the splits (split 0 always
        holds position 0, so M is finite; empty splits have m = -inf and add nothing)."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        row = b.to(tl.int64) * tl.num_programs(1) + h
        i = tl.arange(0, NS_P)
        d = tl.arange(0, D_P)
        imask = i < NSPLIT
        m = tl.load(M_WS + row * NSPLIT + i, mask=imask, other=float("-inf"))
        l_i = tl.load(L_WS + row * NSPLIT + i, mask=imask, other=0.0)
        mx = tl.max(m, axis=0)
        w = tl.where(imask, tl.exp(m - mx), 0.0)
        acc = tl.load(ACC + (row * NSPLIT + i)[:, None] * D + d[None, :], mask=imask[:, None] & (d < D)[None, :],
                      other=0.0)
        o = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l_i, axis=0)
        tl.store(O + b.to(tl.int64) * s_ob + h * s_oh + d, o.to(O.dtype.element_ty), mask=d < D)


SPLIT_TARGET_PROGRAMS = 264      # about two waves of programs on a 132-SM H100


def split_count(B: int, Hkv: int, S: int, block_n: int, splits: int | None = None) -> int:
    """How many sequence chunks each (row, kv head) is split into: enough programs to fill the GPU, chunks of at
    least 4 blocks, decided from the static shapes only (capacity S, not the lengths: no host sync)."""
    if splits is not None:
        return max(1, int(splits))
    want = -(-SPLIT_TARGET_PROGRAMS // max(1, B * Hkv))
    return max(1, min(want, -(-S // (4 * block_n))))


def _triton_attention(q, k_pool, v_pool, slots, lengths, scale, splits=None):  # pragma: no cover - GPU only
    B, H, D = q.shape
    Hkv, S = k_pool.shape[1], k_pool.shape[2]
    rep = H // Hkv
    q = q.contiguous()
    slots, lengths = slots.contiguous(), lengths.contiguous()     # the kernel indexes them densely
    o = torch.empty_like(q)
    if B == 0:
        return o
    d_p = triton.next_power_of_2(D)
    rep_p = max(triton.next_power_of_2(rep), 1)
    block_n = max(16, min(64, 8192 // (rep_p * d_p)))
    warps = 8 if rep_p * d_p * block_n > 8192 else 4
    ns = split_count(B, Hkv, S, block_n, splits)
    chunk = -(-S // ns)
    chunk = -(-chunk // block_n) * block_n
    ns = -(-S // chunk)
    strides = (q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
               v_pool.stride(0), v_pool.stride(1), v_pool.stride(2))
    meta = dict(REP=rep, REP_P=rep_p, D=D, D_P=d_p, BLOCK_N=block_n, num_warps=warps)
    if ns == 1:
        _decode_attn_kernel[(B, Hkv, 1)](q, k_pool, v_pool, o, o, o, slots, lengths, float(scale), S, S, *strides,
                                         o.stride(0), o.stride(1), 0, SPLIT=False, **meta)
        return o
    acc = torch.empty(B, H, ns, D, dtype=torch.float32, device=q.device)
    m_ws = torch.empty(B, H, ns, dtype=torch.float32, device=q.device)
    l_ws = torch.empty(B, H, ns, dtype=torch.float32, device=q.device)
    _decode_attn_kernel[(B, Hkv, ns)](q, k_pool, v_pool, acc, m_ws, l_ws, slots, lengths, float(scale), S, chunk,
                                      *strides, acc.stride(0), acc.stride(1), acc.stride(2), SPLIT=True, **meta)
    _combine_kernel[(B, H)](acc, m_ws, l_ws, o, ns, o.stride(0), o.stride(1), D=D, D_P=d_p,
                            NS_P=max(2, triton.next_power_of_2(ns)), num_warps=4)
    return o


def decode_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, slots: Tensor, lengths: Tensor, scale: float,
                     impl: str = "auto", splits: Optional[int] = None) -> Tensor:
    """See the module docstring. ``impl``: "auto" (Triton on CUDA when available, else torch), "triton", "torch";
    ``splits``: Triton's sequence chunks per (row, kv head) (default: :func:`split_count`)."""
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"decode_attention impl: expected auto, triton or torch, got {impl!r}")
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("decode_attention: the KV pools need a contiguous last dimension")
    use_triton = impl == "triton" or (impl == "auto" and q.is_cuda and triton is not None)
    if use_triton:
        if triton is None or not q.is_cuda:
            raise RuntimeError("decode_attention impl 'triton' needs triton and CUDA tensors")
        return _triton_attention(q, k_pool, v_pool, slots, lengths, scale, splits)
    return _torch_attention(q, k_pool, v_pool, slots, lengths, scale)
