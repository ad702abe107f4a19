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
  keeps the state) around a Scan over the tokens; slow, kept as a cross-check;
- ``"linear_attention"`` (not an export choice: what onnxruntime's CUDA provider loads, runtime/ort_attention.py):
  the input stage above, then the packed rows gathered into a padded per-sequence view [N, Lmax, Hv*D] in the
  activations' dtype, padding rows with g = 0 and beta = 0 (the identity on the state), one
  ``com.microsoft::LinearAttention`` (gated_delta) from the initial states, and the valid rows gathered back.

Decode: one vectorised step, no loop. Two decode bodies (``decode_body``) for the dense state:

- ``"linear_attention"`` (default where the installed onnxruntime has the kernel): the input stage above in
  standard ops, then onnxruntime's fused ``com.microsoft::LinearAttention`` (update_rule ``gated_delta``, float32
  CPU kernel) with q/k repeated to the Hv value heads; it reads and writes the recurrent state once, where the
  standard-op step passes over it about eight times (decay, two products, the rank-1 update, the output copy);
- ``"ops"``: the same step in standard ops (MatMul/Mul/Add), for runtimes without the contrib op.

Pool mode (either) gathers the rows of slots >= 0, computes only those with the standard-op step, scatters the
new rows back (ScatterND) and leaves o = 0 for slot -1. The TensorRT copies drop every body (plugins).
"""
from __future__ import annotations

import functools
from typing import Any

import onnx
from onnx import TensorProto, helper

from ..onnx_nodes import iter_gdn_nodes
from ..spec import COMMIT, DECODE, PREFILL, SPEC, STATE_POOL, VERIFY, OpSpec
from .onnx_chunked import chunked_prefill_body
from .onnx_speculative import commit_body, verify_body
from .onnx_graph import FLOAT, GraphBuilder, graph_constants, prepare_inputs, repeat_heads, value_info

__all__ = ["add_function_bodies", "overload_name", "make_function", "node_attrs", "function_body", "MIN_OPSET",
           "BODIES", "DEFAULT_BODY", "BODY_METADATA_KEY", "DECODE_BODIES", "DECODE_BODY_METADATA_KEY",
           "default_decode_body", "decode_function_body", "onnxruntime_has_linear_attention", "LA_BODY"]

MIN_OPSET = 18          # ReduceSum/Unsqueeze/Squeeze with axes inputs, Shape start/end, CastLike
BODIES = ("chunked", "token")           # the export choices
DEFAULT_BODY = "chunked"
LA_BODY = "linear_attention"            # prefill on com.microsoft::LinearAttention (needs Hv static)
DECODE_BODIES = ("linear_attention", "ops")
LA_DOMAIN, LA_VERSION = "com.microsoft", 1
_INT_ATTRS = ("gate_mode", "use_qk_l2norm", "state_mode")


def node_attrs(op: OpSpec, node: onnx.NodeProto) -> dict[str, Any]:
    """Attribute values of a gdn node with the spec defaults filled in."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return op.attrs(**{k: v for k, v in given.items() if k in op.attributes})


def overload_name(op: OpSpec, attrs: dict[str, Any], la_heads: int | None = None,
                  la_static: tuple[int, int] | None = None) -> str:
    """``la_heads``: a LinearAttention decode body for Hv value heads (0: heads folded into the rows);
    ``la_static``: that body built for static (Hk, K)."""
    if "gate_mode" not in op.attributes:   # GatedDeltaCommit
        return f"state{int(attrs['state_mode'])}"
    key = f"gate{int(attrs['gate_mode'])}_l2norm{int(attrs['use_qk_l2norm'])}"
    if "state_mode" in op.attributes:
        key += f"_state{int(attrs['state_mode'])}"
    if la_heads is not None:
        key += f"_la{int(la_heads)}"
        if la_static:
            key += f"_hk{int(la_static[0])}_k{int(la_static[1])}"
    return key


