"""Torch binding of the CUDA kernels: registration, validation, layout, errors, CUDA graphs."""
from __future__ import annotations

import ctypes
from unittest import mock

import pytest
import torch

from conftest import call_decode_ref, call_prefill_ref, make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.spec import ContractError
from gdn_deploy.validate import tolerance_for


def _cuda(inp, io=torch.bfloat16, gate=torch.float32):
    out = {}
    for n, t in inp.items():
        if n in ("q", "k", "v"):
            t = t.to(io)
        elif n in ("g", "beta"):
            t = t.to(gate)
        elif t.is_floating_point():
            t = t.to(torch.float32)
        out[n] = t.cuda()
    return out


def _f64(d):
    return {n: (t.double() if t.is_floating_point() else t) for n, t in d.items()}


def _decode(d, **attrs):
    return torch.ops.gdn.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d.get("A_log"),
                                d.get("dt_bias"), **attrs)


def _decode_pool(d, **attrs):
    return torch.ops.gdn.decode_pool_(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["slots"],
                                      d.get("A_log"), d.get("dt_bias"), **attrs)


def test_struct_layout_matches_compiler(kernels):
    from gdn_deploy.kernels import library
    for which, cls in ((0, library.GdnPrefillParams), (1, library.GdnDecodeParams)):
        buf = (ctypes.c_size_t * 64)()
        n = kernels.LIB.gdnParamsLayoutC(which, buf, 64)
        assert n == len(cls._fields_) + 1
        assert list(buf[:n]) == [ctypes.sizeof(cls)] + [getattr(cls, f).offset for f, _ in cls._fields_]


def test_library_found_and_error_names(kernels):
    assert kernels.LIB_PATH is not None and kernels.LIB_PATH.is_file()
    assert "cudaErrorIllegalAddress" in kernels.library.error_text(kernels.LIB, 700)


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_decode_op_dispatches_to_kernel(kernels, gen, gate_mode):
    inp = make_decode_inputs(gen, 4, Hk=2, Hv=4, K=128, V=128, gate_mode=gate_mode, use_qk_l2norm=1)
    d = _cuda(inp)
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    with mock.patch.object(kernels.launch, "launch_decode", wraps=kernels.launch.launch_decode) as spy:
        o, s = _decode(d, **attrs)
    assert spy.call_count == 1, "gdn::decode on CUDA did not call the CUDA kernel"
    ro, rs = call_decode_ref(_f64(d), state_mode=0, **attrs)
    assert rel_err(o, ro) <= tolerance_for(torch.bfloat16) and rel_err(s, rs) <= 1e-4
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32 and o.is_cuda


def test_decode_pool_op_in_place(kernels, gen):
    inp = make_decode_inputs(gen, 5, Hk=2, Hv=4, K=64, V=128, use_qk_l2norm=1, pool_size=9)
    inp["slots"][2] = -1
    d = _cuda(inp, torch.float16, torch.float16)
    ref_in = _f64(d)
    pool = d["state"]
    before = pool.clone()
    o = _decode_pool(d, use_qk_l2norm=1)
    ro, rs = call_decode_ref(ref_in, state_mode=1, use_qk_l2norm=1)
    assert rel_err(o, ro) <= tolerance_for(torch.float16)
    assert rel_err(pool, rs) <= 1e-4
    assert not torch.equal(pool, before)
    assert torch.equal(o[2], torch.zeros_like(o[2]))


def test_decode_pool_non_contiguous_pool_updated(kernels, gen):
    inp = make_decode_inputs(gen, 3, Hk=1, Hv=2, K=64, V=64, pool_size=4)
    d = _cuda(inp, torch.float32)
    ref_in = _f64(d)
    padded = torch.zeros(d["state"].shape[0], d["state"].shape[1], 64, 72, device="cuda")[..., :64]
    padded.copy_(d["state"])
    assert not padded.is_contiguous()
    d["state"] = padded
    o = _decode_pool(d)
    ro, rs = call_decode_ref(ref_in, state_mode=1)
    assert rel_err(padded, rs) <= 1e-4 and rel_err(o, ro) <= 1e-4


def test_misaligned_inputs_still_correct(kernels, gen):
    inp = make_decode_inputs(gen, 2, Hk=2, Hv=2, K=64, V=64)
    d = _cuda(inp, torch.bfloat16)
    buf = torch.empty(d["v"].numel() + 1, dtype=torch.bfloat16, device="cuda")
    v = buf[1:].view(d["v"].shape)
    v.copy_(d["v"])
    assert v.data_ptr() % 8 != 0
    d["v"] = v
    o, s = _decode(d)
    ro, rs = call_decode_ref(_f64(d), state_mode=0)
    assert rel_err(o, ro) <= tolerance_for(torch.bfloat16) and rel_err(s, rs) <= 1e-4


