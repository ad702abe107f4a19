"""Decode attention over pooled KV caches that reads only each sequence's filled part.

``decode_attention(q [B, H, D], k_pool, v_pool [P, Hkv, S, D], slots [B] int64, lengths [B] int64, scale)``
-> ``o [B, H, D]`` (q's dtype): row b attends to positions ``0 .. lengths[b]-1`` of pool row ``slots[b]``
(grouped-query: query head h reads kv head ``h // (H // Hkv)``), softmax and sums in float32.

- ``"triton"`` (CUDA, when triton imports): one program per (row, kv head) streams the row's first
  ``lengths[b]`` cached positions in blocks with an online softmax: bytes read = the filled part only, no
  allocation, no host sync, graph-capturable;
- ``"torch"``: the same math on the whole capacity with a length mask (any device; the reference).

Slots and lengths are trusted to lie in ``[0, P)`` and ``[1, S]``: the engine (gdn_deploy.runtime.cuda_engine)
owns them; the torch path clamps, the Triton path clamps the length to S.
"""
from __future__ import annotations

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
    def _decode_attn_kernel(Q, K, V, O, SLOTS, LENS, scale, S,
                            s_qb, s_qh, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs, s_ob, s_oh,
                            REP: tl.constexpr, REP_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
                            BLOCK_N: tl.constexpr):
        b = tl.program_id(0)
        hk = tl.program_id(1)
        slot = tl.load(SLOTS + b).to(tl.int64)
        L = tl.minimum(tl.load(LENS + b).to(tl.int32), S)
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
        for start in range(0, L, BLOCK_N):
            idx = start + n
            nmask = idx < L
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
        o = acc / l_sum[:, None]
        tl.store(O + b.to(tl.int64) * s_ob + (hk * REP + r)[:, None] * s_oh + d[None, :],
                 o.to(O.dtype.element_ty), mask=qmask)


def _triton_attention(q, k_pool, v_pool, slots, lengths, scale):  # pragma: no cover - GPU only
    B, H, D = q.shape
    Hkv, S = k_pool.shape[1], k_pool.shape[2]
    rep = H // Hkv
    q = q.contiguous()
    o = torch.empty_like(q)
    if B == 0:
        return o
    d_p = triton.next_power_of_2(D)
    rep_p = max(triton.next_power_of_2(rep), 1)
    block_n = max(16, min(64, 8192 // (rep_p * d_p)))
    warps = 8 if rep_p * d_p * block_n > 8192 else 4
    _decode_attn_kernel[(B, Hkv)](q, k_pool, v_pool, o, slots, lengths, float(scale), S,
                                  q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
                                  v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), o.stride(0), o.stride(1),
                                  REP=rep, REP_P=rep_p, D=D, D_P=d_p, BLOCK_N=block_n, num_warps=warps)
    return o


def decode_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, slots: Tensor, lengths: Tensor, scale: float,
                     impl: str = "auto") -> Tensor:
    """See the module docstring. ``impl``: "auto" (Triton on CUDA when available, else torch), "triton", "torch"."""
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"decode_attention impl: expected auto, triton or torch, got {impl!r}")
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("decode_attention: the KV pools need a contiguous last dimension")
    use_triton = impl == "triton" or (impl == "auto" and q.is_cuda and triton is not None)
    if use_triton:
        if triton is None or not q.is_cuda:
            raise RuntimeError("decode_attention impl 'triton' needs triton and CUDA tensors")
        return _triton_attention(q, k_pool, v_pool, slots, lengths, scale)
    return _torch_attention(q, k_pool, v_pool, slots, lengths, scale)
