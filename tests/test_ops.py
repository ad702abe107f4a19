"""The torch.library ops (gdn_deploy.ops): opcheck, agreement with the reference, in-place pool update,
fake implementations under FakeTensorMode, and torch.export with dynamic sizes."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gdn_deploy.ops  # noqa: F401  (registers torch.ops.gdn.*)
from conftest import call_decode_ref, call_prefill_ref, cast_inputs, make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.spec import ContractError, SPEC

F32_TOL = SPEC.kernel_tolerance("float32")
P_ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
D_ORDER = ("q", "k", "v", "g", "beta", "state", "A_log", "dt_bias")
POOL_ORDER = ("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias")


def args_of(inp, order):
    return tuple(inp.get(n) for n in order)


def prefill32(gen, lens=(5, 0, 70), gate_mode=0, **kw):
    return cast_inputs(make_prefill_inputs(gen, list(lens), gate_mode=gate_mode, **kw), torch.float32)


def decode32(gen, B=3, gate_mode=0, **kw):
    return cast_inputs(make_decode_inputs(gen, B, gate_mode=gate_mode, **kw), torch.float32)


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_opcheck_prefill(gen, gate_mode):
    inp = prefill32(gen, lens=(3, 0, 6), gate_mode=gate_mode, use_qk_l2norm=1)
    torch.library.opcheck(torch.ops.gdn.prefill.default, args_of(inp, P_ORDER),
                          dict(gate_mode=gate_mode, use_qk_l2norm=1, scale=0.3))


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_opcheck_decode(gen, gate_mode):
    inp = decode32(gen, gate_mode=gate_mode)
    torch.library.opcheck(torch.ops.gdn.decode.default, args_of(inp, D_ORDER), dict(gate_mode=gate_mode))


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_opcheck_decode_pool(gen, gate_mode):
    inp = decode32(gen, B=3, gate_mode=gate_mode, pool_size=6)
    inp["slots"] = torch.tensor([4, -1, 1], dtype=torch.int32)
    torch.library.opcheck(torch.ops.gdn.decode_pool_.default, args_of(inp, POOL_ORDER), dict(gate_mode=gate_mode))


@pytest.mark.parametrize("gate_mode,use_qk_l2norm,scale", [(0, 0, 0.0), (1, 1, 0.25)])
def test_prefill_op_equals_reference(gen, gate_mode, use_qk_l2norm, scale):
    inp64 = make_prefill_inputs(gen, [5, 0, 70], Hk=2, Hv=6, K=16, V=8, gate_mode=gate_mode,
                                use_qk_l2norm=use_qk_l2norm)
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale)
    o, s = torch.ops.gdn.prefill(*args_of(cast_inputs(inp64, torch.float32), P_ORDER), **attrs)
    o_ref, s_ref = call_prefill_ref(inp64, **attrs)
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    assert rel_err(o, o_ref) < F32_TOL and rel_err(s, s_ref) < F32_TOL


def test_prefill_op_half_io(gen):
    inp = cast_inputs(make_prefill_inputs(gen, [9, 3], use_qk_l2norm=1), torch.bfloat16)
    o, s = torch.ops.gdn.prefill(*args_of(inp, P_ORDER), use_qk_l2norm=1)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_decode_op_equals_reference(gen, gate_mode):
    inp64 = make_decode_inputs(gen, 4, Hk=1, Hv=3, K=16, V=8, gate_mode=gate_mode, use_qk_l2norm=1)
    inp = cast_inputs(inp64, torch.float32)
    state_before = inp["state"].clone()
    o, s = torch.ops.gdn.decode(*args_of(inp, D_ORDER), gate_mode=gate_mode, use_qk_l2norm=1)
    assert torch.equal(inp["state"], state_before), "gdn::decode must not modify its state input"
    o_ref, s_ref = call_decode_ref(inp64, gate_mode=gate_mode, use_qk_l2norm=1)
    assert rel_err(o, o_ref) < F32_TOL and rel_err(s, s_ref) < F32_TOL


def test_decode_pool_op_updates_in_place(gen):
    inp64 = make_decode_inputs(gen, 4, Hk=2, Hv=4, K=16, V=8, pool_size=8, use_qk_l2norm=1)
    inp64["slots"] = torch.tensor([6, -1, 0, 3], dtype=torch.int32)
    inp = cast_inputs(inp64, torch.float32)
    pool = inp["state"]
    before = pool.clone()
    o = torch.ops.gdn.decode_pool_(*args_of(inp, POOL_ORDER), use_qk_l2norm=1)
    o_ref, pool_ref = call_decode_ref(inp64, state_mode=1, use_qk_l2norm=1)
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert rel_err(o, o_ref) < F32_TOL
    assert rel_err(pool, pool_ref) < F32_TOL            # the caller's pool tensor itself was updated
    untouched = [r for r in range(8) if r not in (6, 0, 3)]
    assert torch.equal(pool[untouched], before[untouched])
    assert not torch.equal(pool[6], before[6])


def test_ops_raise_contract_errors(gen):
    inp = prefill32(gen)
    inp["g"] = inp["g"].abs() + 0.1                     # g > 0 in precomputed mode
    with pytest.raises(ContractError, match=r"\[gdn:gate_range\] g:"):
        torch.ops.gdn.prefill(*args_of(inp, P_ORDER))
    d = decode32(gen, B=2, pool_size=3)
    d["slots"] = torch.tensor([1, 1], dtype=torch.int32)
    with pytest.raises(ContractError, match="slots"):
        torch.ops.gdn.decode_pool_(*args_of(d, POOL_ORDER))


def test_fake_impls_give_shapes(gen):
    inp = prefill32(gen, lens=(4, 7), gate_mode=1)
    d = decode32(gen, B=3)
    p = decode32(gen, B=3, pool_size=5)
    short_h0 = inp["initial_state"][1:]
    with FakeTensorMode() as mode:
        fake = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
        o, s = torch.ops.gdn.prefill(*(fake(x) for x in args_of(inp, P_ORDER)), gate_mode=1)
        assert o.shape == inp["v"].shape and o.dtype == torch.float32
        assert s.shape == inp["initial_state"].shape and s.dtype == torch.float32
        o, s = torch.ops.gdn.decode(*(fake(x) for x in args_of(d, D_ORDER)))
        assert o.shape == d["v"].shape and s.shape == d["state"].shape
        o = torch.ops.gdn.decode_pool_(*(fake(x) for x in args_of(p, POOL_ORDER)))
        assert o.shape == p["v"].shape
        # shape errors surface at trace time
        with pytest.raises(ContractError, match="initial_state"):
            torch.ops.gdn.prefill(*(fake(x) for x in args_of(inp, P_ORDER)[:6]), fake(short_h0),
                                  fake(inp["A_log"]), fake(inp["dt_bias"]), gate_mode=1)


class PrefillThenDecode(torch.nn.Module):
    def forward(self, q, k, v, g, beta, cu_seqlens, h0, qd, kd, vd, gd, bd):
        o, s = torch.ops.gdn.prefill(q, k, v, g, beta, cu_seqlens, h0, use_qk_l2norm=1)
        od, s2 = torch.ops.gdn.decode(qd, kd, vd, gd, bd, s, use_qk_l2norm=1)
        return o, od, s2


def _export_inputs(gen, lens):
    inp = prefill32(gen, lens=lens, use_qk_l2norm=1)
    d = decode32(gen, B=len(lens), use_qk_l2norm=1)
    return args_of(inp, P_ORDER[:7]) + tuple(d[n] for n in ("q", "k", "v", "g", "beta"))


def test_torch_export_dynamic_tokens_and_sequences(gen):
    from torch.export import Dim
    T, N = Dim("tokens", min=1, max=4096), Dim("seqs", min=1, max=64)
    tok = {0: T}
    seq = {0: N}
    dyn = (tok, tok, tok, tok, tok, {0: N + 1}, seq, seq, seq, seq, seq, seq)
    ep = torch.export.export(PrefillThenDecode(), _export_inputs(gen, (5, 70)), dynamic_shapes=dyn)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "gdn.prefill.default" in targets and "gdn.decode.default" in targets, targets
    for lens in ((3,), (64, 1, 9)):                      # other T and N than traced
        args = _export_inputs(gen, lens)
        got = ep.module()(*args)
        want = PrefillThenDecode()(*args)
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a, b)
