"""Small-M GEMV kernel (gemvSmallM.cu, ``gdn::gemv``) on the GPU against a float64 reference.

Fresh random inputs per case; the reference multiplies the exact values the kernel reads (low-precision inputs
upcast to float64); outputs are poisoned with NaN before a launch and every element outside the output rows must
keep its NaN. Tolerances (norm-relative): the output's own rounding (bf16 2^-9, fp16 2^-12) plus fp32 sums.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err

from ._gpu_util import DT

TOL = {"f32": 2e-6, "f16": 1e-3, "bf16": 6e-3}
SHAPES = ((1, 1), (63, 1000), (1000, 63), (4097, 64), (65, 4097), (1024, 1024), (300, 8))


@pytest.fixture(scope="module")
def gemv(kernels):
    from gdn_deploy.kernels import gemv as g
    why = g.unavailable_reason()
    if why is not None:
        pytest.fail(f"gemv kernel unavailable with the kernel library loaded: {why}")
    return g


def _inputs(gen, M, N, K, dt, residual):
    x = torch.randn(M, K, generator=gen, dtype=torch.float64).to(DT[dt]).cuda()
    w = (torch.randn(N, K, generator=gen, dtype=torch.float64) / K ** 0.5).to(DT[dt]).cuda()
    r = torch.randn(M, N, generator=gen, dtype=torch.float64).to(DT[dt]).cuda() if residual else None
    return x, w, r


def _ref(x, w, r):
    y = x.double() @ w.double().T
    return y if r is None else y + r.double()


@pytest.mark.parametrize("dt", sorted(TOL))
@pytest.mark.parametrize("M", (1, 2, 7, 16))
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("residual", (False, True))
def test_matches_float64(gemv, dt, M, N, K, residual):
    gen = torch.Generator().manual_seed(1000 * M + 7 * N + K + residual)
    x, w, r = _inputs(gen, M, N, K, dt, residual)
    pad = 5                                              # columns past N: must stay poisoned
    buf = torch.full((M, N + pad), float("nan"), dtype=DT[dt], device="cuda")
    y = buf[:, :N]
    gemv.launch(x, w, y, r)
    torch.cuda.synchronize()
    assert torch.isfinite(y).all(), "an output element was not written"
    assert torch.isnan(buf[:, N:]).all(), "the kernel wrote past its output rows"
    assert rel_err(y, _ref(x, w, r)) < TOL[dt]


@pytest.mark.parametrize("dt", sorted(TOL))
@pytest.mark.parametrize("split_k", (1, 2, 4, 8))
@pytest.mark.parametrize("M", (1, 16))
def test_every_split(gemv, dt, split_k, M):
    gen = torch.Generator().manual_seed(split_k * 31 + M)
    x, w, r = _inputs(gen, M, 2053, 3584, dt, True)
    y = torch.full((M, 2053), float("nan"), dtype=DT[dt], device="cuda")
    gemv.launch(x, w, y, r, split_k=split_k)
    assert rel_err(y, _ref(x, w, r)) < TOL[dt]


@pytest.mark.parametrize("dt", sorted(TOL))
def test_strided_and_unaligned(gemv, dt):
    """x at an odd element offset (element-wide loads), W rows with a longer stride, y / residual strided."""
    gen = torch.Generator().manual_seed(5)
    M, N, K = 7, 1000, 1024
    xb = torch.randn(M * (K + 3) + 1, generator=gen, dtype=torch.float64).to(DT[dt]).cuda()
    x = xb[1:].view(M, K + 3)[:, :K]                       # odd offset, ldx = K + 3
    wb = (torch.randn(N, K + 8, generator=gen, dtype=torch.float64) / 32).to(DT[dt]).cuda()
    w = wb[:, 8:]                                           # ldw = K + 8, 16-byte aligned rows
    rb = torch.randn(M, N + 2, generator=gen, dtype=torch.float64).to(DT[dt]).cuda()
    r = rb[:, 1:N + 1]
    yb = torch.full((M, N + 4), float("nan"), dtype=DT[dt], device="cuda")
    y = yb[:, 2:N + 2]
    gemv.launch(x, w, y, r)
    assert rel_err(y, _ref(x, w, r)) < TOL[dt]
    assert torch.isnan(yb[:, :2]).all() and torch.isnan(yb[:, N + 2:]).all()
    x2 = x.clone()                                           # aligned copy: the vector path, same function
    y2 = torch.empty(M, N, dtype=DT[dt], device="cuda")
    gemv.launch(x2, w, y2, r)
    assert rel_err(y2, _ref(x, w, r)) < TOL[dt]


@pytest.mark.parametrize("dt", sorted(TOL))
def test_deterministic(gemv, dt):
    gen = torch.Generator().manual_seed(9)
    for M, N, K in ((1, 8224, 1024), (16, 1024, 3584), (5, 32768, 1024)):
        x, w, r = _inputs(gen, M, N, K, dt, False)
        a = torch.ops.gdn.gemv(x, w)
        b = torch.ops.gdn.gemv(x, w)
        assert torch.equal(a, b)


def test_zero_k_is_residual(gemv):
    """K = 0 (no kernel: F.linear's zeros) plus the residual."""
    x = torch.empty(3, 0, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(10, 0, dtype=torch.bfloat16, device="cuda")
    r = torch.randn(3, 10, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(torch.ops.gdn.gemv(x, w, r), r)
    assert torch.equal(torch.ops.gdn.gemv(x, w), torch.zeros(3, 10, dtype=torch.bfloat16, device="cuda"))


def test_op_shapes_and_fallback(gemv):
    """Leading dims flatten; M > 16 and mixed dtypes take F.linear (same values within rounding)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 1000, generator=gen).to(torch.bfloat16).cuda()
    w = torch.randn(777, 1000, generator=gen).to(torch.bfloat16).cuda()
    r = torch.randn(2, 3, 777, generator=gen).to(torch.bfloat16).cuda()
    assert gemv.kernel_applies(x, w, r)
    y = torch.ops.gdn.gemv(x, w, r)
    assert y.shape == (2, 3, 777) and rel_err(y, _ref(x.reshape(6, -1), w, r.reshape(6, -1)).reshape(2, 3, 777)) < 6e-3
    big = torch.randn(17, 1000, generator=gen).to(torch.bfloat16).cuda()
    assert not gemv.kernel_applies(big, w)
    assert torch.equal(torch.ops.gdn.gemv(big, w), F.linear(big, w))
    assert not gemv.kernel_applies(x.float(), w)


def test_graph_replay_equals_eager(gemv):
    gen = torch.Generator().manual_seed(13)
    x, w, r = _inputs(gen, 8, 5120, 1024, "bf16", True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.gdn.gemv(x, w, r)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.gdn.gemv(x, w, r)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=gen).to(x.dtype))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.ops.gdn.gemv(x, w, r))
