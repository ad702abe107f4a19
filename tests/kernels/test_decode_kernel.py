"""CUDA decode kernel (launchGdnDecode through ctypes) against the float64 reference.

Every check draws fresh random inputs, poisons the outputs with NaN before the launch and
checks that every element was written; the reference sees exactly the values the kernel sees
(the low-precision inputs upcast to float64).
"""
from __future__ import annotations

import pytest
import torch

from conftest import call_decode_ref, make_decode_inputs, rel_err
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, op_attrs, to_device

STATE_TOL = 1e-4  # the state is float32 arithmetic from the same inputs whatever the I/O dtype


def _run(kernels, d, attrs, state_mode, *, bv=0, inplace=False):
    """Launch the kernel on poisoned outputs; returns (o, state_after)."""
    o = torch.full_like(d["v"], float("nan"))
    if state_mode == 1 or inplace:
        s_in = s_out = d["state"]
    else:
        s_in, s_out = d["state"], torch.full_like(d["state"], float("nan"))
    p = kernels.launch.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], s_in, s_out, o, d.get("slots"),
                                     d.get("A_log"), d.get("dt_bias"), state_mode=state_mode, **attrs)
    kernels.launch.launch_decode(kernels.LIB, p, d["q"].device, bv)
    torch.cuda.synchronize()
    return o, s_out


def _check(o, s, ref_inp, attrs, state_mode, io_dtype):
    ro, rs = call_decode_ref(ref_inp, state_mode=state_mode, **attrs)
    assert not torch.isnan(o).any(), "o has unwritten (NaN-poisoned) elements"
    assert not torch.isnan(s).any(), "state has unwritten (NaN-poisoned) elements"
    eo, es = rel_err(o, ro), rel_err(s, rs)
    assert eo <= tolerance_for(io_dtype), f"o rel err {eo:.3e}"
    assert es <= STATE_TOL, f"state rel err {es:.3e}"
    return eo, es


