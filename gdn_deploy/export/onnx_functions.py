"""Model-local ONNX function bodies for the gdn nodes (standard ONNX ops only).

TensorRT sees ``gdn::GatedDeltaPrefill`` / ``gdn::GatedDeltaDecode`` nodes and maps them to
its plugins; onnxruntime has no such kernels, so :func:`add_function_bodies` attaches a
``FunctionProto`` per node kind that onnxruntime inlines. Because ``gate_mode`` and
``state_mode`` change the (compacted) input list, each attribute combination gets its own
function body, told apart by the ONNX ``overload`` field (IR >= 10): the node keeps
``op_type`` = plugin name and domain ``gdn`` and gains ``overload`` = ``gate{g}_l2norm{n}[_state{s}]``.
``scale`` and ``l2norm_eps`` stay function attributes (``ref_attr_name``) with the spec defaults.

Math (float32 throughout, I/O cast at the boundary): optional raw gates
(g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)), optional L2 norm of q and k,
q scaled (scale 0 -> 1/sqrt(K) from the K dim at run time), GVA (value head h reads q/k head
h // (Hv/Hk)), then the delta-rule recurrence. Two prefill bodies (``body``):

- ``"chunked"`` (default): chunks of 64 tokens, batched MatMuls over lanes of sequences and heads,
  one Scan step per chunk position (:mod:`.onnx_chunked`; the math of the CUDA kernels);
- ``"token"``: the plainest statement of the recurrence, a Loop over sequences, an If (length 0
  keeps the state) around a Scan over the tokens; slow, kept as a cross-check.

Decode (either body): one vectorised step, no loop; pool mode gathers the rows of slots >= 0,
computes only those, scatters the new rows back (ScatterND) and leaves o = 0 for slot -1.
"""
from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

from ..onnx_nodes import iter_gdn_nodes
from ..spec import COMMIT, PREFILL, SPEC, STATE_POOL, VERIFY, OpSpec
from .onnx_chunked import chunked_prefill_body
from .onnx_speculative import commit_body, verify_body
from .onnx_graph import FLOAT, GraphBuilder, prepare_inputs, repeat_heads, value_info

__all__ = ["add_function_bodies", "overload_name", "make_function", "node_attrs", "function_body", "MIN_OPSET",
           "BODIES", "DEFAULT_BODY", "BODY_METADATA_KEY"]

MIN_OPSET = 18          # ReduceSum/Unsqueeze/Squeeze with axes inputs, Shape start/end, CastLike
BODIES = ("chunked", "token")
DEFAULT_BODY = "chunked"
_INT_ATTRS = ("gate_mode", "use_qk_l2norm", "state_mode")


