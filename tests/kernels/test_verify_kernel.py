"""CUDA verify / commit kernels (gdnVerify.cu through ctypes and the torch ops) against the float64 reference.

Fresh random inputs every check; outputs poisoned with NaN before a launch; the reference sees the values the
kernel sees (low-precision inputs upcast to float64). For every accept count 0..T_n the committed state is
compared with the float64 token-by-token recurrence; pool rows no sequence owns must keep their bits.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from conftest import make_prefill_inputs, rel_err
from gdn_deploy.reference import commit_ref, verify_ref
from gdn_deploy.spec import SPEC

from ._gpu_util import DT, op_attrs, to_device

STATE_TOL = 1e-4
ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "slots", "A_log", "dt_bias")


def _inputs(gen, lens, *, Hk, Hv, K, V, gate_mode, l2, pool):
    kw = {"beta_range": (0.0, 2.0)} if gate_mode == 0 else {}
    d = make_prefill_inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, use_qk_l2norm=l2, **kw)
    dense = d.pop("initial_state")
    if pool is None:
        d["state"] = dense
    else:
        slots = torch.randperm(pool, generator=gen)[:len(lens)].to(torch.int32)
        p = 0.5 * torch.randn(pool, Hv, K, V, generator=gen, dtype=torch.float64)
        p[slots.long()] = dense
        d["state"], d["slots"] = p, slots
    return d


def _verify(kernels, dev, attrs, state_mode, cu=None):
    from gdn_deploy.kernels import speculative as sp
    cu = dev["cu_seqlens"] if cu is None else cu
    o = torch.full_like(dev["v"], float("nan"))
    ck = torch.full(dev["k"].shape, float("nan"), device="cuda")
    cd = torch.full(dev["v"].shape, float("nan"), device="cuda")
    cg = torch.full(dev["g"].shape, float("nan"), device="cuda")
    p = sp.verify_params(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], cu, dev["state"], dev.get("slots"),
                         dev.get("A_log"), dev.get("dt_bias"), o, ck, cd, cg, state_mode=state_mode, **attrs)
    sp.launch_verify(kernels.LIB, p, o.device)
    torch.cuda.synchronize()
    return o, ck, cd, cg


def _commit(kernels, state, ck, cd, cg, cu, acc, slots, state_mode):
    from gdn_deploy.kernels import speculative as sp
    p = sp.commit_params(state, ck, cd, cg, cu, acc, slots, state_mode=state_mode)
    sp.launch_commit(kernels.LIB, p, state.device)
    torch.cuda.synchronize()


def _ref(ref, attrs, state_mode, cu=None):
    return verify_ref(*(ref.get(n) if n != "cu_seqlens" or cu is None else cu for n in ORDER),
                      state_mode=state_mode, **attrs)


CASES = [  # (Hk, Hv, K, V, gate_mode, use_qk_l2norm, pool)
    (2, 4, 128, 128, 0, 1, None), (2, 4, 128, 128, 1, 1, 7), (1, 3, 64, 128, 0, 0, 6), (2, 2, 256, 64, 1, 1, None),
    (1, 4, 128, 256, 1, 0, 8),
]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("Hk,Hv,K,V,gate_mode,l2,pool", CASES)
def test_verify_and_every_accept_count(kernels, gen, dt, Hk, Hv, K, V, gate_mode, l2, pool):
    lens = [1, 4, 0, 16, 3]
    sm = 0 if pool is None else 1
    attrs = op_attrs(gate_mode, l2, scale=0.0 if Hv % 3 else 0.3)
    inp = _inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, l2=l2, pool=pool)
    dev, ref = to_device(inp, DT[dt], DT[dt])
    before = dev["state"].clone()
    o, ck, cd, cg = _verify(kernels, dev, attrs, sm)
    assert torch.equal(dev["state"], before)  # verify only reads
    o64, ck64, cd64, cg64 = _ref(ref, attrs, sm)
    tol = SPEC.kernel_tolerance({"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dt])
    assert not o.isnan().any() and not cd.isnan().any() and not ck.isnan().any() and not cg.isnan().any()
    assert rel_err(o, o64) < tol
    assert rel_err(ck, ck64) < STATE_TOL and rel_err(cd, cd64) < STATE_TOL and rel_err(cg, cg64) < 1e-6
    slots = dev.get("slots")
    for j in range(max(lens) + 1):
        acc = torch.tensor([min(j, L) for L in lens], dtype=torch.int32, device="cuda")
        want = commit_ref(ref["state"], ck64, cd64, cg64, ref["cu_seqlens"], acc, ref.get("slots"), state_mode=sm)
        got = before.clone()
        _commit(kernels, got, ck, cd, cg, dev["cu_seqlens"], acc, slots, sm)
        for n, L in enumerate(lens):
            row = n if slots is None else int(slots[n])
            if min(j, L) == 0:
                assert torch.equal(got[row], before[row]), (n, j)
            else:
                assert rel_err(got[row], want[row]) < STATE_TOL, (n, j)
        if slots is not None:
            others = sorted(set(range(pool)) - set(slots.tolist()))
            assert torch.equal(got[others], before[others])


def test_ops_dispatch_and_decode_is_the_one_token_case(kernels, gen):
    inp = _inputs(gen, [1, 1, 1], Hk=2, Hv=4, K=128, V=128, gate_mode=1, l2=1, pool=5)
    dev, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(1, 1)
    o, ck, cd, cg = torch.ops.gdn.verify(*(dev.get(n) for n in ORDER), state_mode=1, **attrs)
    pool = dev["state"].clone()
    acc = torch.ones(3, dtype=torch.int32, device="cuda")
    fresh = torch.ops.gdn.commit(pool, ck, cd, cg, dev["cu_seqlens"], acc, dev["slots"], state_mode=1)
    assert torch.equal(pool, dev["state"])
    torch.ops.gdn.commit_(pool, ck, cd, cg, dev["cu_seqlens"], acc, dev["slots"], state_mode=1)
    assert torch.equal(pool, fresh)
    dpool = dev["state"].clone()
    od = torch.ops.gdn.decode_pool_(dev["q"], dev["k"], dev["v"], dev["g"], dev["beta"], dpool, dev["slots"],
                                    dev["A_log"], dev["dt_bias"], **attrs)
    assert rel_err(o, od) < 1e-2 and rel_err(pool, dpool) < STATE_TOL


def test_garbage_slots_counts_and_offsets_stay_in_bounds(kernels, gen):
    lens = [3, 2, 4]
    inp = _inputs(gen, lens, Hk=2, Hv=4, K=128, V=128, gate_mode=0, l2=1, pool=6)
    dev, ref = to_device(inp, torch.float32, torch.float32)
    dev["slots"][1] = 1000           # outside the pool: skipped like -1
    attrs = op_attrs(0, 1)
    before = dev["state"].clone()
    o, ck, cd, cg = _verify(kernels, dev, attrs, 1)
    s1 = slice(3, 5)
    assert (o[s1] == 0).all() and (cd[s1] == 0).all() and (ck[s1] == 0).all() and (cg[s1] == 0).all()
    ref_slots = ref["slots"].clone()
    ref_slots[1] = -1
    ref["slots"] = ref_slots
    o64 = _ref(ref, attrs, 1)[0]
    assert rel_err(o, o64) < 1e-4
    acc = torch.tensor([-3, 2, 99], dtype=torch.int32, device="cuda")   # clamped to [0, T_n]
    got = before.clone()
    _commit(kernels, got, ck, cd, cg, dev["cu_seqlens"], acc, dev["slots"], 1)
    want = commit_ref(ref["state"], *(t.double() for t in (ck, cd, cg)), ref["cu_seqlens"],
                      torch.tensor([0, 0, 4], dtype=torch.int32, device="cuda"), ref_slots, state_mode=1, check_values=False)
    assert rel_err(got, want) < STATE_TOL
    s0 = int(dev["slots"][0])
    assert torch.equal(got[s0], before[s0])
    # offsets: negative start, end past T and a run longer than max_draft_tokens are clamped on the device
    T = 20
    inp = _inputs(gen, [T], Hk=2, Hv=4, K=128, V=128, gate_mode=0, l2=1, pool=None)
    dev, ref = to_device(inp, torch.float32, torch.float32)
    bad = torch.tensor([-7, 1 << 30], dtype=torch.int32, device="cuda")
    o, ck, cd, cg = _verify(kernels, dev, attrs, 0, cu=bad)
    M = SPEC.max_draft_tokens
    o64 = _ref({n: (t[:M] if n in ("q", "k", "v", "g", "beta") else t) for n, t in ref.items()}, attrs, 0,
               cu=torch.tensor([0, M], dtype=torch.int32, device="cuda"))[0]
    assert rel_err(o[:M], o64) < 1e-4
    got = dev["state"].clone()
    _commit(kernels, got, ck, cd, cg, bad, torch.tensor([T], dtype=torch.int32, device="cuda"), None, 0)
    want = commit_ref(ref["state"], *(t[:M].double() for t in (ck, cd, cg)), torch.tensor([0, M], dtype=torch.int32, device="cuda"),
                      torch.tensor([M], dtype=torch.int32, device="cuda"))
    assert rel_err(got, want) < STATE_TOL


def test_cuda_graph_replay(kernels, gen):
    lens = [2, 5, 1]
    attrs = op_attrs(1, 1)
    inp = _inputs(gen, lens, Hk=2, Hv=4, K=128, V=128, gate_mode=1, l2=1, pool=5)
    dev, _ = to_device(inp, torch.float16, torch.float32)
    acc = torch.tensor([1, 5, 0], dtype=torch.int32, device="cuda")
    static = {n: t.clone() for n, t in dev.items()}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        torch.ops.gdn.verify(*(static.get(n) for n in ORDER), state_mode=1, **attrs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.gdn.verify(*(static.get(n) for n in ORDER), state_mode=1, **attrs)
        torch.ops.gdn.commit_(static["state"], *out[1:], static["cu_seqlens"], acc, static["slots"], state_mode=1)
    for _ in range(2):
        fresh = _inputs(gen, lens, Hk=2, Hv=4, K=128, V=128, gate_mode=1, l2=1, pool=5)
        fresh["slots"] = inp["slots"]
        d2, r2 = to_device(fresh, torch.float16, torch.float32)
        for n in static:
            static[n].copy_(d2[n])
        graph.replay()
        torch.cuda.synchronize()
        o64, ck64, cd64, cg64 = verify_ref(*(r2.get(n) for n in ORDER), state_mode=1, **attrs)
        assert rel_err(out[0], o64) < 1e-2
        want = commit_ref(r2["state"], ck64, cd64, cg64, r2["cu_seqlens"], acc, r2["slots"], state_mode=1)
        assert rel_err(static["state"], want) < STATE_TOL


def test_struct_layouts_match_compiler(kernels):
    from gdn_deploy.kernels import library
    for which, cls in ((2, library.GdnVerifyParams), (3, library.GdnCommitParams)):
        buf = (ctypes.c_size_t * 64)()
        n = kernels.LIB.gdnParamsLayoutC(which, buf, 64)
        assert list(buf[:n]) == [ctypes.sizeof(cls)] + [getattr(cls, f).offset for f, _ in cls._fields_]
