"""Every combination of I/O dtype and gate (g, beta) dtypes through the torch ops on the GPU.

The contract gives g and beta one type G. The kernels read both with the type of g, so a beta of
another dtype used to be read as garbage (and could fault): mixed gate dtypes must now be refused
with the contract's one-line error before anything is launched, and every matched combination
must agree with the float64 reference; a refused pool decode leaves the pool untouched.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from conftest import make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.reference import decode_ref, prefill_ref
from gdn_deploy.spec import ContractError
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, to_device

COMBOS = list(itertools.product(DT, DT, DT))     # (io, g, beta)


@pytest.mark.parametrize("gate_mode", [0, 1])
@pytest.mark.parametrize("io,g,beta", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_prefill_gate_dtypes(kernels, gen, io, g, beta, gate_mode):
    inp = make_prefill_inputs(gen, [0, 1, 65, 300], Hk=2, Hv=4, K=128, V=128, gate_mode=gate_mode, use_qk_l2norm=1)
    d, r = to_device(inp, DT[io], DT[g], DT[beta])
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    args = [d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], d["initial_state"], d.get("A_log"),
            d.get("dt_bias")]
    if g != beta:
        with pytest.raises(ContractError, match=r"beta: dtype .* differs from g's"):
            torch.ops.gdn.prefill(*args, **attrs)
        return
    o, s = torch.ops.gdn.prefill(*args, **attrs)
    torch.cuda.synchronize()
    ro, rs = prefill_ref(r["q"], r["k"], r["v"], r["g"], r["beta"], r["cu_seqlens"], r["initial_state"],
                         r.get("A_log"), r.get("dt_bias"), form="chunked", **attrs)
    tol = tolerance_for(DT[io])
    assert o.dtype == DT[io] and s.dtype == torch.float32
    assert rel_err(o, ro) <= tol and rel_err(s, rs) <= tol, (rel_err(o, ro), rel_err(s, rs))


@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("io,g,beta", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_decode_gate_dtypes(kernels, gen, io, g, beta, pool):
    B, P = 5, 8
    inp = make_decode_inputs(gen, B, Hk=2, Hv=4, K=128, V=128, gate_mode=1, use_qk_l2norm=1,
                             pool_size=P if pool else None)
    if pool:
        inp["slots"][1] = -1
    d, r = to_device(inp, DT[io], DT[g], DT[beta])
    attrs = dict(gate_mode=1, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    state0 = d["state"].clone()
    if pool:
        call = lambda: torch.ops.gdn.decode_pool_(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"],  # noqa: E731
                                                   d["slots"], d["A_log"], d["dt_bias"], **attrs)
    else:
        call = lambda: torch.ops.gdn.decode(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"],  # noqa: E731
                                             d["A_log"], d["dt_bias"], **attrs)
    if g != beta:
        with pytest.raises(ContractError, match=r"beta: dtype .* differs from g's"):
            call()
        torch.cuda.synchronize()
        assert torch.equal(d["state"], state0), "a refused call must leave the state untouched"
        return
    out = call()
    torch.cuda.synchronize()
    ro, rs = decode_ref(r["q"], r["k"], r["v"], r["g"], r["beta"], r["state"], r.get("slots"), r["A_log"],
                        r["dt_bias"], state_mode=int(pool), **attrs)
    tol = tolerance_for(DT[io])
    if pool:
        o, s = out, d["state"]
    else:
        o, s = out
    assert rel_err(o, ro) <= tol and rel_err(s, rs) <= tol, (rel_err(o, ro), rel_err(s, rs))
