"""Garbage cu_seqlens and slots, as TensorRT feeds a plugin while it times it during the engine build: the
kernels clamp them on the device (offsets into [0, T] with end >= begin; a slot outside [0, P) skips its
sequence) and must finish, without a fault, a hang, or a write outside their buffers.

The kernels are launched directly (the torch ops validate values on the host and would refuse these inputs).
Every output buffer (o, final state / pool, the prefill workspace) sits between guard bands of a byte pattern
that must survive the launch; reads out of bounds are what compute-sanitizer's memcheck, run over this file by
scripts/device_gpu_check.sh, checks. Where the clamped offsets form a valid split of the tokens (garbage that
is only negative or beyond T) the outputs must equal the reference on the clamped offsets.
"""
from __future__ import annotations

import time

import pytest
import torch

from conftest import call_decode_ref, call_prefill_ref, make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, op_attrs, scan_configs, to_device

GUARD = 4096  # bytes of pattern before and after each output buffer (a multiple of 256: keeps alignment)
PATTERN = 0xA5
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


class Guarded:
    """A CUDA buffer of `shape` and `dtype` between two guard bands of PATTERN bytes."""

    def __init__(self, shape, dtype, fill=float("nan")):
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        self.raw = torch.full((GUARD + n + GUARD,), PATTERN, dtype=torch.uint8, device="cuda")
        self.t = self.raw[GUARD:GUARD + n].view(dtype).view(shape)
        if fill is not None:
            self.t.fill_(fill)

    def assert_guards(self, what):
        for band, where in ((self.raw[:GUARD], "before"), (self.raw[-GUARD:], "after")):
            bad = int((band != PATTERN).sum())
            assert bad == 0, f"{what}: {bad} guard bytes {where} the buffer were written (out-of-bounds store)"


def finish(what, timeout_s=120.0):
    """Wait for the stream's work; fail (instead of hanging the session) if it does not finish."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.monotonic()
    while not ev.query():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"{what}: the kernels did not finish within {timeout_s:.0f} s (deadlock?)")
        time.sleep(0.001)
    torch.cuda.synchronize()  # raises on a device fault


def garbage_offsets(kind, N, T, gen):
    """cu_seqlens (N + 1 int32) of one garbage kind."""
    if kind == "random":      # uniform int32: mostly huge and negative
        return torch.randint(I32_MIN, I32_MAX, (N + 1,), generator=gen, dtype=torch.int64).to(torch.int32)
    if kind == "decreasing":
        return torch.linspace(T, -T, N + 1).to(torch.int32)
    if kind == "overlapping":  # sequences over the same tokens: prep items and scan CTAs disagree on ids
        return torch.tensor([0 if i % 2 == 0 else T for i in range(N + 1)], dtype=torch.int32)
    if kind == "small_random":  # in and around [0, T], any order
        return torch.randint(-T // 4, T + T // 4, (N + 1,), generator=gen, dtype=torch.int64).to(torch.int32)
    raise ValueError(kind)


def _launch_prefill(kernels, d, attrs, cu, scan, tma):
    """Launch on guarded, NaN-poisoned outputs and a guarded 0xFF workspace; returns the guarded buffers."""
    o = Guarded(d["v"].shape, d["v"].dtype)
    final = Guarded(d["initial_state"].shape, torch.float32)
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], cu, d["initial_state"], o.t,
                                      final.t, d.get("A_log"), d.get("dt_bias"), **attrs)
    segments = CP_SEGMENTS if scan in ("cp", "cp_mma", "cp_wg") else None
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p, segments)
    ws = Guarded((nbytes,), torch.uint8, fill=0xFF) if nbytes else None
    kernels.launch.launch_prefill(kernels.LIB, p, None if ws is None else ws.t, torch.device("cuda"), scan=scan,
                                  tma=tma, segments=segments)
    return o, final, ws


CP_SEGMENTS = 3  # the context-parallel scans, forced to 3 segments per sequence


def _configs(kernels, K, io):
    """Every scan configuration that runs here and the context-parallel scans (16-bit I/O), the fp32 kernel
    otherwise."""
    cp = [("cp", True), ("cp_mma", True), ("cp_wg", True)]
    return scan_configs(kernels, K) + cp if io != "f32" else [("auto", True)]


# (io, Hk, Hv, K, V, T, N): T = 1000 gives 16 chunks per sequence at most, N = 6 sequences
SHAPES = [("bf16", 2, 4, 128, 128, 1000, 6), ("f16", 1, 2, 64, 64, 700, 5), ("bf16", 1, 2, 256, 64, 400, 4),
          ("f32", 2, 4, 64, 64, 300, 4)]


@pytest.mark.parametrize("kind", ["random", "decreasing", "overlapping", "small_random"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-K{s[3]}V{s[4]}")
def test_prefill_garbage_offsets_finish_in_bounds(kernels, gen, shape, kind):
    io, Hk, Hv, K, V, T, N = shape
    inp = make_prefill_inputs(gen, [T // N] * (N - 1) + [T - (N - 1) * (T // N)], Hk, Hv, K, V, gate_mode=1,
                              use_qk_l2norm=1)
    d, _ = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(1, 1)
    for scan, tma in _configs(kernels, K, io):
        cu = garbage_offsets(kind, N, T, gen).cuda()
        what = f"prefill {scan}{'' if tma else ' (cp.async)'} cu_seqlens={cu.tolist()}"
        o, final, ws = _launch_prefill(kernels, d, attrs, cu, scan, tma)
        finish(what)
        o.assert_guards(f"{what}: o")
        final.assert_guards(f"{what}: final_state")
        if ws is not None:
            ws.assert_guards(f"{what}: workspace")


@pytest.mark.parametrize("cu_list", [[-100, 5, 70, I32_MAX], [I32_MIN, 0, 64, 64, 2000, 5000]],
                         ids=["negative-first-huge-last", "int-min-and-beyond-T"])
@pytest.mark.parametrize("io", ["bf16", "f32"])
def test_prefill_clamped_offsets_equal_reference(kernels, gen, io, cu_list):
    """Garbage that only lies below 0 or beyond T clamps to a valid split: the outputs are the reference's on it."""
    T, Hk, Hv, K, V = 300, 2, 4, 128, 128
    N = len(cu_list) - 1
    inp = make_prefill_inputs(gen, [T] + [0] * (N - 1), Hk, Hv, K, V, use_qk_l2norm=1)  # (tensors for T tokens)
    d, ref = to_device(inp, DT[io], torch.float32)
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    clamped = cu.clamp(0, T)
    ref["cu_seqlens"] = clamped
    attrs = op_attrs(0, 1)
    ro, rs = call_prefill_ref(ref, form="chunked", **attrs)
    for scan, tma in _configs(kernels, K, io):
        o, final, ws = _launch_prefill(kernels, d, attrs, cu, scan, tma)
        finish(f"prefill {scan}")
        assert not torch.isnan(o.t).any() and not torch.isnan(final.t).any(), f"{scan}: unwritten outputs"
        tol = tolerance_for(DT[io])
        assert rel_err(o.t, ro) <= tol and rel_err(final.t, rs) <= tol, f"{scan}: differs from the clamped reference"
        o.assert_guards("o")
        final.assert_guards("final_state")


