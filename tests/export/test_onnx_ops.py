"""gdn ONNX ops: schemas, translation to gdn nodes, function bodies run by onnxruntime == reference."""
from __future__ import annotations

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from onnx import TensorProto, helper  # noqa: E402

from conftest import (DECODE_ORDER, PREFILL_ORDER, DecodeOp, PrefillOp, call_decode_ref, call_prefill_ref,  # noqa: E402
                      single_node_model,
                      cast_inputs, make_decode_inputs, make_prefill_inputs, ordered_args,
                      ordered_dynamic_shapes, rel_err)
from gdn_deploy.export.onnx_functions import (decode_function_body, onnxruntime_has_linear_attention,  # noqa: E402
                                              overload_name)
from gdn_deploy.export.onnx_ops import (add_function_bodies, export_program, gdn_nodes,  # noqa: E402
                                        register_schemas, translation_table)
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import DECODE, PREFILL, SPEC  # noqa: E402

FP32_TOL = 1e-5
_needs_la = pytest.mark.skipif(not onnxruntime_has_linear_attention(),
                               reason="this onnxruntime has no com.microsoft::LinearAttention kernel")


# ---- schemas and translation table ------------------------------------------------------------------
def test_schemas_follow_spec_and_infer_shapes():
    register_schemas()
    register_schemas()   # idempotent
    for op in (PREFILL, DECODE):
        s = onnx.defs.get_schema(op.name, SPEC.opset_version, SPEC.domain)
        assert [i.name for i in s.inputs] == [t.name for t in op.inputs]
        assert [o.name for o in s.outputs] == op.output_names()
        assert s.min_input == len([t for t in op.inputs if t.present_if is None]) and s.max_input == len(op.inputs)
        for a in op.attributes:
            assert helper.get_attribute_value(s.attributes[a].default_value) == pytest.approx(op.defaults[a])
    # type/shape inference: o like v in q's dtype, final_state float [N,Hv,K,V]
    vi = helper.make_tensor_value_info
    ins = [vi("q", TensorProto.FLOAT16, ["T", 2, 16]), vi("k", TensorProto.FLOAT16, ["T", 2, 16]),
           vi("v", TensorProto.FLOAT16, ["T", 4, 8]), vi("g", TensorProto.FLOAT, ["T", 4]),
           vi("beta", TensorProto.FLOAT, ["T", 4]), vi("cu", TensorProto.INT32, ["N1"]),
           vi("h0", TensorProto.FLOAT, ["N", 4, 16, 8])]
    node = helper.make_node("GatedDeltaPrefill", [i.name for i in ins], ["o", "s"], domain="gdn")
    m = helper.make_model(helper.make_graph([node], "g", ins, []), ir_version=10,
                          opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("gdn", 1)])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    assert types["o"].elem_type == TensorProto.FLOAT16
    assert [d.dim_param or d.dim_value for d in types["o"].shape.dim] == ["T", 4, 8]
    assert types["s"].elem_type == TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in types["s"].shape.dim] == ["N", 4, 16, 8]
    # g and beta share the gate type G: a bf16 beta beside a float g is an inference error
    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    bad.graph.input[4].type.tensor_type.elem_type = TensorProto.BFLOAT16
    with pytest.raises(Exception, match="beta must have the dtype of g"):
        onnx.shape_inference.infer_shapes(bad, strict_mode=True)
    # gate_mode=1 needs A_log and dt_bias: 7 inputs is an inference error
    m.graph.node[0].attribute.append(helper.make_attribute("gate_mode", 1))
    with pytest.raises(Exception, match="need 9"):
        onnx.shape_inference.infer_shapes(m, strict_mode=True)


def test_translation_table_covers_ops():
    table = translation_table()
    for key in (torch.ops.gdn.prefill.default, torch.ops.gdn.decode.default, torch.ops.gdn.decode_pool_.default):
        assert callable(table[key])
    with pytest.raises(ValueError, match="interop"):
        translation_table(interop="tensorrt")


# ---- function bodies, op level (fast: no torch export) ------------------------------------------------
@pytest.mark.parametrize("body", ["chunked", "token"])
@pytest.mark.parametrize("gate_mode", [0, 1])
@pytest.mark.parametrize("use_qk_l2norm", [0, 1])
@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 4)], ids=["gva1", "gva2", "gva4"])
def test_prefill_body_varlen_matches_reference(gen, gate_mode, use_qk_l2norm, heads, body):
    Hk, Hv = heads
    seqlens = [0, 1, 37, 0, 33, 2]           # empty, single-token and multi-token sequences
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K=16, V=32, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm)
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm,
                          scale=0.3 if gate_mode else 0.0)
    o64, s64 = call_prefill_ref(inp, **attrs)
    model, feeds = single_node_model(PREFILL, attrs, cast_inputs(inp, torch.float32), torch.float32, body)
    assert model.graph.node[0].overload == overload_name(PREFILL, attrs)
    o, s = run_onnxruntime(model, feeds).values()
    assert o.dtype == torch.float32 and o.shape == o64.shape and s.shape == s64.shape
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
    # sequences of length 0 keep their initial state exactly
    assert torch.equal(s[0], feeds[6][0]) and torch.equal(s[3], feeds[6][3])