@functools.lru_cache(maxsize=None)
def onnxruntime_has_linear_attention() -> bool:
    """True when the installed onnxruntime registers ``com.microsoft::LinearAttention`` (its CPU kernel); asked once
    per process (listing onnxruntime's schemas takes ~0.2 s, and every exported graph asks)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C
        return any(s.name == "LinearAttention" and s.domain == LA_DOMAIN for s in C.get_all_operator_schema())
    except Exception:  # noqa: BLE001  (no onnxruntime, or a build without the schema listing)
        return False


def default_decode_body() -> str:
    """``"linear_attention"`` where the installed onnxruntime has the kernel, else ``"ops"``."""
    return "linear_attention" if onnxruntime_has_linear_attention() else "ops"


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


def _la_decode_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any], heads: int,
                    out_names: list[str], static: tuple[int, int] | None = None) -> tuple[str, str]:
    """Dense-state decode through ``com.microsoft::LinearAttention``: q, k [B, Hk, K] (L2-normed, q scaled, then
    repeated to Hv heads) and v [B, Hv, V] as [B, 1, H*D], log-decay g and beta as [B, 1, Hv], the state
    [B, Hv, K, V] as is (its output is the function's state output, no copy). ``heads`` = Hv; 0 when it is not
    static: then rows and heads are folded ([B*Hv, 1, D], one head; the state reshaped in and out). ``static``:
    (Hk, K) when q's shape has them: the default scale is a constant and, where Hk = Hv, q and k are not repeated
    (no shape arithmetic left for a runtime to run every step)."""
    hk, k_dim = static or (0, 0)
    q, k, v, g, beta = prepare_inputs(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"], ins.get("A_log"),
                                      ins.get("dt_bias"), attrs, k_dim=k_dim or None)
    if not (heads and hk == heads):
        q, k = repeat_heads(b, q, v), repeat_heads(b, k, v)
    state = b("Cast", ins["state"], to=FLOAT, hint="state_f")
    la = dict(domain=LA_DOMAIN, update_rule="gated_delta", scale=1.0)     # q carries the scale already
    if heads:
        flat = b.ints(0, 1, -1)
        q3, k3, v3, g3, b3 = (b("Reshape", x, flat) for x in (q, k, v, g, beta))
        o, _ = b("LinearAttention", q3, k3, v3, state, g3, b3, outputs=[b.name("o_la"), out_names[1]],
                 q_num_heads=heads, kv_num_heads=heads, **la)
        return b("Reshape", o, b.ints(0, heads, -1), hint="o_t"), out_names[1]     # [B, 1, Hv*V] -> [B, Hv, V]
    row = b.ints(-1, 1)
    q3, k3, v3 = (b("Reshape", x, b("Concat", row, b("Shape", x, start=2, end=3), axis=0)) for x in (q, k, v))
    g3, b3 = (b("Reshape", x, b.ints(-1, 1, 1)) for x in (g, beta))
    s4 = b("Reshape", state, b("Concat", row, b("Shape", state, start=2, end=4), axis=0), hint="state_rows")
    o, s_new = b("LinearAttention", q3, k3, v3, s4, g3, b3, n_out=2, q_num_heads=1, kv_num_heads=1, **la)
    return b("Reshape", o, b("Shape", v), hint="o_t"), b("Reshape", s_new, b("Shape", state), hint="S_new")


def _la_prefill_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any], heads: int) -> tuple[str, str]:
    """Packed varlen prefill through ``com.microsoft::LinearAttention`` for ``heads`` = Hv value heads: rows
    [T, H, D] gathered into [N, Lmax, H*D] (sequence n's row j: token cu[n] + j; past its length a copy of a
    clamped real row with g = 0 and beta = 0, which leave the state as it is), q, k, v, g, beta in v's dtype (the
    op's activation type; float16 selects onnxruntime's chunked CUDA kernel), the states too (in and out of the
    op only: a float16 export's states are rounded to float16 once per call); the rows of
    the valid positions, in row-major order, are the packed tokens again (float32 out, cast to the I/O dtype by
    the caller). T = 0 keeps the states (an If)."""
    q, k, v, g, beta = prepare_inputs(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                      ins.get("A_log"), ins.get("dt_bias"), attrs)
    q, k = repeat_heads(b, q, v), repeat_heads(b, k, v)
    cu = b("Cast", ins["cu_seqlens"], to=TensorProto.INT64, hint="cu64")
    h0 = b("Cast", ins["initial_state"], to=FLOAT, hint="h0")
    w = b.sub()
    zero, one, axis0 = w.ints(0), w.ints(1), w.ints(0)
    n1 = w("Shape", cu)
    starts = w("Slice", cu, zero, w("Sub", n1, one), axis0, hint="starts")              # [N]
    lens = w("Sub", w("Slice", cu, one, n1, axis0), starts, hint="lens")                 # [N]
    lmax = w("ReduceMax", lens, keepdims=1, hint="lmax")                                 # [1]
    j = w("Range", w.scalar_i64(0), w("Squeeze", lmax, axis0), w.scalar_i64(1), hint="j")  # [Lmax]
    jr, col = w("Unsqueeze", j, axis0), w.ints(-1)
    valid = w("Less", jr, w("Unsqueeze", lens, col), hint="valid")                       # [N, Lmax]
    rows = w("Shape", v, start=0, end=1)
    last = w("Sub", rows, one)
    idx = w("Min", w("Max", w("Add", w("Unsqueeze", starts, col), jr), zero), last, hint="pad_rows")  # in bounds
    flat = w.ints(0, 0, -1)
    gathered = [w("Reshape", w("Gather", w("CastLike", x, ins["v"]), idx, axis=0), flat, allowzero=0)
                for x in (q, k, v)]                                                      # [N, Lmax, Hv*D]
    zf = w("CastLike", w.scalar_f(0.0), ins["v"])
    vmask = w("Unsqueeze", valid, col)
    gb = [w("Where", vmask, w("Gather", w("CastLike", x, ins["v"]), idx, axis=0), zf) for x in (g, beta)]
    # the state crosses the op in the activations' dtype: onnxruntime-gpu 1.31's type inference gives
    # present_state the activations' type (a float32 state beside float16 activations fails to load)
    o, s_fin = w("LinearAttention", *gathered, w("CastLike", h0, ins["v"]), *gb, n_out=2, domain=LA_DOMAIN,
                 update_rule="gated_delta", scale=1.0, q_num_heads=heads, kv_num_heads=heads)  # q carries the scale
    s_fin = w("Cast", s_fin, to=FLOAT, hint="final_la")
    o_rows = w("Reshape", o, w("Concat", w.ints(-1), w("Shape", o, start=2, end=3), axis=0), hint="o_rows")
    pos = w("Transpose", w("NonZero", valid), perm=[1, 0], hint="valid_pos")            # [T, 2], row-major
    o_pos = w("Add", w("Mul", w("Gather", pos, zero, axis=1), lmax), w("Gather", pos, one, axis=1))
    o_t = w("Cast", w("Reshape", w("Gather", o_rows, w("Squeeze", o_pos, col), axis=0), w("Shape", v)), to=FLOAT,
            hint="o_la")
    none = b.sub()
    o_e, s_e = none("Identity", v, hint="o_no_tokens"), none("Identity", h0, hint="states_kept")
    return b("If", b("Greater", b("Size", v), b.scalar_i64(0)), n_out=2,
             then_branch=helper.make_graph(w.nodes, "gdn_la_prefill", [], [value_info(o_t, 3), value_info(s_fin, 4)]),
             else_branch=helper.make_graph(none.nodes, "gdn_no_tokens", [], [value_info(o_e, 3), value_info(s_e, 4)]))


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
    if body not in BODIES + (LA_BODY,):
        raise ValueError(f"body: expected one of {', '.join(BODIES + (LA_BODY,))}, got {body!r}")


def make_function(op: OpSpec, attrs: dict[str, Any], opset: int, body: str = DEFAULT_BODY,
                  la_heads: int | None = None, la_static: tuple[int, int] | None = None) -> onnx.FunctionProto:
    """The FunctionProto (domain gdn, name = op name, overload from the attributes) for one combination.

    ``body`` picks the prefill body (``"chunked"`` or ``"token"``). ``la_heads`` (dense-state decode only): the
    LinearAttention decode body for Hv value heads (0: Hv not static, heads folded into the rows); None: the
    standard-op step. ``la_static``: that body for static (Hk, K) (:func:`_la_decode_body`).
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
    elif op.name == PREFILL.name and body == LA_BODY:
        if not la_heads:
            raise ValueError(f"the {LA_BODY} prefill body needs the value heads static (la_heads), got {la_heads}")
        outs = list(_la_prefill_body(b, ins, attrs, int(la_heads)))
        what = "varlen prefill body on com.microsoft::LinearAttention"
    elif la_heads is not None:
        if op.name == PREFILL.name or int(attrs["state_mode"]) == STATE_POOL:
            raise ValueError(f"la_heads: the LinearAttention body is for the dense-state decode, not {op.name} "
                             f"{overload_name(op, attrs)}")
        outs = list(_la_decode_body(b, ins, attrs, int(la_heads), out_names, la_static))
        what = "single-step decode body on com.microsoft::LinearAttention"
    else:
        if op.name == PREFILL.name:
            build = chunked_prefill_body if body == "chunked" else _token_prefill_body
            what = f"{body} prefill body"
        else:
            build, what = _decode_body, "single-step decode body"
        outs = list(build(b, ins, attrs))
    for i, (x, name) in enumerate(zip(outs, out_names)):
        if x == name:
            continue
        if i == 0 and "q" in ins:
            b("CastLike", x, ins["q"], outputs=[name])
        else:
            b("Identity", x, outputs=[name])
    defaults = [helper.make_attribute(a, op.defaults[a]) for a in op.attributes if a not in _INT_ATTRS]
    defaults += [helper.make_attribute(a, int(op.defaults[a])) for a in op.attributes if a in _INT_ATTRS]
    imports = [helper.make_opsetid("", opset)]
    if la_heads is not None:
        imports.append(helper.make_opsetid(LA_DOMAIN, LA_VERSION))
    ovl = overload_name(op, attrs, la_heads, la_static)
    return helper.make_function(
        SPEC.domain, op.name, in_names, out_names, b.nodes, imports, attribute_protos=defaults, overload=ovl,
        doc_string=f"onnxruntime {what} of {SPEC.domain}::{op.name} for {ovl}"
                   + ("" if la_heads is not None else " (standard ONNX ops)"))


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ValueError("model has no default-domain opset import")


BODY_METADATA_KEY = "gdn.prefill_body"
DECODE_BODY_METADATA_KEY = "gdn.decode_body"


def function_body(model: onnx.ModelProto) -> str | None:
    """The prefill body ``add_function_bodies`` attached to ``model`` (model metadata), or None."""
    return next((p.value for p in model.metadata_props if p.key == BODY_METADATA_KEY), None)


def decode_function_body(model: onnx.ModelProto) -> str | None:
    """The dense-state decode body ``add_function_bodies`` attached to ``model`` (model metadata), or None (no
    dense-state decode node, or a graph exported before the key existed: the standard-op step)."""
    return next((p.value for p in model.metadata_props if p.key == DECODE_BODY_METADATA_KEY), None)


def _static_dims(model: onnx.ModelProto, name: str, rank: int) -> list[int]:
    """The dims of value ``name`` of rank ``rank``, 0 where not static; [] if unknown. From its graph input or
    value_info, else from the constant shape of the ``Reshape`` that makes it (what an exported graph holds before
    shape inference: e.g. q as ``Reshape(x, [-1, Hk, K])``; -1 and 0 entries count as not static)."""
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == rank:
                return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 0 for d in dims]
    producer = next((n for n in model.graph.node if name in n.output), None)
    if producer is None or producer.op_type != "Reshape" or producer.domain not in ("", "ai.onnx"):
        return []
    shape = _small_constant(model, producer.input[1])
    if shape is None or shape.ndim != 1 or len(shape) != rank:
        return []
    return [int(x) if x > 0 else 0 for x in shape.tolist()]