@pytest.mark.parametrize("K,V", [(64, 64), (128, 128), (256, 256), (64, 128), (256, 64)])
@pytest.mark.parametrize("io", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("l2", [0, 1])
def test_head_dims_and_io_dtypes(kernels, gen, K, V, io, l2):
    inp = make_decode_inputs(gen, 3, Hk=2, Hv=4, K=K, V=V, use_qk_l2norm=l2)
    d, r = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(0, l2)
    o, s = _run(kernels, d, attrs, 0)
    _check(o, s, r, attrs, 0, DT[io])


@pytest.mark.parametrize("io", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("gate", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("gate_mode", [0, 1])
def test_gate_dtypes_and_modes(kernels, gen, io, gate, gate_mode):
    inp = make_decode_inputs(gen, 4, Hk=2, Hv=4, K=128, V=128, gate_mode=gate_mode, use_qk_l2norm=1)
    d, r = to_device(inp, DT[io], DT[gate])
    attrs = op_attrs(gate_mode, 1, scale=0.3)
    o, s = _run(kernels, d, attrs, 0)
    _check(o, s, r, attrs, 0, DT[io])


@pytest.mark.parametrize("Hk,Hv", [(4, 4), (2, 4), (2, 8)])  # GVA 1, 2, 4
@pytest.mark.parametrize("bv", [8, 16, 32, 64, 0])                 # every V-tile, and the automatic choice
def test_gva_and_tiles(kernels, gen, Hk, Hv, bv):
    inp = make_decode_inputs(gen, 5, Hk=Hk, Hv=Hv, K=128, V=128, use_qk_l2norm=1)
    d, r = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    o, s = _run(kernels, d, attrs, 0, bv=bv)
    _check(o, s, r, attrs, 0, torch.bfloat16)


@pytest.mark.parametrize("case", ["decay_near_1_beta_near_1", "decay_near_0_beta_near_0", "mixed_extremes"])
def test_gates_near_0_and_1(kernels, gen, case):
    kw = {"decay_near_1_beta_near_1": dict(g_range=(-1e-4, 0.0), beta_range=(0.999, 1.0)),
          "decay_near_0_beta_near_0": dict(g_range=(-20.0, -10.0), beta_range=(0.0, 1e-3)),
          "mixed_extremes": dict(g_range=(-20.0, 0.0), beta_range=(0.0, 1.0))}[case]
    inp = make_decode_inputs(gen, 4, Hk=2, Hv=4, K=64, V=64, use_qk_l2norm=1, **kw)
    d, r = to_device(inp, torch.float32, torch.float32)
    attrs = op_attrs(0, 1)
    o, s = _run(kernels, d, attrs, 0)
    _check(o, s, r, attrs, 0, torch.float32)


def test_raw_gates_extreme(kernels, gen):
    """gate_mode 1 with |a|, |b| large: softplus' linear branch (> 20) and sigmoid saturation."""
    inp = make_decode_inputs(gen, 4, Hk=2, Hv=4, K=64, V=64, gate_mode=1, use_qk_l2norm=1)
    inp["g"] = inp["g"] * 30.0
    inp["beta"] = inp["beta"] * 30.0
    inp["A_log"] = inp["A_log"] - 3.0  # keep exp(A_log) * a in a range where the decay is not all 0
    d, r = to_device(inp, torch.float32, torch.float32)
    attrs = op_attrs(1, 1)
    o, s = _run(kernels, d, attrs, 0)
    _check(o, s, r, attrs, 0, torch.float32)


@pytest.mark.parametrize("io", ["f32", "bf16"])
def test_pool_in_place_and_skipped_slots(kernels, gen, io):
    B, P = 6, 11
    inp = make_decode_inputs(gen, B, Hk=2, Hv=4, K=128, V=64, use_qk_l2norm=1, pool_size=P)
    inp["slots"][1] = -1
    inp["slots"][4] = -1
    d, r = to_device(inp, DT[io], torch.float32)
    before = d["state"].clone()
    ptr = d["state"].data_ptr()
    attrs = op_attrs(0, 1)
    o, pool = _run(kernels, d, attrs, 1)
    assert pool.data_ptr() == ptr
    slots = inp["slots"].tolist()
    used = [s for s in slots if s >= 0]
    untouched = [i for i in range(P) if i not in used]
    assert torch.equal(pool[untouched].view(torch.int32), before[untouched].view(torch.int32)), \
        "pool rows without a sequence changed"
    for b, s in enumerate(slots):
        if s < 0:
            assert torch.equal(o[b], torch.zeros_like(o[b])), "o of a skipped sequence (slot -1) is not 0"
    _check(o, pool, r, attrs, 1, DT[io])


def test_all_slots_skipped_leaves_pool_bit_identical(kernels, gen):
    inp = make_decode_inputs(gen, 3, Hk=2, Hv=2, K=64, V=64, pool_size=4)
    inp["slots"][:] = -1
    d, _ = to_device(inp, torch.float16, torch.float16)
    before = d["state"].clone()
    o, pool = _run(kernels, d, op_attrs(0, 0), 1)
    assert torch.equal(pool.view(torch.int32), before.view(torch.int32))
    assert torch.equal(o, torch.zeros_like(o))


def test_dense_in_place_alias(kernels, gen):
    """stateOut == stateIn (allowed by the API) gives the same result as separate buffers."""
    inp = make_decode_inputs(gen, 3, Hk=2, Hv=4, K=256, V=128, use_qk_l2norm=1)
    d, r = to_device(inp, torch.bfloat16, torch.bfloat16)
    attrs = op_attrs(0, 1)
    o1, s1 = _run(kernels, d, attrs, 0)
    o2, s2 = _run(kernels, d, attrs, 0, inplace=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    _check(o2, s2, r, attrs, 0, torch.bfloat16)


def test_large_batch(kernels, gen):
    inp = make_decode_inputs(gen, 300, Hk=2, Hv=4, K=128, V=128, use_qk_l2norm=1)
    d, r = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    o, s = _run(kernels, d, attrs, 0)
    _check(o, s, r, attrs, 0, torch.bfloat16)


def test_many_steps_accumulate(kernels, gen):
    """60 chained decode steps (fp32 I/O) stay within the fp32 bound of the float64 recurrence."""
    d_state = None
    ref_state = None
    for step in range(60):
        inp = make_decode_inputs(gen, 2, Hk=1, Hv=2, K=64, V=64, use_qk_l2norm=1)
        if step == 0:
            d_state = inp["state"].to(torch.float32).cuda()
            ref_state = d_state.double()
        d, r = to_device(inp, torch.float32, torch.float32)
        d["state"], r["state"] = d_state, ref_state
        attrs = op_attrs(0, 1)
        o, d_state = _run(kernels, d, attrs, 0)
        ro, ref_state = call_decode_ref(r, state_mode=0, **attrs)
        assert rel_err(o, ro) <= 1e-4, f"step {step}: o rel err {rel_err(o, ro):.3e}"
    assert rel_err(d_state, ref_state) <= 1e-4


def test_empty_batch_is_a_no_op(kernels, gen):
    inp = make_decode_inputs(gen, 1, Hk=2, Hv=2, K=64, V=64)
    d, _ = to_device(inp, torch.float32, torch.float32)
    d = {n: (t[:0] if n in ("q", "k", "v", "g", "beta", "state") else t) for n, t in d.items()}
    o, s = _run(kernels, d, op_attrs(0, 0), 0)
    assert o.shape[0] == 0 and s.shape[0] == 0


@pytest.mark.parametrize("K,V", [(32, 64), (64, 96), (512, 64)])
def test_unsupported_head_dims_rejected(kernels, gen, K, V):
    inp = make_decode_inputs(gen, 2, Hk=1, Hv=1, K=K, V=V)
    d, _ = to_device(inp, torch.float32, torch.float32)
    with pytest.raises(ValueError, match="head dims"):
        _run(kernels, d, op_attrs(0, 0), 0)