@pytest.mark.parametrize("body", ["chunked", "token"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_body_low_precision_io(gen, dtype, body):
    inp = cast_inputs(make_prefill_inputs(gen, [5, 0, 20], 1, 2, K=16, V=16, gate_mode=1, use_qk_l2norm=1), dtype)
    attrs = PREFILL.attrs(gate_mode=1, use_qk_l2norm=1)
    o_ref, s_ref = call_prefill_ref(cast_inputs(inp, torch.float64, torch.float64), **attrs)
    model, feeds = single_node_model(PREFILL, attrs, inp, dtype, body)
    o, s = run_onnxruntime(model, feeds).values()
    assert o.dtype == dtype and s.dtype == torch.float32
    tol = SPEC.kernel_tolerance(str(dtype).replace("torch.", ""))
    assert rel_err(o, o_ref) < tol and rel_err(s, s_ref) < FP32_TOL * 10


@pytest.mark.parametrize("body", ["chunked", "token"])
def test_prefill_body_no_sequences(gen, body):
    inp = cast_inputs(make_prefill_inputs(gen, [], 2, 2, K=8, V=8), torch.float32)
    model, feeds = single_node_model(PREFILL, PREFILL.attrs(), inp, torch.float32, body)
    o, s = run_onnxruntime(model, feeds).values()
    assert o.shape == (0, 2, 8) and s.shape == (0, 2, 8, 8)


DECODE_BODY_CASES = [("ops", False), pytest.param("linear_attention", False, marks=_needs_la),
                     pytest.param("linear_attention", True, marks=_needs_la)]


@pytest.mark.parametrize("pool", [False, True], ids=["dense", "pool"])
@pytest.mark.parametrize("gate_mode", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("decode_body,static", DECODE_BODY_CASES, ids=["ops", "la-folded", "la-heads"])
@pytest.mark.parametrize("use_qk_l2norm", [1, 0])
def test_decode_body_matches_reference(gen, pool, gate_mode, dtype, decode_body, static, use_qk_l2norm):
    inp = make_decode_inputs(gen, 5, 1, 2, K=16, V=8, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm,
                             pool_size=9 if pool else None)
    if pool:
        inp["slots"][1] = -1
        inp["slots"][4] = -1
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, state_mode=int(pool))
    io = cast_inputs(inp, dtype)
    o_ref, s_ref = call_decode_ref(cast_inputs(io, torch.float64, torch.float64), **attrs)
    model, feeds = single_node_model(DECODE, attrs, io, dtype, decode_body=decode_body, static_shapes=static)
    if not pool:    # the body asked for, with Hv as the op's heads when the state's shape is static
        want = ("_la2_hk1_k16" if static else "_la0") if decode_body == "linear_attention" else "_state0"
        assert model.graph.node[0].overload.endswith(want)
        assert decode_function_body(model) == decode_body
    before = [x.clone() for x in feeds]
    o, s = run_onnxruntime(model, feeds).values()
    assert all(torch.equal(a, b) for a, b in zip(before, feeds))       # the past state is read, not overwritten
    tol = FP32_TOL if dtype == torch.float32 else SPEC.kernel_tolerance(str(dtype).replace("torch.", ""))
    assert o.dtype == dtype and rel_err(o, o_ref) < tol and rel_err(s, s_ref) < FP32_TOL
    if pool:
        assert torch.count_nonzero(o[1]) == 0 and torch.count_nonzero(o[4]) == 0
        used = set(inp["slots"].tolist())
        for r in range(s.shape[0]):
            if r not in used:   # rows of no sequence (and of skipped ones) stay bit-identical
                assert torch.equal(s[r], io["state"][r])


@_needs_la
@pytest.mark.parametrize("gate_mode", [0, 1])
@pytest.mark.parametrize("use_qk_l2norm", [1, 0])
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_la_decode_body_static_equal_heads(gen, gate_mode, use_qk_l2norm, scale):
    """Static shapes with Hk = Hv: the LinearAttention decode body repeats no heads and computes no shapes (the
    default scale 1/sqrt(K) a constant), and still matches the float64 reference, with the default scale and a
    given one."""
    inp = make_decode_inputs(gen, 4, 2, 2, K=16, V=8, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm)
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale)
    io = cast_inputs(inp, torch.float32)
    o_ref, s_ref = call_decode_ref(cast_inputs(io, torch.float64, torch.float64), **attrs)
    model, feeds = single_node_model(DECODE, attrs, io, torch.float32, decode_body="linear_attention",
                                     static_shapes=True)
    assert model.graph.node[0].overload.endswith("_la2_hk2_k16")
    ops = {n.op_type for n in model.functions[0].node}
    assert "LinearAttention" in ops and not ops & {"Shape", "Expand", "Div"}, ops
    o, s = run_onnxruntime(model, feeds).values()
    assert rel_err(o, o_ref) < FP32_TOL and rel_err(s, s_ref) < FP32_TOL


def test_add_function_bodies_idempotent_and_checks_inputs(gen):
    inp = cast_inputs(make_decode_inputs(gen, 2, 1, 1, K=8, V=8), torch.float32)
    model, _ = single_node_model(DECODE, DECODE.attrs(), inp, torch.float32, decode_body="ops")
    add_function_bodies(model, decode_body="ops")
    assert [(f.name, f.overload) for f in model.functions] == [("GatedDeltaDecode", "gate0_l2norm0_state0")]
    with pytest.raises(ValueError, match="decode_body"):
        add_function_bodies(model, decode_body="fused")
    del model.graph.node[0].input[-1]
    with pytest.raises(ValueError, match="expected 6"):
        add_function_bodies(model)


# ---- torch export end to end ------------------------------------------------------------------------
class _DecodePool(torch.nn.Module):
    def __init__(self, return_pool=True):
        super().__init__()
        self.return_pool = return_pool

    def forward(self, q, k, v, g, beta, pool, slots, A_log, dt_bias):
        o = torch.ops.gdn.decode_pool_(q, k, v, g, beta, pool, slots, A_log, dt_bias, gate_mode=1, use_qk_l2norm=1)
        return (o, pool) if self.return_pool else o


@pytest.fixture(scope="module")
def prefill_decode_models(tmp_path_factory):
    """A raw-gate GVA-2 prefill and a dense decode graph exported once (dynamic T, N, B)."""
    gen = torch.Generator().manual_seed(1)
    d = tmp_path_factory.mktemp("onnx_ops")
    attrs = dict(gate_mode=1, use_qk_l2norm=1)
    inp = cast_inputs(make_prefill_inputs(gen, [3, 5], 1, 2, K=16, V=16, **attrs), torch.float32)
    dims = dict(q="T", k="T", v="T", g="T", beta="T", cu_seqlens="N1", initial_state="N")
    pre = export_program(PrefillOp(**attrs), ordered_args(inp, PREFILL_ORDER), d / "prefill.onnx",
                         dynamic_shapes=ordered_dynamic_shapes(inp, PREFILL_ORDER, dims))
    dec_inp = cast_inputs(make_decode_inputs(gen, 2, 1, 2, K=16, V=16), torch.float32)
    B = torch.export.Dim("batch", min=1, max=1024)       # Dim objects work as well as names
    dec = export_program(DecodeOp(), ordered_args(dec_inp, DECODE_ORDER), d / "decode.onnx",
                         dynamic_shapes=tuple({0: B} for _ in range(6)))
    return d / "prefill.onnx", d / "decode.onnx", pre, dec


def test_export_emits_one_gdn_node_per_op(prefill_decode_models):
    _, _, pre, dec = prefill_decode_models
    # the fused body for Hv = 2, Hk = 1, K = 16 (the shapes are static in the export)
    dec_key = "gate0_l2norm0_state0" + ("_la2_hk1_k16" if onnxruntime_has_linear_attention() else "")
    for model, op, key in ((pre, "GatedDeltaPrefill", "gate1_l2norm1"), (dec, "GatedDeltaDecode", dec_key)):
        nodes = gdn_nodes(model)
        assert [(n.op_type, n.domain, n.overload) for n in nodes] == [(op, "gdn", key)]
        assert [(f.domain, f.name, f.overload) for f in model.functions] == [("gdn", op, key)]
        assert {i.domain: i.version for i in model.opset_import}["gdn"] == SPEC.opset_version
        # The TensorRT ONNX parser picks the plugin by op_type + these attributes (not by the domain).
        attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
        assert attrs["plugin_namespace"] == SPEC.plugin_namespace.encode()
        assert attrs["plugin_version"] == SPEC.plugin_version.encode()
    assert len(gdn_nodes(pre)[0].input) == 9 and len(gdn_nodes(dec)[0].input) == 6
    assert pre.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "T"


def test_exported_prefill_then_decode_steps_match_torch(prefill_decode_models, gen):
    pre_path, dec_path, _, _ = prefill_decode_models
    attrs = dict(gate_mode=1, use_qk_l2norm=1)
    for seqlens in ([7, 0, 1, 12], [64]):        # different T and N than at export, incl. empty/single
        inp = cast_inputs(make_prefill_inputs(gen, seqlens, 1, 2, K=16, V=16, **attrs), torch.float32)
        o, state = run_onnxruntime(pre_path, ordered_args(inp, PREFILL_ORDER)).values()
        o64, s64 = call_prefill_ref(inp, **attrs, compute_dtype=torch.float64)
        assert rel_err(o, o64) < FP32_TOL and rel_err(state, s64) < FP32_TOL
    # carry the last prefill state through three decode steps
    ref_state = state.clone()
    for _ in range(3):
        step = cast_inputs(make_decode_inputs(gen, state.shape[0], 1, 2, K=16, V=16), torch.float32)
        step["state"] = state
        o, state = run_onnxruntime(dec_path, ordered_args(step, DECODE_ORDER)).values()
        step["state"] = ref_state
        o_ref, ref_state = torch.ops.gdn.decode(*ordered_args(step, DECODE_ORDER))
        assert rel_err(o, o_ref) < FP32_TOL and rel_err(state, ref_state) < FP32_TOL


def test_export_fp16_prefill(tmp_path, gen):
    inp = cast_inputs(make_prefill_inputs(gen, [4, 6], 2, 2, K=16, V=8), torch.float16)
    dims = dict(q="T", k="T", v="T", g="T", beta="T", cu_seqlens="N1", initial_state="N")
    path = tmp_path / "prefill_fp16.onnx"
    model = export_program(PrefillOp(scale=0.5), ordered_args(inp, PREFILL_ORDER), path,
                           dynamic_shapes=ordered_dynamic_shapes(inp, PREFILL_ORDER, dims))
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    inp = cast_inputs(make_prefill_inputs(gen, [9, 0, 3], 2, 2, K=16, V=8), torch.float16)
    o, s = run_onnxruntime(path, ordered_args(inp, PREFILL_ORDER)).values()
    o64, s64 = call_prefill_ref(cast_inputs(inp, torch.float64, torch.float64), scale=0.5)
    assert o.dtype == torch.float16 and rel_err(o, o64) < SPEC.kernel_tolerance("float16")
    assert rel_err(s, s64) < 1e-4


def test_export_decode_pool_updates_pool_output(tmp_path, gen):
    inp = cast_inputs(make_decode_inputs(gen, 3, 1, 2, K=8, V=8, gate_mode=1, use_qk_l2norm=1, pool_size=6),
                      torch.float32)
    dims = dict(q="B", k="B", v="B", g="B", beta="B", slots="B", state="P")
    order = ("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias")
    path = tmp_path / "pool.onnx"
    model = export_program(_DecodePool(), ordered_args(inp, order), path,
                           dynamic_shapes=ordered_dynamic_shapes(inp, order, dims), output_names=["o", "pool_out"])
    (node,) = gdn_nodes(model)
    assert node.op_type == "GatedDeltaDecode" and node.overload == "gate1_l2norm1_state1"
    assert len(model.graph.output) == 2 and model.graph.output[1].name == "pool_out"
    inp = cast_inputs(make_decode_inputs(gen, 4, 1, 2, K=8, V=8, gate_mode=1, use_qk_l2norm=1, pool_size=7),
                      torch.float32)
    inp["slots"][2] = -1
    o, pool = run_onnxruntime(path, ordered_args(inp, order)).values()
    ref_pool = inp["state"].clone()
    o_ref = torch.ops.gdn.decode_pool_(*ordered_args(dict(inp, state=ref_pool), order), gate_mode=1, use_qk_l2norm=1)
    assert rel_err(o, o_ref) < FP32_TOL and rel_err(pool, ref_pool) < FP32_TOL
    assert torch.count_nonzero(o[2]) == 0


def test_pool_update_not_returned_is_an_error(gen):
    inp = cast_inputs(make_decode_inputs(gen, 2, 1, 1, K=8, V=8, gate_mode=1, pool_size=3), torch.float32)
    order = ("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias")
    with pytest.raises(ValueError, match="return the pool"):
        export_program(_DecodePool(return_pool=False), ordered_args(inp, order), None)