def node_attrs(op: OpSpec, node: onnx.NodeProto) -> dict[str, Any]:
    """Attribute values of a gdn node with the spec defaults filled in."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return op.attrs(**{k: v for k, v in given.items() if k in op.attributes})


def overload_name(op: OpSpec, attrs: dict[str, Any]) -> str:
    if "gate_mode" not in op.attributes:   # GatedDeltaCommit
        return f"state{int(attrs['state_mode'])}"
    key = f"gate{int(attrs['gate_mode'])}_l2norm{int(attrs['use_qk_l2norm'])}"
    if "state_mode" in op.attributes:
        key += f"_state{int(attrs['state_mode'])}"
    return key


def _prepare(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """float32 q, k repeated to the Hv heads, v, exp(g), beta; rows first."""
    q, k, v, g, beta = prepare_inputs(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                      ins.get("A_log"), ins.get("dt_bias"), attrs)
    return repeat_heads(b, q, v), repeat_heads(b, k, v), v, b("Exp", g, hint="exp_g"), beta


def _delta_step(b: GraphBuilder, S: str, q: str, k: str, v: str, eg: str, bt: str) -> tuple[str, str]:
    """One token for every leading index: S [..., Hv, K, V]; q, k [..., Hv, K]; v [..., Hv, V]; eg, bt [..., Hv]."""
    m2, m1, m21 = b.ints(-2), b.ints(-1), b.ints(-2, -1)
    S1 = b("Mul", S, b("Unsqueeze", eg, m21), hint="S_decayed")
    kv = b("MatMul", b("Unsqueeze", k, m2), S1, hint="kS")                        # [..., Hv, 1, V]
    delta = b("Mul", b("Sub", b("Unsqueeze", v, m2), kv), b("Unsqueeze", bt, m21), hint="delta")
    S2 = b("Add", S1, b("MatMul", b("Unsqueeze", k, m1), delta), hint="S_new")
    o = b("Squeeze", b("MatMul", b("Unsqueeze", q, m2), S2), m2, hint="o_t")       # [..., Hv, V]
    return o, S2


def _token_prefill_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str]:
    qe, ke, vf, eg, bt = _prepare(b, ins, attrs)
    cu = b("Cast", ins["cu_seqlens"], to=TensorProto.INT64, hint="cu64")
    h0 = b("Cast", ins["initial_state"], to=FLOAT, hint="h0")
    n_seq = b("Squeeze", b("Sub", b("Shape", cu), b.ints(1)), hint="n_seq")
    axis0, zero1 = b.ints(0), b.ints(0)
    o_init = b("Slice", vf, zero1, zero1, axis0, hint="o_empty")                  # [0, Hv, V]

    # Scan body: one token of one sequence.
    sb = b.sub()
    s_in, q_t, k_t, v_t, eg_t, b_t = (sb.name(n) for n in ("S", "q_t", "k_t", "v_t", "eg_t", "b_t"))
    o_t, s_out = _delta_step(sb, s_in, q_t, k_t, v_t, eg_t, b_t)
    s_out = sb("Identity", s_out, hint="S_carry")
    step_ins = ((s_in, 3), (q_t, 2), (k_t, 2), (v_t, 2), (eg_t, 1), (b_t, 1))
    scan_body = helper.make_graph(sb.nodes, "gdn_token_step", [value_info(x, r) for x, r in step_ins],
                                  [value_info(s_out, 3), value_info(o_t, 2)])

    # Loop body: one sequence.
    lb = b.sub()
    it, cond_in, o_acc = lb.name("seq"), lb.name("cond"), lb.name("o_acc")
    start = lb("Gather", cu, it, axis=0, hint="start")
    end = lb("Gather", cu, lb("Add", it, lb.scalar_i64(1)), axis=0, hint="end")
    S0 = lb("Gather", h0, it, axis=0, hint="S0")
    s1, e1 = lb("Unsqueeze", start, axis0), lb("Unsqueeze", end, axis0)
    nonempty = lb("Greater", lb("Sub", end, start), lb.scalar_i64(0), hint="nonempty")
    tb = lb.sub()
    sliced = [tb("Slice", x, s1, e1, axis0, hint="seq_" + x.split("__")[0]) for x in (qe, ke, vf, eg, bt)]
    S_fin_t, o_seq_t = tb("Scan", S0, *sliced, n_out=2, num_scan_inputs=5, body=scan_body)
    then_g = helper.make_graph(tb.nodes, "gdn_seq_nonempty", [], [value_info(S_fin_t, 3), value_info(o_seq_t, 3)])
    eb = lb.sub()
    S_fin_e = eb("Identity", S0, hint="S_keep")
    o_seq_e = eb("Slice", vf, s1, s1, axis0, hint="o_none")
    else_g = helper.make_graph(eb.nodes, "gdn_seq_empty", [], [value_info(S_fin_e, 3), value_info(o_seq_e, 3)])
    S_fin, o_seq = lb("If", nonempty, n_out=2, then_branch=then_g, else_branch=else_g)
    cond_out = lb("Identity", cond_in, hint="cond_out")
    o_acc2 = lb("Concat", o_acc, o_seq, axis=0, hint="o_acc_next")
    S_out = lb("Identity", S_fin, hint="S_final")
    loop_body = helper.make_graph(
        lb.nodes, "gdn_sequence",
        [value_info(it, 0, TensorProto.INT64), value_info(cond_in, 0, TensorProto.BOOL), value_info(o_acc, 3)],
        [value_info(cond_out, 0, TensorProto.BOOL), value_info(o_acc2, 3), value_info(S_out, 3)])
    o_all, finals = b("Loop", n_seq, "", o_init, n_out=2, body=loop_body)
    # N = 0: a Loop with no iteration stacks nothing (shape [0,0,0,0]); give it h0's shape.
    return o_all, b("Reshape", finals, b("Shape", h0), hint="final_states")


def _decode_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str]:
    qe, ke, vf, eg, bt = _prepare(b, ins, attrs)
    state = b("Cast", ins["state"], to=FLOAT, hint="state_f")
    if int(attrs["state_mode"]) != STATE_POOL:
        return _delta_step(b, state, qe, ke, vf, eg, bt)
    slots = ins["slots"]
    valid = b("GreaterOrEqual", slots, b("Cast", b.scalar_i64(0), to=TensorProto.INT32), hint="valid")
    pos = b("Squeeze", b("NonZero", valid), b.ints(0), hint="valid_pos")           # [nnz]
    rows = b("Cast", b("Gather", slots, pos, axis=0), to=TensorProto.INT64, hint="rows")
    picked = [b("Gather", x, pos, axis=0) for x in (qe, ke, vf, eg, bt)]
    S = b("Gather", state, rows, axis=0, hint="S_rows")
    o_v, S2 = _delta_step(b, S, *picked)
    one = b.ints(1)
    zeros = b("ConstantOfShape", b("Shape", vf), value=helper.make_tensor("z", FLOAT, [1], [0.0]))
    o = b("ScatterND", zeros, b("Unsqueeze", pos, one), o_v, hint="o_pool")
    pool = b("ScatterND", state, b("Unsqueeze", rows, one), S2, hint="pool_new")
    return o, pool


def _check_body(body: str) -> None:
    if body not in BODIES:
        raise ValueError(f"body: expected one of {', '.join(BODIES)}, got {body!r}")


def make_function(op: OpSpec, attrs: dict[str, Any], opset: int, body: str = DEFAULT_BODY) -> onnx.FunctionProto:
    """The FunctionProto (domain gdn, name = op name, overload from the attributes) for one combination.

    ``body`` picks the prefill body (``"chunked"`` or ``"token"``); decode has one body.
    """
    if opset < MIN_OPSET:
        raise ValueError(f"gdn function bodies need ONNX opset >= {MIN_OPSET} for the default domain, got {opset}")
    _check_body(body)
    in_names = op.input_names(attrs)
    b = GraphBuilder()
    ins = {n: n for n in in_names}
    out_names = op.output_names()
    if op.name in (VERIFY.name, COMMIT.name):
        what = "padded-scan verify body" if op.name == VERIFY.name else "padded-scan commit body"
        outs = (verify_body if op.name == VERIFY.name else commit_body)(b, ins, attrs)
    else:
        if op.name == PREFILL.name:
            build = chunked_prefill_body if body == "chunked" else _token_prefill_body
            what = f"{body} prefill body"
        else:
            build, what = _decode_body, "single-step decode body"
        outs = list(build(b, ins, attrs))
    for i, (x, name) in enumerate(zip(outs, out_names)):
        if i == 0 and "q" in ins:
            b("CastLike", x, ins["q"], outputs=[name])
        else:
            b("Identity", x, outputs=[name])
    defaults = [helper.make_attribute(a, op.defaults[a]) for a in op.attributes if a not in _INT_ATTRS]
    defaults += [helper.make_attribute(a, int(op.defaults[a])) for a in op.attributes if a in _INT_ATTRS]
    return helper.make_function(
        SPEC.domain, op.name, in_names, out_names, b.nodes,
        [helper.make_opsetid("", opset)], attribute_protos=defaults, overload=overload_name(op, attrs),
        doc_string=f"onnxruntime {what} of {SPEC.domain}::{op.name} for {overload_name(op, attrs)} "
                   "(standard ONNX ops)")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ValueError("model has no default-domain opset import")


BODY_METADATA_KEY = "gdn.prefill_body"


def function_body(model: onnx.ModelProto) -> str | None:
    """The prefill body ``add_function_bodies`` attached to ``model`` (model metadata), or None."""
    return next((p.value for p in model.metadata_props if p.key == BODY_METADATA_KEY), None)


def add_function_bodies(model: onnx.ModelProto, body: str = DEFAULT_BODY) -> onnx.ModelProto:
    """Attach (in place, and return) one FunctionProto per gdn op/attribute combination used in ``model``.

    Every gdn node gets ``overload`` set to its combination; its input count is checked against
    the spec. ``body`` picks the prefill body (``"chunked"``, the default, or ``"token"``) and is
    recorded in the model's metadata (``gdn.prefill_body``, read by :func:`function_body`).
    Functions of earlier calls are replaced, so calling twice is harmless.
    """
    _check_body(body)
    opset = default_opset(model)
    wanted: dict[tuple[str, str], onnx.FunctionProto] = {}
    for node in iter_gdn_nodes(model.graph, SPEC.all_ops):
        op = SPEC.all_ops[node.op_type]
        attrs = node_attrs(op, node)
        expected = op.input_names(attrs)
        if len(node.input) != len(expected) or any(not x for x in node.input):
            raise ValueError(f"{SPEC.domain}::{node.op_type} node {node.name!r}: has inputs {list(node.input)}, "
                             f"expected {len(expected)} ({', '.join(expected)}) for attributes {attrs}")
        node.overload = overload_name(op, attrs)
        key = (node.op_type, node.overload)
        if key not in wanted:
            wanted[key] = make_function(op, attrs, opset, body)
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.all_ops)]
    del model.functions[:]
    model.functions.extend(keep + list(wanted.values()))
    props = [p for p in model.metadata_props if p.key != BODY_METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    if wanted:
        if any(op == PREFILL.name for op, _ in wanted):
            model.metadata_props.append(onnx.StringStringEntryProto(key=BODY_METADATA_KEY, value=body))
        if not any(i.domain == SPEC.domain for i in model.opset_import):
            model.opset_import.append(helper.make_opsetid(SPEC.domain, SPEC.opset_version))
        model.ir_version = max(model.ir_version, 10)   # overload needs IR 10
    return model