def _small_constant(model: onnx.ModelProto, name: str):
    """The value of ``name`` when an initializer with its data inline or a ``Constant`` node holds it; else None."""
    from onnx import numpy_helper
    t = graph_constants(model.graph)[1].get(name)
    return None if t is None or t.data_location == onnx.TensorProto.EXTERNAL else numpy_helper.to_array(t)


def _static_heads(model: onnx.ModelProto, node: onnx.NodeProto, state_index: int) -> int:
    """Hv of a decode node from its state input's static shape [B, Hv, K, V] (:func:`_static_dims`); 0 if
    unknown."""
    dims = _static_dims(model, node.input[state_index], 4)
    return dims[1] if dims else 0


def _static_qk(model: onnx.ModelProto, node: onnx.NodeProto, q_index: int) -> tuple[int, int] | None:
    """(Hk, K) of a decode node from its q input's static shape [B, Hk, K]; None if either is unknown."""
    dims = _static_dims(model, node.input[q_index], 3)
    return (dims[1], dims[2]) if dims and dims[1] and dims[2] else None


def add_function_bodies(model: onnx.ModelProto, body: str = DEFAULT_BODY,
                        decode_body: str | None = None) -> onnx.ModelProto:
    """Attach (in place, and return) one FunctionProto per gdn op/attribute combination used in ``model``.

    Every gdn node gets ``overload`` set to its combination; its input count is checked against
    the spec. ``body`` picks the prefill body (``"chunked"``, the default, or ``"token"``) and is
    recorded in the model's metadata (``gdn.prefill_body``, read by :func:`function_body`). ``decode_body`` picks
    the dense-state decode body (``"linear_attention"`` or ``"ops"``; None: :func:`default_decode_body`), recorded
    as ``gdn.decode_body`` (:func:`decode_function_body`) when the model has such a node.
    Functions of earlier calls are replaced, so calling twice is harmless.
    """
    _check_body(body)
    decode_body = default_decode_body() if decode_body is None else decode_body
    if decode_body not in DECODE_BODIES:
        raise ValueError(f"decode_body: expected one of {', '.join(DECODE_BODIES)}, got {decode_body!r}")
    opset = default_opset(model)
    wanted: dict[tuple[str, str], onnx.FunctionProto] = {}
    dense_decode = False
    for node in iter_gdn_nodes(model.graph, SPEC.all_ops):
        op = SPEC.all_ops[node.op_type]
        attrs = node_attrs(op, node)
        expected = op.input_names(attrs)
        if len(node.input) != len(expected) or any(not x for x in node.input):
            raise ValueError(f"{SPEC.domain}::{node.op_type} node {node.name!r}: has inputs {list(node.input)}, "
                             f"expected {len(expected)} ({', '.join(expected)}) for attributes {attrs}")
        la_heads, la_static = None, None
        if op.name == PREFILL.name and body == LA_BODY:
            la_heads = _static_heads(model, node, expected.index("initial_state"))
            if not la_heads:
                raise ValueError(f"{SPEC.domain}::{node.op_type} node {node.name!r}: the {LA_BODY} prefill body "
                                 "needs the value heads static (the initial state's dim 1)")
        if op.name == DECODE.name and int(attrs["state_mode"]) != STATE_POOL:
            dense_decode = True
            if decode_body == "linear_attention":
                la_heads = _static_heads(model, node, expected.index("state"))
                la_static = _static_qk(model, node, expected.index("q"))
        node.overload = overload_name(op, attrs, la_heads, la_static)
        key = (node.op_type, node.overload)
        if key not in wanted:
            wanted[key] = make_function(op, attrs, opset, body, la_heads, la_static)
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.all_ops)]
    del model.functions[:]
    model.functions.extend(keep + list(wanted.values()))
    props = [p for p in model.metadata_props if p.key not in (BODY_METADATA_KEY, DECODE_BODY_METADATA_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    if wanted:
        if any(op == PREFILL.name for op, _ in wanted):
            model.metadata_props.append(onnx.StringStringEntryProto(key=BODY_METADATA_KEY, value=body))
        if dense_decode:
            model.metadata_props.append(onnx.StringStringEntryProto(key=DECODE_BODY_METADATA_KEY, value=decode_body))
        if any(any(i.domain == LA_DOMAIN for i in f.opset_import) for f in wanted.values()) and \
                not any(i.domain == LA_DOMAIN for i in model.opset_import):
            model.opset_import.append(helper.make_opsetid(LA_DOMAIN, LA_VERSION))
        if not any(i.domain == SPEC.domain for i in model.opset_import):
            model.opset_import.append(helper.make_opsetid(SPEC.domain, SPEC.opset_version))
        model.ir_version = max(model.ir_version, 10)   # overload needs IR 10
    return model
