"""ONNX forms of :func:`gdn_deploy.lm.moe_op.moe` (the routed experts of an MoE layer).

- onnxruntime graphs: one ``com.microsoft::MoE`` node (:func:`moe_translation`), fused CPU and CUDA kernels:
  ``activation_type="swiglu"`` with ``swiglu_fusion=1`` (the CPU kernel takes no other: fc1 ``[E, 2I, hidden]``
  with gate and up rows interleaved, row ``2i`` = gate ``i``, row ``2i+1`` = up ``i``), ``activation_alpha=1``,
  ``activation_beta=0`` (silu(gate) * up), fc2 ``[E, hidden, I]``; the router input is the logits (the op takes
  softmax over all experts, then top-k; ``normalize_routing_weights`` renormalises the k weights). The weights
  file keeps ``gate_up_proj`` as the checkpoint has it (gate rows, then up rows); the graph interleaves it with one
  ``Gather`` of its rows (order ``0, I, 1, I+1, ...``), which onnxruntime constant-folds when the session loads.
- TensorRT copies (``*.trt.onnx``): :func:`expand_moe` replaces every such node by standard ops (router softmax,
  TopK, then the ``grouped`` form of prefill or the ``gather`` form of decode, :mod:`gdn_deploy.lm.mlp`), reading
  the same interleaved fc1 (TensorRT folds the interleave of the constant weights when it builds).
- ``split`` (:func:`expand_moe`, onnxruntime only, measured and not used by the exports): rows sorted by expert,
  one ``Gemm`` per expert on its constant weights, which onnxruntime pre-packs once per session where the op's CPU
  kernel packs every expert's weights on every call; docs/models.md (MoE prefill forms) has the numbers.

:func:`onnxruntime_moe_form` says which form the onnxruntime graphs use: ``"op"`` where the installed onnxruntime
runs the op (asked once per process with a two-expert model checked against numpy) and the model is float32, else
the TensorRT copies' form, which onnxruntime runs too. onnxruntime 1.32's CPU kernel takes float16 but was off the
float64 layer by 2.5e-2 (norm-relative) at 300 tokens where the ``grouped`` / ``gather`` forms of the same float16
layer were within 7e-4; it has no bfloat16 CPU kernel, and its CUDA kernel is not checked here: float16 and
bfloat16 exports keep the TensorRT forms.
"""
from __future__ import annotations

import functools

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from .onnx_graph import expand_nodes

__all__ = ["moe_translation", "moe_schema", "expand_moe", "onnxruntime_has_moe", "onnxruntime_moe_form",
           "tensorrt_moe_form", "MOE_DOMAIN"]

MOE_DOMAIN = "com.microsoft"
_T = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
_OP_DTYPES = ("torch.float32",)


def moe_schema() -> OpSchema:
    """The part of onnxruntime's ``MoE`` schema the export uses (for onnxscript and the checker)."""
    FP, Opt = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    ins = [FP("input", "T"), FP("router_probs", "T"), FP("fc1_experts_weights", "T"),
           FP("fc1_experts_bias", "T", param_option=Opt), FP("fc2_experts_weights", "T")]
    A = OpSchema.AttrType
    attrs = [OpSchema.Attribute("k", helper.make_attribute("k", 1), ""),
             OpSchema.Attribute("activation_type", helper.make_attribute("activation_type", "relu"), ""),
             OpSchema.Attribute("normalize_routing_weights", helper.make_attribute("normalize_routing_weights", 0),
                                ""),
             OpSchema.Attribute("swiglu_fusion", helper.make_attribute("swiglu_fusion", 0), ""),
             OpSchema.Attribute("activation_alpha", A.FLOAT, "", required=False),
             OpSchema.Attribute("activation_beta", A.FLOAT, "", required=False)]
    return OpSchema("MoE", MOE_DOMAIN, 1, "onnxruntime contrib MoE", inputs=ins, outputs=[FP("output", "T")],
                    type_constraints=[("T", _T, "")], attributes=attrs)


