"""ONNX function bodies of GatedDeltaVerify / GatedDeltaCommit run by onnxruntime against the reference:
ragged draft lengths (0, 1, 16), dense and pool states (slot -1), both gate modes, GVA, out-of-range accept
counts clamped as the contract says, untouched pool rows bit-exact; schema inference of the outputs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from conftest import make_prefill_inputs, rel_err
from gdn_deploy.export.onnx_functions import add_function_bodies
from gdn_deploy.export.onnx_schemas import register_schemas
from gdn_deploy.reference import commit_ref, verify_ref
from gdn_deploy.spec import COMMIT, SPEC, VERIFY

ort = pytest.importorskip("onnxruntime")
ELEM = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16, torch.int32: TensorProto.INT32}
VERIFY_ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "slots", "A_log", "dt_bias")


def one_node(op, attrs, feeds: dict[str, torch.Tensor], out_elems: list[int]):
    names = op.input_names(op.attrs(**attrs))
    ins = [helper.make_tensor_value_info(n, ELEM[feeds[n].dtype], [None] * feeds[n].dim()) for n in names]
    outs = [helper.make_tensor_value_info(o.name, e, [None] * len(o.shape)) for o, e in zip(op.outputs, out_elems)]
    node = helper.make_node(op.name, names, [o.name for o in op.outputs], domain=SPEC.domain, **attrs)
    model = helper.make_model(helper.make_graph([node], "one", ins, outs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(SPEC.domain, 1)])
    add_function_bodies(model)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    res = sess.run(None, {n: feeds[n].numpy() for n in names})
    return [torch.from_numpy(np.asarray(r)) for r in res]


def inputs(gen, lens, *, Hk, Hv, gate_mode, pool, dtype=torch.float32):
    d = make_prefill_inputs(gen, lens, Hk=Hk, Hv=Hv, K=16, V=8, dtype=dtype, gate_mode=gate_mode, use_qk_l2norm=1,
                            **({"beta_range": (0.0, 2.0)} if gate_mode == 0 else {}))
    d["state"] = d.pop("initial_state").float()
    if pool:
        P = len(lens) + 3
        p = torch.randn(P, Hv, 16, 8, generator=gen)
        slots = torch.randperm(P, generator=gen)[:len(lens)].to(torch.int32)
        slots[1] = -1
        p[slots[slots >= 0].long()] = d["state"][slots >= 0]
        d["state"], d["slots"] = p, slots
    return d


@pytest.mark.parametrize("gate_mode,pool,Hk,Hv", [(0, False, 2, 4), (1, True, 1, 2), (1, False, 2, 2), (0, True, 2, 6)])
def test_verify_and_commit_bodies_match_reference(gen, gate_mode, pool, Hk, Hv):
    lens = [3, 1, 0, 16, 2]
    d = inputs(gen, lens, Hk=Hk, Hv=Hv, gate_mode=gate_mode, pool=pool)
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=1, state_mode=int(pool))
    ref = verify_ref(*(d.get(n) for n in VERIFY_ORDER), **attrs)
    got = one_node(VERIFY, attrs, d, [TensorProto.FLOAT] * 4)
    for name, a, b in zip(VERIFY.output_names(), got, ref):
        assert a.shape == b.shape, name
        assert rel_err(a, b) < 1e-5, (name, rel_err(a, b))
    o_c, ck, cd, cg = ref
    N = len(lens)
    for acc in ([0] * N, lens, [2, 1, 0, 7, 1], [-5, 9, 3, 40, -(2 ** 31)]):   # the last one is clamped
        accepted = torch.tensor(acc, dtype=torch.int32)
        feeds = dict(state=d["state"], commit_k=ck, commit_delta=cd, commit_g=cg, cu_seqlens=d["cu_seqlens"],
                     accepted=accepted)
        if pool:
            feeds["slots"] = d["slots"]
        want = commit_ref(*(feeds.get(n) for n in ("state", "commit_k", "commit_delta", "commit_g", "cu_seqlens",
                                                   "accepted", "slots")), state_mode=int(pool), check_values=False)
        (new,) = one_node(COMMIT, dict(state_mode=int(pool)), feeds, [TensorProto.FLOAT])
        assert rel_err(new, want) < 1e-5, acc
        clamped = [min(max(a, 0), L) for a, L in zip(acc, lens)]
        for n, j in enumerate(clamped):   # rows with nothing to land keep their bits
            row = n if not pool else int(d["slots"][n])
            if j == 0 and row >= 0:
                assert torch.equal(new[row], d["state"][row])
        if pool:
            others = sorted(set(range(d["state"].shape[0])) - set(d["slots"][d["slots"] >= 0].tolist()))
            assert torch.equal(new[others], d["state"][others])


def test_verify_fp16_io(gen):
    d = inputs(gen, [2, 5], Hk=2, Hv=4, gate_mode=1, pool=False, dtype=torch.float16)
    d["A_log"], d["dt_bias"] = d["A_log"].float(), d["dt_bias"].float()
    attrs = dict(gate_mode=1, use_qk_l2norm=1)
    ref = verify_ref(*(d.get(n) for n in VERIFY_ORDER), **attrs, compute_dtype=torch.float64)
    got = one_node(VERIFY, attrs, d, [TensorProto.FLOAT16] + [TensorProto.FLOAT] * 3)
    assert got[0].dtype == torch.float16
    for a, b in zip(got, ref):
        assert rel_err(a, b) < SPEC.kernel_tolerance("float16")


def test_schema_inference_of_speculative_ops():
    register_schemas()
    vi = helper.make_tensor_value_info
    ins = [vi("q", TensorProto.FLOAT16, ["T", 2, 16]), vi("k", TensorProto.FLOAT16, ["T", 2, 16]),
           vi("v", TensorProto.FLOAT16, ["T", 4, 8]), vi("g", TensorProto.FLOAT, ["T", 4]),
           vi("beta", TensorProto.FLOAT, ["T", 4]), vi("cu", TensorProto.INT32, ["N1"]),
           vi("state", TensorProto.FLOAT, ["N", 4, 16, 8])]
    node = helper.make_node("GatedDeltaVerify", [i.name for i in ins], ["o", "ck", "cd", "cg"], domain="gdn")
    node2 = helper.make_node("GatedDeltaCommit", ["state", "ck", "cd", "cg", "cu", "acc"], ["new"], domain="gdn")
    g = helper.make_graph([node, node2], "g", ins + [vi("acc", TensorProto.INT32, ["N"])], [vi("new", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("gdn", 1)])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    assert types["o"].elem_type == TensorProto.FLOAT16
    assert [d.dim_param or d.dim_value for d in types["ck"].shape.dim] == ["T", 2, 16]
    assert [d.dim_param or d.dim_value for d in types["cd"].shape.dim] == ["T", 4, 8]
    assert types["cg"].elem_type == TensorProto.FLOAT


def test_all_empty_drafts(gen):
    d = inputs(gen, [0, 0], Hk=1, Hv=2, gate_mode=0, pool=False)
    attrs = dict(use_qk_l2norm=1)
    got = one_node(VERIFY, attrs, d, [TensorProto.FLOAT] * 4)
    assert [tuple(x.shape) for x in got] == [(0, 2, 8), (0, 1, 16), (0, 2, 8), (0, 2)]
    feeds = dict(state=d["state"], commit_k=got[1], commit_delta=got[2], commit_g=got[3], cu_seqlens=d["cu_seqlens"],
                 accepted=torch.tensor([3, -1], dtype=torch.int32))
    (new,) = one_node(COMMIT, {}, feeds, [TensorProto.FLOAT])
    assert torch.equal(new, d["state"])


def test_garbage_slots_touch_nothing(gen):
    """Slots outside [-1, P-1] (the contract forbids them; the body must stay in bounds anyway) act as -1."""
    d = inputs(gen, [2, 3, 1], Hk=1, Hv=2, gate_mode=0, pool=True)
    P = d["state"].shape[0]
    good = int(d["slots"][0])
    d["slots"] = torch.tensor([good, P + 3, -7], dtype=torch.int32)
    attrs = dict(use_qk_l2norm=1, state_mode=1)
    o, ck, cd, cg = one_node(VERIFY, attrs, d, [TensorProto.FLOAT] * 4)
    assert torch.count_nonzero(o[2:]) == 0 and torch.count_nonzero(cd[2:]) == 0 and torch.count_nonzero(o[:2]) > 0
    feeds = dict(state=d["state"], commit_k=ck, commit_delta=cd, commit_g=cg, cu_seqlens=d["cu_seqlens"],
                 accepted=torch.tensor([2, 3, 1], dtype=torch.int32), slots=d["slots"])
    (new,) = one_node(COMMIT, {"state_mode": 1}, feeds, [TensorProto.FLOAT])
    others = [r for r in range(P) if r != good]
    assert torch.equal(new[others], d["state"][others]) and not torch.equal(new[good], d["state"][good])
