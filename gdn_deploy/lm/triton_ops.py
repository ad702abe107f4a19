"""Triton kernels for the glue around the GDN and attention kernels on CUDA: one kernel where PyTorch's eager
ops launch five to ten.

- :func:`rms_norm`: RMSNorm (the three kinds of :class:`.norms.RMSNorm`), optionally after a residual add
  (``h = h + y`` rounded to the model dtype, then the norm of it: both returned), or gated like
  :class:`.norms.GatedRMSNorm` (``norm(x) * weight * silu(gate)``);
- :func:`silu_mul`: ``silu(gate) * up`` from a packed ``[R, 2n]`` gate|up projection;
- :func:`conv_step_`: the GDN short conv of one token per sequence reading and updating a state pool in place at
  per-row slots (window, taps, bias, SiLU; the pool's window shifted by one);
- :func:`varlen_conv`: the GDN short conv over packed sequences with per-sequence initial states (prefill);
- :func:`rope`: rotary embeddings at integer positions, cos/sin formed in the kernel.

Every kernel rounds where the eager module rounds (to the model dtype after the norm for kind ``scale``, after the
residual add, after SiLU) and accumulates in float32, so results agree with the eager ops to float32 rounding.
They run only on CUDA tensors of float32 / float16 / bfloat16 (:func:`usable`); callers keep the eager ops
otherwise (CPU, float64 reference runs, export tracing, torch.compile), and everywhere when the environment holds
``GDN_TRITON_GLUE=0`` at import (or :data:`ENABLED` is set False, e.g. inside :func:`disabled`: tests and
benchmarks compare both ways).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

import torch
from torch import Tensor

__all__ = ["usable", "disabled", "rms_norm", "silu_mul", "conv_step_", "varlen_conv", "rope", "NORM_KIND_CODES"]

try:  # pragma: no cover - triton is a CUDA-only dependency
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001  (ImportError, or a broken triton install)
    triton = None

NORM_KIND_CODES = {"scale": 0, "zero_centered": 1, "scale_fp32": 2}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
ENABLED = os.environ.get("GDN_TRITON_GLUE", "1") != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The eager torch ops instead of these kernels inside the block (:data:`ENABLED` restored after it)."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


def usable(*tensors: Tensor) -> bool:
    """True when the kernels may run on these tensors: triton imports, all on CUDA in fp32/fp16/bf16, and no
    tracer (ONNX export, torch.jit, torch.compile) is recording."""
    if triton is None or not ENABLED or not tensors or torch.compiler.is_compiling():
        return False                      # (checked first: under torch.compile the rest is never traced)
    if any(type(t) not in _PLAIN or not t.is_cuda or t.dtype not in _DTYPES for t in tensors):
        return False                      # (fake / functional tensors of a tracer are subclasses)
    return not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


if triton is not None:  # pragma: no cover - compiled and tested on the GPU (tests/kernels/test_triton_ops.py)
    @triton.jit
    def _rms_kernel(X, R, W, G, Y, RO, N, eps, s_x, s_r, s_g, s_y, s_ro,
                    KIND: tl.constexpr, HAS_RES: tl.constexpr, GATED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        off = tl.arange(0, BLOCK)
        m = off < N
        x = tl.load(X + row * s_x + off, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:                       # h = x + r in the model dtype (as the eager residual add rounds)
            r = tl.load(R + row * s_r + off, mask=m, other=0.0).to(tl.float32)
            x = (x + r).to(RO.dtype.element_ty)
            tl.store(RO + row * s_ro + off, x, mask=m)
            x = x.to(tl.float32)
        var = tl.sum(x * x, axis=0) / N
        h = x * (1.0 / tl.sqrt(var + eps))
        w = tl.load(W + off, mask=m, other=0.0).to(tl.float32)
        if KIND == 1:                     # zero_centered: (h * (1 + w)) -> dtype
            y = h * (1.0 + w)
        elif KIND == 2:                   # scale_fp32: (w * h) -> dtype
            y = w * h
        else:                             # scale: w * h.to(dtype), rounded again
            y = (w * h.to(Y.dtype.element_ty).to(tl.float32)).to(Y.dtype.element_ty).to(tl.float32)
        if GATED:                         # GatedRMSNorm: (w * h.to(dtype)) * silu(gate) -> dtype
            g = tl.load(G + row * s_g + off, mask=m, other=0.0).to(tl.float32)
            y = y * (g / (1.0 + tl.exp(-g)))
        tl.store(Y + row * s_y + off, y.to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_mul_kernel(X, Y, n, s_x, s_y, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        off = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = off < n
        g = tl.load(X + row * s_x + off, mask=m, other=0.0).to(tl.float32)
        u = tl.load(X + row * s_x + n + off, mask=m, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)      # silu rounds to the dtype
        tl.store(Y + row * s_y + off, (s * u).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _conv_step_kernel(X, POOL, SLOTS, CW, BIAS, OUT, C, rows, s_xb, s_pp, s_pc, s_pw, s_cc, s_cw, s_ob,
                          KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        slot = tl.load(SLOTS + b).to(tl.int64) + tl.zeros([BLOCK_C], dtype=tl.int64)
        ok = (slot >= 0) & (slot < rows)                 # rows outside the pool read zeros and write nothing
        slot = tl.where(ok, slot, 0)
        mc = c < C
        ms = mc & ok
        x = tl.load(X + b * s_xb + c, mask=mc, other=0.0)
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(BIAS + c, mask=mc, other=0.0).to(tl.float32)
        base = POOL + slot * s_pp + c * s_pc
        prev = tl.load(base, mask=ms, other=0.0)
        for j in tl.static_range(KW - 1):                # taps over the cached window, oldest first
            acc += prev.to(X.dtype.element_ty).to(tl.float32) * tl.load(CW + c * s_cc + j * s_cw, mask=mc,
                                                                            other=0.0).to(tl.float32)
            if j + 1 < KW - 1:
                nxt = tl.load(base + (j + 1) * s_pw, mask=ms, other=0.0)
                tl.store(base + j * s_pw, nxt, mask=ms)          # shift the window by one
                prev = nxt
        acc += x.to(tl.float32) * tl.load(CW + c * s_cc + (KW - 1) * s_cw, mask=mc, other=0.0).to(tl.float32)
        tl.store(base + (KW - 2) * s_pw, x.to(POOL.dtype.element_ty), mask=ms)
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(OUT + b * s_ob + c, y.to(OUT.dtype.element_ty), mask=mc)

    @triton.jit
    def _varlen_conv_kernel(X, STATE, SEQ, CU, CW, BIAS, OUT, T, C, N, s_xt, s_sn, s_sc, s_sw, s_cc, s_cw, s_ot,
                            KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_C: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mt = t < T
        mc = c < C
        seq = tl.load(SEQ + t, mask=mt, other=0).to(tl.int64)
        seq = tl.minimum(tl.maximum(seq, 0), N - 1)
        start = tl.load(CU + seq, mask=mt, other=0).to(tl.int64)
        pos = t - start                                   # position of the token inside its sequence
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(BIAS + c, mask=mc, other=0.0).to(tl.float32)[None, :]
        m2 = mt[:, None] & mc[None, :]
        for j in tl.static_range(KW):
            rel = pos - (KW - 1) + j                      # the tap's position in the sequence (< 0: initial state)
            from_x = rel >= 0
            xv = tl.load(X + (t - (KW - 1) + j)[:, None] * s_xt + c[None, :],
                         mask=m2 & from_x[:, None], other=0.0).to(tl.float32)
            sidx = tl.where(from_x, 0, rel + (KW - 1))
            sv = tl.load(STATE + seq[:, None] * s_sn + c[None, :] * s_sc + sidx[:, None] * s_sw,
                         mask=m2 & (~from_x)[:, None], other=0.0).to(X.dtype.element_ty).to(tl.float32)
            w = tl.load(CW + c * s_cc + j * s_cw, mask=mc, other=0.0).to(tl.float32)
            acc += tl.where(from_x[:, None], xv, sv) * w[None, :]
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(OUT + t[:, None] * s_ot + c[None, :], y.to(OUT.dtype.element_ty), mask=m2)

    @triton.jit
    def _rope_kernel(X, Y, POS, INV, half, D, factor, s_xb, s_xh, s_yb, s_yh,
                     FP32: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        x_row = X + b * s_xb + h * s_xh
        y_row = Y + b * s_yb + h * s_yh
        i = tl.arange(0, BLOCK_R)
        mi = i < half
        pos = tl.load(POS + b).to(tl.float32) / factor
        f = pos * tl.load(INV + i, mask=mi, other=0.0).to(tl.float32)
        c = tl.cos(f)
        s = tl.sin(f)
        x1 = tl.load(x_row + i, mask=mi, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + half + i, mask=mi, other=0.0).to(tl.float32)
        dt = Y.dtype.element_ty
        if FP32:                          # x * cos + rotate_half(x) * sin in float32, rounded once
            o1 = x1 * c - x2 * s
            o2 = x2 * c + x1 * s
        else:                             # in the model dtype, rounded after every op as eager torch does
            c = c.to(dt).to(tl.float32)
            s = s.to(dt).to(tl.float32)
            o1 = (x1 * c).to(dt).to(tl.float32) + (-x2 * s).to(dt).to(tl.float32)
            o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
        tl.store(y_row + i, o1.to(dt), mask=mi)
        tl.store(y_row + half + i, o2.to(dt), mask=mi)
        d = tl.arange(0, BLOCK_D)
        md = (d >= 2 * half) & (d < D)    # the dims past the rotary part are copied
        tl.store(y_row + d, tl.load(x_row + d, mask=md, other=0.0), mask=md)


def _rows(x: Tensor) -> Tensor:
    """x as a 2-D [rows, N] view with a unit last stride (copied only when it cannot be viewed so)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: Tensor, weight: Tensor, eps: float, kind: str = "scale", residual: Optional[Tensor] = None,
             gate: Optional[Tensor] = None):
    """RMSNorm over the last dimension of ``x`` (``kind``: see :class:`.norms.RMSNorm`; ``gate``: the gated form,
    kind ``scale`` only). With ``residual``: ``h = x + residual`` first -> (norm(h), h); else -> norm(x).
    Outputs are new contiguous tensors of x's shape and dtype."""
    n = x.shape[-1]
    x2 = _rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ro = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
    r2 = _rows(residual) if residual is not None else x2
    g2 = _rows(gate) if gate is not None else x2
    rows = x2.shape[0]
    if rows:
        block = triton.next_power_of_2(n)
        _rms_kernel[(rows,)](x2, r2, weight, g2, y, ro, n, float(eps), x2.stride(0), r2.stride(0), g2.stride(0),
                             n, n, KIND=NORM_KIND_CODES[kind], HAS_RES=residual is not None, GATED=gate is not None,
                             BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return (y, ro) if residual is not None else y


def silu_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :n]) * x[..., n:]`` for x [..., 2n] (a packed gate|up projection)."""
    n = x.shape[-1] // 2
    x2 = _rows(x)
    y = torch.empty(x.shape[:-1] + (n,), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(1024, triton.next_power_of_2(n))
        _silu_mul_kernel[(x2.shape[0], triton.cdiv(n, block))](x2, y, n, x2.stride(0), n, BLOCK=block, num_warps=4)
    return y


def conv_step_(x: Tensor, pool: Tensor, slots: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """One decode step of the causal depthwise conv + SiLU: x [B, C] (the new inputs), pool [P, C, W-1] (cached
    windows, updated in place at ``slots`` [B]: shifted by one, x appended), weight [C, W] (taps, oldest first),
    bias [C] or None -> out [B, C] in x's dtype. Rows whose slot lies outside [0, P) read a zero window and write
    nothing."""
    B, C = x.shape
    W = weight.shape[-1]
    out = torch.empty_like(x)
    if B:
        block = 256
        _conv_step_kernel[(B, triton.cdiv(C, block))](
            x, pool, slots, weight, bias if bias is not None else weight, out, C, pool.shape[0], x.stride(0),
            pool.stride(0), pool.stride(1), pool.stride(2), weight.stride(0), weight.stride(1), out.stride(0),
            KW=W, HAS_BIAS=bias is not None, BLOCK_C=block, num_warps=4)
    return out


def varlen_conv(x: Tensor, cu_seqlens: Tensor, state: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The causal depthwise conv + SiLU over packed sequences: x [T, C] (unit last stride), cu_seqlens [N+1],
    state [N, C, W-1] (each sequence's inputs before its first token, oldest first), weight [C, W], bias [C] or
    None -> out [T, C] in x's dtype."""
    T, C = x.shape
    N, W = cu_seqlens.shape[0] - 1, weight.shape[-1]
    out = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if T == 0 or N == 0:
        return out
    cu = cu_seqlens.to(torch.int64)
    seq = torch.searchsorted(cu[1:], torch.arange(T, device=x.device), right=True)   # sequence id per token
    bt, bc = 32, 128
    _varlen_conv_kernel[(triton.cdiv(T, bt), triton.cdiv(C, bc))](
        x, state, seq, cu, weight, bias if bias is not None else weight, out, T, C, N, x.stride(0),
        state.stride(0), state.stride(1), state.stride(2), weight.stride(0), weight.stride(1), out.stride(0),
        KW=W, HAS_BIAS=bias is not None, BLOCK_T=bt, BLOCK_C=bc, num_warps=4)
    return out


def rope(x: Tensor, positions: Tensor, inv_freq: Tensor, factor: float = 1.0, fp32: bool = True) -> Tensor:
    """RoPE (HF's rotate_half convention) on the first ``2 * len(inv_freq)`` dims of x [R, H, D] (unit last
    stride) at integer ``positions`` [R], cos/sin formed in the kernel from float32 ``positions / factor *
    inv_freq`` -> a new contiguous tensor (:func:`..lm.attention.apply_rope` with ``rope_cos_sin``)."""
    R, H, D = x.shape
    half = inv_freq.shape[0]
    y = torch.empty((R, H, D), dtype=x.dtype, device=x.device)
    if R and H:
        _rope_kernel[(R, H)](x, y, positions, inv_freq, half, D, float(factor), x.stride(0), x.stride(1),
                             y.stride(0), y.stride(1), FP32=bool(fp32), BLOCK_R=triton.next_power_of_2(half),
                             BLOCK_D=triton.next_power_of_2(D), num_warps=1 if D <= 128 else 2)
    return y