def _register() -> None:
    try:
        onnx.defs.get_schema("MoE", 1, MOE_DOMAIN)
    except onnx.defs.SchemaError:
        onnx.defs.register_schema(moe_schema())


def _moe_node(inputs: list[str], output: str, top_k: int, normalize: bool) -> onnx.NodeProto:
    return helper.make_node("MoE", inputs, [output], domain=MOE_DOMAIN, k=int(top_k), activation_type="swiglu",
                            normalize_routing_weights=int(bool(normalize)), swiglu_fusion=1, activation_alpha=1.0,
                            activation_beta=0.0)


@functools.lru_cache(maxsize=None)
def onnxruntime_has_moe() -> bool:
    """True when the installed onnxruntime's CPU provider runs ``com.microsoft::MoE`` as :func:`moe_translation`
    uses it: a two-expert float32 model (top-1, interleaved swiglu) run once and checked against numpy."""
    try:
        import numpy as np
        import onnxruntime as ort
        x = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
        logits = np.array([[3.0, 0.0], [0.0, 3.0]], np.float32)          # row 0 -> expert 0, row 1 -> expert 1
        gate = np.array([[[1.0, 0.0]], [[0.0, 1.0]]], np.float32)        # [E=2, I=1, H=2]
        up = np.array([[[0.5, 0.5]], [[1.0, -1.0]]], np.float32)
        fc1 = np.stack([gate, up], 2).reshape(2, 2, 2)                    # interleaved rows
        fc2 = np.array([[[1.0], [2.0]], [[-1.0], [1.0]]], np.float32)     # [E, H=2, I=1]
        f = TensorProto.FLOAT
        g = helper.make_graph([_moe_node(["x", "r", "w1", "", "w2"], "y", 1, True)], "probe",
                              [helper.make_tensor_value_info("x", f, [2, 2]),
                               helper.make_tensor_value_info("r", f, [2, 2])],
                              [helper.make_tensor_value_info("y", f, [2, 2])],
                              [onnx.numpy_helper.from_array(fc1, "w1"), onnx.numpy_helper.from_array(fc2, "w2")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MOE_DOMAIN, 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        y = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, {"x": x, "r": logits})[0]
        want = np.zeros_like(x)
        for t, e in ((0, 0), (1, 1)):
            h = gate[e, 0] @ x[t]
            want[t] = fc2[e, :, 0] * (h / (1 + np.exp(-h))) * (up[e, 0] @ x[t])
        return bool(np.allclose(y, want, rtol=1e-5, atol=1e-6))
    except Exception:  # noqa: BLE001  (no onnxruntime, no MoE kernel, or another layout)
        return False


def onnxruntime_moe_form(dtype, fallback: str) -> str:
    """``"op"`` when the onnxruntime graphs of a model in ``dtype`` (a torch dtype) compute MoE layers with
    ``com.microsoft::MoE``, else ``fallback`` (the graph's TensorRT form)."""
    return "op" if str(dtype) in _OP_DTYPES and onnxruntime_has_moe() else fallback


def tensorrt_moe_form(graph_name: str) -> str:
    """The form :func:`expand_moe` gives the MoE nodes of a graph file's TensorRT copy: ``grouped`` for prefill
    (many tokens: routed FLOPs, a bounded number of expert matrices gathered), ``gather`` for the others (decode,
    verify, draft: a few tokens, k expert matrices each)."""
    return "grouped" if graph_name.split(".")[0] == "prefill" else "gather"


def moe_translation(x, logits, gate_up_proj, down_proj, top_k: int, normalize: bool):
    """``gdn_export::moe`` -> fc1 interleaved from ``gate_up_proj`` + ``com.microsoft::MoE`` (torch dynamo)."""
    import onnxscript
    from onnxscript.onnx_opset import opset18 as op
    _register()
    moe = onnxscript.values.Op(onnxscript.values.Opset(MOE_DOMAIN, 1), "MoE", moe_schema())
    # fc1 row 2i = gate row i, row 2i+1 = up row i: one Gather of gate_up_proj's rows [0, I, 1, I+1, ...]
    two_i = op.Squeeze(op.Shape(gate_up_proj, start=1, end=2), op.Constant(value_ints=[0]))
    order = op.Range(op.Constant(value_int=0), two_i, op.Constant(value_int=1))
    order = op.Reshape(op.Transpose(op.Reshape(order, op.Constant(value_ints=[2, -1])), perm=[1, 0]),
                       op.Constant(value_ints=[-1]))
    fc1 = op.Gather(gate_up_proj, order, axis=1)
    return moe(x, logits, fc1, None, down_proj, k=int(top_k), activation_type="swiglu",
               normalize_routing_weights=int(bool(normalize)), swiglu_fusion=1, activation_alpha=1.0,
               activation_beta=0.0)


# ---- TensorRT copies ---------------------------------------------------------------------------------------
def _elem_type(g: onnx.GraphProto, name: str) -> int:
    """The element type of value ``name`` of graph ``g``: from an initializer, graph input or value_info, or
    through the layout-only node that makes it (Reshape, Transpose, ...)."""
    for t in g.initializer:
        if t.name == name:
            return t.data_type
    for v in [*g.input, *g.value_info, *g.output]:
        if v.name == name and v.type.tensor_type.elem_type:
            return v.type.tensor_type.elem_type
    for n in g.node:
        if name in n.output:
            if n.op_type in ("Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice"):
                return _elem_type(g, n.input[0])
            if n.op_type == "Cast":
                return next(int(helper.get_attribute_value(a)) for a in n.attribute if a.name == "to")
            if n.op_type == "Constant":
                return next(a.t.data_type for a in n.attribute if a.name == "value")
    raise ValueError(f"expand_moe: cannot tell the element type of {name!r}")


def _experts(g: onnx.GraphProto, n: onnx.NodeProto) -> int:
    """The expert count of MoE node ``n`` (dim 0 of its fc2 weights, an initializer or a typed value), 0 if unknown."""
    for t in g.initializer:
        if t.name == n.input[4]:
            return int(t.dims[0])
    for v in [*g.input, *g.value_info]:
        if v.name == n.input[4] and v.type.tensor_type.shape.dim:
            return int(v.type.tensor_type.shape.dim[0].dim_value)
    return 0


class _Builder:
    def __init__(self, tag: str):
        self.tag, self.nodes = tag, []

    def const(self, name: str, vals, dtype=TensorProto.INT64, scalar: bool = False) -> str:
        t = f"{self.tag}_{name}"
        dims = [] if scalar else [len(vals)]
        self.nodes.append(helper.make_node("Constant", [], [t], value=helper.make_tensor(t, dtype, dims, vals),
                                           name=t))
        return t

    def __call__(self, op: str, ins: list[str], name: str, n_out: int = 1, **kw):
        outs = [f"{self.tag}_{name}" + (f"_{i}" if n_out > 1 else "") for i in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=f"{self.tag}_{name}", **kw))
        return outs if n_out > 1 else outs[0]