def _launch_pool(kernels, d, slots, P):
    """Pool decode on a guarded copy of the pool and a guarded, NaN-poisoned o; returns (o, pool)."""
    pool = Guarded(d["state"].shape, torch.float32, fill=None)
    pool.t.copy_(d["state"])
    o = Guarded(d["v"].shape, d["v"].dtype)
    p = kernels.launch.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], pool.t, pool.t, o.t, slots,
                                     state_mode=1, **op_attrs(0, 1))
    kernels.launch.launch_decode(kernels.LIB, p, torch.device("cuda"))
    return o, pool


def _launch_pool_checked(kernels, d, slots, P):
    """_launch_pool, then what holds for any slots: guards intact, o = 0 for sequences whose slot is outside
    [0, P), pool rows no valid slot names bitwise unchanged. Returns (o, pool, valid)."""
    before = d["state"].clone()
    o, pool = _launch_pool(kernels, d, slots, P)
    finish("decode pool")
    o.assert_guards("o")
    pool.assert_guards("pool")
    valid = (slots >= 0) & (slots < P)
    assert torch.equal(o.t[~valid], torch.zeros_like(o.t[~valid])), "o of a skipped sequence is not 0"
    untouched = [i for i in range(P) if i not in set(slots[valid].tolist())]
    assert torch.equal(pool.t[untouched].view(torch.int32), before[untouched].view(torch.int32))
    return o, pool, valid


@pytest.mark.parametrize("io", ["bf16", "f32"])
def test_decode_pool_garbage_slots_skip(kernels, gen, io):
    """Slots outside [0, P) (negative, P, huge, int32 min/max) skip their sequence: o = 0, pool untouched; the
    valid slots are updated as the reference does."""
    B, P = 9, 6
    inp = make_decode_inputs(gen, B, Hk=2, Hv=4, K=128, V=64, use_qk_l2norm=1, pool_size=P + 3)
    inp["state"] = inp["state"][:P].contiguous()
    d, r = to_device(inp, DT[io], torch.float32)
    slots = torch.tensor([-1, P, 3, I32_MAX, I32_MIN, 0, P + 1000, -7, 5], dtype=torch.int32, device="cuda")
    o, pool, valid = _launch_pool_checked(kernels, d, slots, P)
    r["slots"] = torch.where(valid, slots, torch.full_like(slots, -1))
    ro, rs = call_decode_ref(r, state_mode=1, **op_attrs(0, 1))
    assert rel_err(o.t[valid], ro[valid]) <= tolerance_for(DT[io])
    assert rel_err(pool.t, rs) <= 1e-4


def test_decode_pool_random_int32_slots(kernels, gen):
    """Uniform random int32 slots (some may repeat a valid row: their updates race, but stay in the pool)."""
    B, P = 64, 16
    inp = make_decode_inputs(gen, B, Hk=2, Hv=4, K=128, V=128, use_qk_l2norm=1, pool_size=B)
    inp["state"] = inp["state"][:P].contiguous()
    d, _ = to_device(inp, torch.bfloat16, torch.float32)
    slots = torch.randint(I32_MIN, I32_MAX, (B,), generator=gen, dtype=torch.int64).to(torch.int32)
    slots[::4] = torch.randint(0, P, (B // 4,), generator=gen, dtype=torch.int32)
    slots = slots.cuda()
    _launch_pool_checked(kernels, d, slots, P)
