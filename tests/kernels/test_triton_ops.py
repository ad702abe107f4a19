"""The Triton glue kernels (gdn_deploy.lm.triton_ops) against float64 references and the eager modules: fresh
random inputs, outputs allocated over NaN-poisoned memory, row counts 0/1/63/64/65, ragged sequences, pool rows
outside the batch left bit-identical and slots outside the pool neither read nor written."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err

from gdn_deploy.lm import triton_ops as tk
from gdn_deploy.lm.norms import GatedRMSNorm, RMSNorm

pytestmark = pytest.mark.skipif(tk.triton is None or not torch.cuda.is_available(), reason="needs triton and CUDA")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


def _poison():
    """Fill freed allocator memory with NaN so an unwritten output element shows up."""
    x = torch.full((1 << 22,), float("nan"), device="cuda")
    del x


def _norm64(x, w, eps, kind):
    h = x.double()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h * (1.0 + w.double()) if kind == "zero_centered" else h * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["scale", "zero_centered", "scale_fp32"])
@pytest.mark.parametrize("rows,n", [(0, 64), (1, 1024), (63, 100), (64, 256), (65, 4096)])
def test_rms_norm(gen, dtype, kind, rows, n):
    x = torch.randn(rows, n, generator=gen).to("cuda", dtype) * 3
    r = torch.randn(rows, n, generator=gen).to("cuda", dtype)
    w = (torch.rand(n, generator=gen) * 2 - 0.5).to("cuda", dtype)
    _poison()
    y = tk.rms_norm(x, w, 1e-6, kind)
    _poison()
    y2, h = tk.rms_norm(x, w, 1e-6, kind, residual=r)
    assert y.shape == x.shape and y.dtype == dtype and h.dtype == dtype
    assert torch.isfinite(y).all() and torch.isfinite(y2).all() and torch.isfinite(h).all()
    if rows == 0:
        return
    assert torch.equal(h, x + r)                                   # the residual add rounds like torch's
    assert rel_err(y.double(), _norm64(x, w, 1e-6, kind)) < _tol(dtype)
    assert rel_err(y2.double(), _norm64(h, w, 1e-6, kind)) < _tol(dtype)
    m = RMSNorm(n, 1e-6, kind).to("cuda", dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    tk.ENABLED = False
    try:
        eager = m(x)
    finally:
        tk.ENABLED = True
    assert rel_err(y.double(), eager.double()) < _tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_rows_and_gate(gen, dtype):
    """q of an output-gated attention is a strided view [R, H, D] of [R, H, 2D]; the gated form of GDN."""
    R, H, D = 5, 3, 128
    qg = torch.randn(R, H, 2 * D, generator=gen).to("cuda", dtype)
    q = qg[..., :D]
    w = torch.rand(D, generator=gen).to("cuda", dtype) + 0.5
    _poison()
    y = tk.rms_norm(q, w, 1e-6)
    assert rel_err(y.double(), _norm64(q, w, 1e-6, "scale")) < _tol(dtype)
    z = torch.randn(R, H, D, generator=gen).to("cuda", dtype)
    _poison()
    yg = tk.rms_norm(q, w, 1e-6, gate=z)
    want = _norm64(q, w, 1e-6, "scale") * F.silu(z.double())
    assert rel_err(yg.double(), want) < _tol(dtype)
    m = GatedRMSNorm(D).to("cuda", dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    got = m(q, z)                                                  # the module's CUDA path is the kernel
    assert torch.equal(got, yg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(0, 8), (1, 3584), (65, 100)])
def test_silu_mul(gen, dtype, rows, n):
    x = torch.randn(rows, 2 * n, generator=gen).to("cuda", dtype) * 3
    _poison()
    y = tk.silu_mul(x)
    assert y.shape == (rows, n) and torch.isfinite(y).all()
    if rows:
        want = F.silu(x[:, :n].double()) * x[:, n:].double()
        assert rel_err(y.double(), want) < _tol(dtype)


def _conv64(window, w, bias):
    acc = (window.double() * w.double()).sum(-1)
    return F.silu(acc if bias is None else acc + bias.double())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_step_in_place(gen, dtype, W, with_bias):
    P, C = 9, 300
    pool = torch.randn(P, C, W - 1, generator=gen).to("cuda", dtype)
    x = torch.randn(6, 2 * C, generator=gen).to("cuda", dtype)[:, :C]          # strided rows
    w = torch.randn(C, W, generator=gen).to("cuda", dtype)
    bias = torch.randn(C, generator=gen).to("cuda", dtype) if with_bias else None
    slots = torch.tensor([7, 0, 3, 8, -1, 9], device="cuda")                    # -1 and 9: outside the pool
    before = pool.clone()
    _poison()
    out = tk.conv_step_(x, pool, slots, w, bias)
    assert torch.isfinite(out).all()
    for i, s in enumerate(slots.tolist()):
        cached = before[s] if 0 <= s < P else torch.zeros_like(before[0])
        want = _conv64(torch.cat([cached, x[i, :, None]], 1), w, bias)
        assert rel_err(out[i].double(), want) < _tol(dtype), i
    for s in range(P):
        if s in (7, 0, 3, 8):
            i = [7, 0, 3, 8].index(s)
            assert torch.equal(pool[s], torch.cat([before[s], x[i, :, None]], 1)[:, 1:])
        else:
            assert torch.equal(pool[s], before[s])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [[0, 1, 2, 3, 5], [63, 64, 65], [1]])
def test_varlen_conv(gen, dtype, lens):
    W, C = 4, 200
    N, T = len(lens), sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    x = torch.randn(T, C, generator=gen).to("cuda", dtype)
    st = torch.randn(N, C, W - 1, generator=gen).to("cuda", dtype)
    w = torch.randn(C, W, generator=gen).to("cuda", dtype)
    bias = torch.randn(C, generator=gen).to("cuda", dtype)
    _poison()
    out = tk.varlen_conv(x, cu, st, w, bias)
    assert out.shape == (T, C) and torch.isfinite(out).all()
    c = cu.tolist()
    for n in range(N):
        seq = torch.cat([st[n].T, x[c[n]:c[n + 1]]], 0)                         # [W-1+L, C]
        for t in range(lens[n]):
            want = _conv64(seq[t:t + W].T, w, bias)
            assert rel_err(out[c[n] + t].double(), want) < _tol(dtype), (n, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp32", [True, False])
@pytest.mark.parametrize("D,rd,factor", [(64, 16, 1.0), (256, 64, 2.0), (24, 24, 1.0)])
def test_rope(gen, dtype, fp32, D, rd, factor):
    """Against apply_rope(rope_cos_sin(...)) (the eager form, same roundings) and float64 math; positions 0 to
    8K; a strided input (q beside its output gate); the dims past the rotary part copied unchanged."""
    from gdn_deploy.lm.attention import apply_rope, rope_cos_sin, rope_inv_freq
    inv = rope_inv_freq(1e7, rd).to("cuda")
    x = torch.randn(4, 3, 2 * D, generator=gen).to("cuda", dtype)[..., :D]
    pos = torch.tensor([0, 1, 1000, 8191], device="cuda")
    _poison()
    got = tk.rope(x, pos, inv, factor, fp32)
    cos, sin = rope_cos_sin(pos, inv, factor)
    assert rel_err(got.double(), apply_rope(x, cos, sin, fp32).double()) < _tol(dtype)
    f = pos.double()[:, None] / factor * inv.double()[None, :]
    c, s = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    r = x[..., :rd].double()
    want = torch.cat([r * c + torch.cat([-r[..., rd // 2:], r[..., :rd // 2]], -1) * s, x[..., rd:].double()], -1)
    assert rel_err(got.double(), want) < _tol(dtype)
    assert torch.equal(got[..., rd:], x[..., rd:])