def _expand_node(n: onnx.NodeProto, form: str, tag: str, dtype: int, experts: int) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    k, normalize = int(attrs.get("k", 1)), int(attrs.get("normalize_routing_weights", 0))
    x, logits, fc1, fc2 = n.input[0], n.input[1], n.input[2], n.input[4]
    out = n.output[0]
    b = _Builder(tag)
    F32, I64 = TensorProto.FLOAT, TensorProto.INT64
    ax1, axm1 = b.const("ax1", [1]), b.const("axm1", [-1])
    zero_s, one_s = b.const("zero_s", [0], scalar=True), b.const("one_s", [1], scalar=True)
    # routing (HF): softmax over the experts in float32, top-k, renormalised, weights in the model dtype
    probs = b("Softmax", [b("Cast", [logits], "lf", to=F32)], "probs", axis=-1)
    w, idx = b("TopK", [probs, b.const("k", [k])], "topk", n_out=2, axis=-1, largest=1, sorted=1)
    if normalize:
        w = b("Div", [w, b("ReduceSum", [w, axm1], "wsum", keepdims=1)], "wnorm")
    w = b("Cast", [w], "w", to=dtype)                                                       # [T, k]
    Hs = b("Shape", [x], "H", start=1, end=2)                                               # [1]
    Ts = b("Shape", [x], "T", start=0, end=1)

    Is = b("Shape", [fc2], "I", start=2, end=3)

    def swiglu(h: str, pre: str) -> str:        # h [a, b, 2I] interleaved (gate, up) -> silu(gate) * up [a, b, I]
        shape = b("Concat", [b("Shape", [h], f"{pre}_ab", start=0, end=2), Is, b.const(f"{pre}_two", [2])],
                  f"{pre}_sh", axis=0)
        pairs = b("Reshape", [h, shape], f"{pre}_h4")
        g = b("Gather", [pairs, zero_s], f"{pre}_g", axis=-1)
        u = b("Gather", [pairs, one_s], f"{pre}_u", axis=-1)
        return b("Mul", [b("Mul", [g, b("Sigmoid", [g], f"{pre}_sg")], f"{pre}_silu"), u], f"{pre}_a")

    if form == "gather":
        gu = b("Gather", [fc1, idx], "gu", axis=0)                                          # [T, k, 2I, H]
        xc = b("Unsqueeze", [x, b.const("ax13", [1, 3])], "xc")                              # [T, 1, H, 1]
        h = b("Squeeze", [b("MatMul", [gu, xc], "h1"), axm1], "h")                           # [T, k, 2I]
        a = swiglu(h, "act")                                                                # [T, k, I]
        dn = b("Gather", [fc2, idx], "dn", axis=0)                                          # [T, k, H, I]
        y = b("Squeeze", [b("MatMul", [dn, b("Unsqueeze", [a, axm1], "a1")], "y1"), axm1], "y")   # [T, k, H]
    elif form == "grouped":
        # lm.mlp Experts.grouped, integer bookkeeping in float32 (TensorRT's CumSum is float only)
        from ..lm.mlp import GROUPED_SLACK
        Es = b("Shape", [logits], "E", start=1, end=2)                                     # [1]
        ax0 = b.const("ax0", [0])
        one = b.const("one", [1])
        m = b("Mul", [Ts, b.const("kk", [k])], "m")
        m1 = b("Sub", [m, one], "m1")
        rows = b("Add", [b("Div", [m1, b("Mul", [Es, b.const("slack", [GROUPED_SLACK])], "sE")], "q"),
                         b.const("two", [2])], "rows")
        nb = b("Max", [b.const("two_b", [2]), b("Add", [one, b("Div", [b("Add", [m1, b(
            "Mul", [Es, b("Sub", [rows, one], "rows1")], "pad")], "num"), rows], "q2")], "nb1")], "nb")
        zeros_te = b("ConstantOfShape", [b("Shape", [logits], "TE")], "zte",
                     value=helper.make_tensor("z", F32, [1], [0.0]))
        ones_tk = b("ConstantOfShape", [b("Shape", [idx], "TK")], "otk", value=helper.make_tensor("o", F32, [1], [1.0]))
        chosen = b("ScatterElements", [zeros_te, idx, ones_tk], "chosen", axis=1)          # [T, E] 0/1
        before = b("Sub", [b("CumSum", [chosen, ax0], "cum"), chosen], "before")
        counts = b("ReduceSum", [chosen, ax0], "counts", keepdims=0)                        # [E] float
        blk = b("Range", [zero_s, b("Squeeze", [nb, ax0], "nbs"), one_s], "b")              # [nb]
        start_rows = b("Cast", [b("Mul", [blk, rows], "brows")], "brows_f", to=F32)         # [nb]
        blocks = b("ReduceSum", [b("Cast", [b("Less", [b("Unsqueeze", [start_rows, ax0], "br2"),
                                                         b("Unsqueeze", [counts, ax1], "c2")], "lt")], "ltf",
                                         to=F32), ax1], "blocks", keepdims=0)             # [E] ceil(counts/rows)
        end_f = b("CumSum", [blocks, ax0], "end_f")
        first = b("Cast", [b("Sub", [end_f, blocks], "first_f")], "first", to=I64)           # [E] first block
        tok = b("Range", [zero_s, b("Squeeze", [Ts, ax0], "Tsc"), one_s], "tok")           # [T]
        tok2 = b("Unsqueeze", [tok, ax1], "tok2")                                           # [T, 1]
        flat = b("Reshape", [b("Add", [b("Mul", [tok2, Es], "tE"), idx], "te"), b.const("flat", [-1])], "te1")
        rank = b("Cast", [b("Gather", [b("Reshape", [before, b.const("flat2", [-1])], "bf"), flat], "rank_f",
                            axis=0)], "rank", to=I64)                                       # [M]
        idx1 = b("Reshape", [idx, b.const("flat3", [-1])], "idx1")
        dest = b("Add", [b("Mul", [b("Gather", [first, idx1], "fb", axis=0), rows], "drow"), rank], "dest")
        nrows = b("Mul", [nb, rows], "nrows")
        src = b("ScatterElements", [b("ConstantOfShape", [nrows], "src0",
                                      value=helper.make_tensor("z64", I64, [1], [0])), dest,
                                    b("Reshape", [b("Expand", [tok2, b("Shape", [idx], "TK2")], "tokk"),
                                                  b.const("flat4", [-1])], "tok1")], "src", axis=0)
        le = b("LessOrEqual", [b("Unsqueeze", [end_f, ax0], "e2"), b("Unsqueeze", [b("Cast", [blk], "bf32", to=F32),
                                                                                    ax1], "b2")], "le")
        blk_e = b("Cast", [b("ReduceSum", [b("Cast", [le], "lef", to=F32), ax1], "be_f", keepdims=0)], "be", to=I64)
        blk_e = b("Min", [blk_e, b("Sub", [Es, one], "E1")], "blk_e")                     # [nb] expert of a block
        xb = b("Reshape", [b("Gather", [x, src], "xs", axis=0),
                           b("Concat", [nb, rows, Hs], "xb_sh", axis=0)], "xb")              # [nb, rows, H]
        w1t = b("Gather", [b("Transpose", [fc1], "fc1t", perm=[0, 2, 1]), blk_e], "w1b", axis=0)   # [nb, H, 2I]
        a = swiglu(b("MatMul", [xb, w1t], "hb"), "act")                                      # [nb, rows, I]
        w2t = b("Gather", [b("Transpose", [fc2], "fc2t", perm=[0, 2, 1]), blk_e], "w2b", axis=0)   # [nb, I, H]
        yb = b("Reshape", [b("MatMul", [a, w2t], "yb3"), b("Concat", [b.const("m1c", [-1]), Hs], "yb_sh", axis=0)],
               "yb")                                                                        # [nb*rows, H]
        y = b("Reshape", [b("Gather", [yb, dest], "yd", axis=0),
                          b("Concat", [Ts, b.const("kc", [k]), Hs], "y_sh", axis=0)], "y")   # [T, k, H]
    elif form == "split":
        if experts < 1:
            raise ValueError(f"expand_moe: form 'split' needs the expert count, unknown for {n.name!r}")
        y = _split_experts(b, x, idx, fc1, fc2, swiglu, k, Ts, Hs, experts)
    else:
        raise ValueError(f"expand_moe: form {form!r}, expected 'grouped', 'gather' or 'split'")
    b.nodes.append(helper.make_node("ReduceSum", [b("Mul", [y, b("Unsqueeze", [w, axm1], "w3")], "yw"), ax1],
                                    [out], name=f"{tag}_out", keepdims=0))
    return b.nodes


