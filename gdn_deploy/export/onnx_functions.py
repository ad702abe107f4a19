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
q scaled (scale 0 -> 1/sqrt(K) from the K dim at run time), q/k repeated to the Hv value
heads (GVA), then the delta-rule recurrence. Prefill: Loop over sequences of ``cu_seqlens``,
inside it an If (length 0 keeps the state) around a Scan over the tokens. Decode: one
vectorised step; pool mode gathers the rows of slots >= 0, computes only those, scatters the
new rows back (ScatterND) and leaves o = 0 for slot -1.
"""
from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

from ..onnx_nodes import iter_gdn_nodes
from ..spec import GATE_RAW, PREFILL, SPEC, STATE_POOL, OpSpec

__all__ = ["add_function_bodies", "overload_name", "make_function", "node_attrs", "MIN_OPSET"]

MIN_OPSET = 18          # ReduceSum/Unsqueeze/Squeeze with axes inputs, Shape start/end, CastLike
_FLOAT = TensorProto.FLOAT
_INT_ATTRS = ("gate_mode", "use_qk_l2norm", "state_mode")


class _Nodes:
    """Collects NodeProtos; value names are unique across a function and all its subgraphs."""

    def __init__(self, counter: list[int] | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self._counter = counter if counter is not None else [0]

    def sub(self) -> "_Nodes":
        return _Nodes(self._counter)

    def name(self, hint: str) -> str:
        self._counter[0] += 1
        return f"{hint}__{self._counter[0]}"

    def __call__(self, op_type: str, *inputs: str, n_out: int = 1, hint: str | None = None,
                 outputs: list[str] | None = None, **attrs: Any):
        outs = outputs or [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def ints(self, *values: int) -> str:
        return self("Constant", value=helper.make_tensor("c", TensorProto.INT64, [len(values)], list(values)),
                    hint="ints")

    def scalar_i64(self, value: int) -> str:
        return self("Constant", value=helper.make_tensor("c", TensorProto.INT64, [], [value]), hint="i64")

    def scalar_f(self, value: float) -> str:
        return self("Constant", value=helper.make_tensor("c", _FLOAT, [], [value]), hint="f32")

    def attr_f(self, attr: str) -> str:
        """Constant float taken from the function attribute ``attr`` (ref_attr_name)."""
        ref = onnx.AttributeProto(name="value_float", ref_attr_name=attr, type=onnx.AttributeProto.FLOAT)
        node = helper.make_node("Constant", [], [self.name(attr)])
        node.attribute.append(ref)
        self.nodes.append(node)
        return node.output[0]


def _vi(name: str, rank: int, elem: int = _FLOAT) -> onnx.ValueInfoProto:
    """Subgraph I/O: element type and rank, every dimension unknown."""
    return helper.make_tensor_value_info(name, elem, [None] * rank)


def node_attrs(op: OpSpec, node: onnx.NodeProto) -> dict[str, Any]:
    """Attribute values of a gdn node with the spec defaults filled in."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return op.attrs(**{k: v for k, v in given.items() if k in op.attributes})


def overload_name(op: OpSpec, attrs: dict[str, Any]) -> str:
    key = f"gate{int(attrs['gate_mode'])}_l2norm{int(attrs['use_qk_l2norm'])}"
    if "state_mode" in op.attributes:
        key += f"_state{int(attrs['state_mode'])}"
    return key