def test_validation_errors_on_cuda(kernels, gen):
    d = _cuda(make_decode_inputs(gen, 2, Hk=2, Hv=4, K=64, V=64))
    with pytest.raises(ContractError, match="state"):
        _decode({**d, "state": d["state"].to(torch.float16)})
    with pytest.raises(ContractError, match="log decay"):
        _decode({**d, "g": d["g"].abs() + 0.1})
    pool = _cuda(make_decode_inputs(gen, 2, Hk=2, Hv=4, K=64, V=64, pool_size=3))
    pool["slots"][0] = 3
    with pytest.raises(ContractError, match="slots"):
        _decode_pool(pool)


def test_unsupported_head_dim_falls_back_to_reference(kernels, gen):
    d = _cuda(make_decode_inputs(gen, 2, Hk=1, Hv=2, K=32, V=16), torch.float32)
    with pytest.warns(UserWarning, match="reference"):
        o, s = _decode(d)
    ro, rs = call_decode_ref(_f64(d), state_mode=0)
    assert rel_err(o, ro) <= 1e-4 and rel_err(s, rs) <= 1e-4


def test_cuda_graph_replay_equals_eager(kernels, gen):
    B, Hk, Hv, K, V = 8, 2, 4, 128, 128
    attrs = dict(use_qk_l2norm=1, gate_mode=1)
    static = _cuda(make_decode_inputs(gen, B, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=1, use_qk_l2norm=1))
    pool_static = _cuda(make_decode_inputs(gen, B, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=1, use_qk_l2norm=1,
                                           pool_size=B + 3))
    pool_static["slots"][1] = -1
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        _decode(static, **attrs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, s_g = _decode(static, **attrs)
        o_pg = _decode_pool(pool_static, **attrs)
    for _ in range(3):  # fresh inputs copied into the static buffers, replay, compare with eager
        new = _cuda(make_decode_inputs(gen, B, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=1, use_qk_l2norm=1))
        newp = _cuda(make_decode_inputs(gen, B, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=1, use_qk_l2norm=1,
                                        pool_size=B + 3))
        for n in static:
            static[n].copy_(new[n])
        for n in pool_static:
            if n != "slots":
                pool_static[n].copy_(newp[n])
        pool_before = pool_static["state"].clone()
        graph.replay()
        torch.cuda.synchronize()
        o_e, s_e = _decode(new, **attrs)
        eager_pool = {**pool_static, "state": pool_before}
        o_pe = _decode_pool(eager_pool, **attrs)
        assert torch.equal(o_g, o_e) and torch.equal(s_g, s_e)
        assert torch.equal(o_pg, o_pe) and torch.equal(pool_static["state"], pool_before)


def _prefill(d, **attrs):
    return torch.ops.gdn.prefill(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], d["initial_state"],
                                 d.get("A_log"), d.get("dt_bias"), **attrs)


def test_prefill_availability_reported(kernels):
    if kernels.HAS_PREFILL:
        assert kernels.PREFILL_UNAVAILABLE_REASON == ""
    else:
        assert "not built" in kernels.PREFILL_UNAVAILABLE_REASON


def test_prefill_then_decode_equals_longer_prefill(kernels, gen):
    """prefill(K tokens) then M decode steps == prefill(K + M tokens), per sequence (CUDA kernels)."""
    if not kernels.HAS_PREFILL:
        pytest.skip(f"prefill kernel unavailable: {kernels.PREFILL_UNAVAILABLE_REASON}")
    Kt, M, Hk, Hv, K, V = 70, 5, 2, 4, 128, 128
    seqlens = [Kt + M, Kt + M]
    d = _cuda(make_prefill_inputs(gen, seqlens, Hk=Hk, Hv=Hv, K=K, V=V, use_qk_l2norm=1), torch.float32)
    attrs = dict(use_qk_l2norm=1)
    o_full, s_full = _prefill(d, **attrs)
    idx = torch.tensor([t for n in range(2) for t in range(n * (Kt + M), n * (Kt + M) + Kt)], device="cuda")
    short = {n: (d[n].index_select(0, idx) if n in ("q", "k", "v", "g", "beta") else d[n]) for n in d}
    short["cu_seqlens"] = torch.tensor([0, Kt, 2 * Kt], dtype=torch.int32, device="cuda")
    o_pre, state = _prefill(short, **attrs)
    outs = []
    for m in range(M):
        rows = torch.tensor([n * (Kt + M) + Kt + m for n in range(2)], device="cuda")
        step = {n: d[n].index_select(0, rows) for n in ("q", "k", "v", "g", "beta")}
        o_m, state = _decode({**step, "state": state}, **attrs)
        outs.append(o_m)
    assert rel_err(o_pre, o_full.index_select(0, idx)) <= 1e-4
    tail = torch.stack(outs, 1).reshape(-1, Hv, V)
    tail_idx = torch.tensor([n * (Kt + M) + Kt + m for n in range(2) for m in range(M)], device="cuda")
    assert rel_err(tail, o_full.index_select(0, tail_idx)) <= 1e-4
    assert rel_err(state, s_full) <= 1e-4
    ro, rs = call_prefill_ref(_f64(d), **attrs)
    assert rel_err(o_full, ro) <= 1e-4 and rel_err(s_full, rs) <= 1e-4