def _split_experts(b: _Builder, x: str, idx: str, fc1: str, fc2: str, swiglu, k: int, Ts: str, Hs: str,
                   n_exp: int) -> str:
    """The ``split`` form: the ``T*k`` rows sorted by expert (TopK of ``expert*M + row``), one ``Split`` by the
    experts' row counts, one ``Gemm`` per expert against its own constant weights (onnxruntime folds
    ``Gather(fc1, e)`` and pre-packs the Gemm's B once per session), the rows put back in token order. -> [T, k, H]"""
    I64 = TensorProto.INT64
    flat = b.const("sp_flat", [-1])
    e1 = b("Reshape", [idx, flat], "sp_e")                                                 # [M] expert of a row
    m = b("Shape", [e1], "sp_M")                                                           # [1]
    row = b("Range", [b.const("sp_z", [0], scalar=True), b("Squeeze", [m], "sp_Ms"),
                      b.const("sp_o", [1], scalar=True)], "sp_row")                        # [M]
    key = b("Add", [b("Mul", [e1, m], "sp_eM"), row], "sp_key")                            # unique, by expert
    _, order = b("TopK", [key, m], "sp_sort", n_out=2, axis=0, largest=0, sorted=1)         # [M] rows by expert
    tok = b("Div", [order, b.const("sp_k", [k])], "sp_tok")                                # token of each sorted row
    counts = b("ScatterElements", [b("ConstantOfShape", [b.const("sp_E", [n_exp])], "sp_c0",
                                     value=helper.make_tensor("z64", I64, [1], [0])),
                                   e1, b("ConstantOfShape", [m], "sp_ones",
                                         value=helper.make_tensor("o64", I64, [1], [1]))],
                       "sp_counts", axis=0, reduction="add")                               # [E] rows per expert
    xs = b("Gather", [x, tok], "sp_xs", axis=0)                                             # [M, H] sorted rows
    parts = b("Split", [xs, counts], "sp_xe", n_out=n_exp, axis=0)
    parts = parts if n_exp > 1 else [parts]
    h = b("Concat", [b("Gemm", [p, b("Gather", [fc1, b.const(f"sp_i{e}", [e], scalar=True)], f"sp_w1_{e}",
                                     axis=0)], f"sp_gu{e}", transB=1) for e, p in enumerate(parts)], "sp_h", axis=0)
    a = b("Squeeze", [swiglu(b("Unsqueeze", [h, b.const("sp_ax0", [0])], "sp_hu"), "sp_act"),
                      b.const("sp_ax0b", [0])], "sp_a")                                    # [M, I]
    parts = b("Split", [a, counts], "sp_ae", n_out=n_exp, axis=0)
    parts = parts if n_exp > 1 else [parts]
    ys = b("Concat", [b("Gemm", [p, b("Gather", [fc2, b.const(f"sp_j{e}", [e], scalar=True)], f"sp_w2_{e}",
                                     axis=0)], f"sp_dn{e}", transB=1) for e, p in enumerate(parts)], "sp_ys", axis=0)
    back = b("ScatterElements", [row, order, row], "sp_back", axis=0)                      # sorted place of a row
    return b("Reshape", [b("Gather", [ys, back], "sp_yr", axis=0),
                         b("Concat", [Ts, b.const("sp_kc", [k]), Hs], "sp_ysh", axis=0)], "sp_y")   # [T, k, H]


def expand_moe(model: onnx.ModelProto, form: str) -> int:
    """Replace (in place) every ``com.microsoft::MoE`` node of the main graph by standard ops computing the same
    (``form``: ``"grouped"``, ``"gather"`` or ``"split"``, see the module docstring; ``grouped`` needs >= 1 token,
    as a prefill has; ``split`` needs the expert count from the fc2 weights' shape); drops the com.microsoft opset
    import when no node of that domain is left. Returns the count."""
    g = model.graph
    count = expand_nodes(g, lambda n: n.domain == MOE_DOMAIN and n.op_type == "MoE",
                         lambda n, i: _expand_node(n, form, f"moe{i}", _elem_type(g, n.input[4]), _experts(g, n)))
    if not count:
        return 0
    if not any(n.domain == MOE_DOMAIN for n in g.node):
        keep = [o for o in model.opset_import if o.domain != MOE_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return count