def _prepare(b: _Nodes, q: str, k: str, v: str, g: str, beta: str, A_log: str | None, dt_bias: str | None,
             attrs: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """float32 q, k (L2 norm, scale, repeated to Hv heads), v, exp(g), beta; rows first."""
    qf, kf, vf = (b("Cast", x, to=_FLOAT, hint=n) for x, n in ((q, "qf"), (k, "kf"), (v, "vf")))
    gf, bf = b("Cast", g, to=_FLOAT, hint="gf"), b("Cast", beta, to=_FLOAT, hint="bf")
    if int(attrs["gate_mode"]) == GATE_RAW:
        decay = b("Neg", b("Exp", b("Cast", A_log, to=_FLOAT)))
        gf = b("Mul", decay, b("Softplus", b("Add", gf, b("Cast", dt_bias, to=_FLOAT))), hint="g_raw")
        bf = b("Sigmoid", bf, hint="beta_raw")
    eg = b("Exp", gf, hint="exp_g")
    last = b.ints(-1)
    if int(attrs["use_qk_l2norm"]):
        eps = b.attr_f("l2norm_eps")
        normed = []
        for x in (qf, kf):
            ss = b("ReduceSum", b("Mul", x, x), last, keepdims=1)
            normed.append(b("Mul", x, b("Reciprocal", b("Sqrt", b("Add", ss, eps))), hint="l2n"))
        qf, kf = normed
    scale_attr = b.attr_f("scale")
    k_dim = b("Cast", b("Shape", q, start=2, end=3), to=_FLOAT, hint="k_dim")
    default_scale = b("Reciprocal", b("Sqrt", k_dim))
    scale = b("Where", b("Equal", scale_attr, b.scalar_f(0.0)), default_scale, scale_attr, hint="scale")
    qf = b("Mul", qf, scale, hint="q_scaled")
    rows, hk, kd = b("Shape", q, start=0, end=1), b("Shape", q, start=1, end=2), b("Shape", q, start=2, end=3)
    hv = b("Shape", v, start=1, end=2)
    rep = b("Div", hv, hk, hint="gva_rep")
    expand_to = b("Concat", rows, hk, rep, kd, axis=0)
    target = b("Concat", rows, hv, kd, axis=0)
    two = b.ints(2)
    qe, ke = (b("Reshape", b("Expand", b("Unsqueeze", x, two), expand_to), target, hint=n)
              for x, n in ((qf, "q_gva"), (kf, "k_gva")))
    return qe, ke, vf, eg, bf


def _delta_step(b: _Nodes, S: str, q: str, k: str, v: str, eg: str, bt: str) -> tuple[str, str]:
    """One token for every leading index: S [..., Hv, K, V]; q, k [..., Hv, K]; v [..., Hv, V]; eg, bt [..., Hv]."""
    m2, m1, m21 = b.ints(-2), b.ints(-1), b.ints(-2, -1)
    S1 = b("Mul", S, b("Unsqueeze", eg, m21), hint="S_decayed")
    kv = b("MatMul", b("Unsqueeze", k, m2), S1, hint="kS")                        # [..., Hv, 1, V]
    delta = b("Mul", b("Sub", b("Unsqueeze", v, m2), kv), b("Unsqueeze", bt, m21), hint="delta")
    S2 = b("Add", S1, b("MatMul", b("Unsqueeze", k, m1), delta), hint="S_new")
    o = b("Squeeze", b("MatMul", b("Unsqueeze", q, m2), S2), m2, hint="o_t")       # [..., Hv, V]
    return o, S2


def _prefill_body(b: _Nodes, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str]:
    qe, ke, vf, eg, bt = _prepare(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                  ins.get("A_log"), ins.get("dt_bias"), attrs)
    cu = b("Cast", ins["cu_seqlens"], to=TensorProto.INT64, hint="cu64")
    h0 = b("Cast", ins["initial_state"], to=_FLOAT, hint="h0")
    n_seq = b("Squeeze", b("Sub", b("Shape", cu), b.ints(1)), hint="n_seq")
    axis0, zero1 = b.ints(0), b.ints(0)
    o_init = b("Slice", vf, zero1, zero1, axis0, hint="o_empty")                  # [0, Hv, V]

    # Scan body: one token of one sequence.
    sb = b.sub()
    s_in, q_t, k_t, v_t, eg_t, b_t = (sb.name(n) for n in ("S", "q_t", "k_t", "v_t", "eg_t", "b_t"))
    o_t, s_out = _delta_step(sb, s_in, q_t, k_t, v_t, eg_t, b_t)
    s_out = sb("Identity", s_out, hint="S_carry")
    scan_body = helper.make_graph(sb.nodes, "gdn_token_step", [_vi(x, r) for x, r in ((s_in, 3), (q_t, 2), (k_t, 2), (v_t, 2), (eg_t, 1), (b_t, 1))],
                                  [_vi(s_out, 3), _vi(o_t, 2)])

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
    then_g = helper.make_graph(tb.nodes, "gdn_seq_nonempty", [], [_vi(S_fin_t, 3), _vi(o_seq_t, 3)])
    eb = lb.sub()
    S_fin_e = eb("Identity", S0, hint="S_keep")
    o_seq_e = eb("Slice", vf, s1, s1, axis0, hint="o_none")
    else_g = helper.make_graph(eb.nodes, "gdn_seq_empty", [], [_vi(S_fin_e, 3), _vi(o_seq_e, 3)])
    S_fin, o_seq = lb("If", nonempty, n_out=2, then_branch=then_g, else_branch=else_g)
    cond_out = lb("Identity", cond_in, hint="cond_out")
    o_acc2 = lb("Concat", o_acc, o_seq, axis=0, hint="o_acc_next")
    S_out = lb("Identity", S_fin, hint="S_final")
    loop_body = helper.make_graph(
        lb.nodes, "gdn_sequence", [_vi(it, 0, TensorProto.INT64), _vi(cond_in, 0, TensorProto.BOOL), _vi(o_acc, 3)],
        [_vi(cond_out, 0, TensorProto.BOOL), _vi(o_acc2, 3), _vi(S_out, 3)])
    o_all, finals = b("Loop", n_seq, "", o_init, n_out=2, body=loop_body)
    # N = 0: a Loop with no iteration stacks nothing (shape [0,0,0,0]); give it h0's shape.
    return o_all, b("Reshape", finals, b("Shape", h0), hint="final_states")


def _decode_body(b: _Nodes, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str]:
    qe, ke, vf, eg, bt = _prepare(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                  ins.get("A_log"), ins.get("dt_bias"), attrs)
    state = b("Cast", ins["state"], to=_FLOAT, hint="state_f")
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
    zeros = b("ConstantOfShape", b("Shape", vf), value=helper.make_tensor("z", _FLOAT, [1], [0.0]))
    o = b("ScatterND", zeros, b("Unsqueeze", pos, one), o_v, hint="o_pool")
    pool = b("ScatterND", state, b("Unsqueeze", rows, one), S2, hint="pool_new")
    return o, pool


def make_function(op: OpSpec, attrs: dict[str, Any], opset: int) -> onnx.FunctionProto:
    """The FunctionProto (domain gdn, name = op name, overload from the attributes) for one combination."""
    if opset < MIN_OPSET:
        raise ValueError(f"gdn function bodies need ONNX opset >= {MIN_OPSET} for the default domain, got {opset}")
    in_names = op.input_names(attrs)
    b = _Nodes()
    ins = {n: n for n in in_names}
    o, state = (_prefill_body if op.name == PREFILL.name else _decode_body)(b, ins, attrs)
    out_names = op.output_names()
    b("CastLike", o, ins["q"], outputs=[out_names[0]])
    b("Identity", state, outputs=[out_names[1]])
    defaults = [helper.make_attribute(a, op.defaults[a]) for a in op.attributes if a not in _INT_ATTRS]
    defaults += [helper.make_attribute(a, int(op.defaults[a])) for a in op.attributes if a in _INT_ATTRS]
    return helper.make_function(
        SPEC.domain, op.name, in_names, out_names, b.nodes,
        [helper.make_opsetid("", opset)], attribute_protos=defaults, overload=overload_name(op, attrs),
        doc_string=f"onnxruntime body of {SPEC.domain}::{op.name} for {overload_name(op, attrs)} (standard ONNX ops)")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ValueError("model has no default-domain opset import")


def add_function_bodies(model: onnx.ModelProto) -> onnx.ModelProto:
    """Attach (in place, and return) one FunctionProto per gdn op/attribute combination used in ``model``.

    Every gdn node gets ``overload`` set to its combination; its input count is checked against
    the spec. Functions of earlier calls are replaced, so calling twice is harmless.
    """
    opset = default_opset(model)
    wanted: dict[tuple[str, str], onnx.FunctionProto] = {}
    for node in iter_gdn_nodes(model.graph):
        op = SPEC.ops[node.op_type]
        attrs = node_attrs(op, node)
        expected = op.input_names(attrs)
        if len(node.input) != len(expected) or any(not x for x in node.input):
            raise ValueError(f"{SPEC.domain}::{node.op_type} node {node.name!r}: has inputs {list(node.input)}, "
                             f"expected {len(expected)} ({', '.join(expected)}) for attributes {attrs}")
        node.overload = overload_name(op, attrs)
        key = (node.op_type, node.overload)
        if key not in wanted:
            wanted[key] = make_function(op, attrs, opset)
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.ops)]
    del model.functions[:]
    model.functions.extend(keep + list(wanted.values()))
    if wanted:
        if not any(i.domain == SPEC.domain for i in model.opset_import):
            model.opset_import.append(helper.make_opsetid(SPEC.domain, SPEC.opset_version))
        model.ir_version = max(model.ir_version, 10)   # overload needs IR 10
    return model
