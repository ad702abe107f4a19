"""ONNX forms of :func:`gdn_deploy.lm.cache_attention.cache_attention` (attention of new tokens against a KV cache).

- onnxruntime graphs (``prefill.onnx`` / ``decode.onnx``): one ``com.microsoft::GroupQueryAttention`` node
  (:func:`cache_attention_translation`), the op onnxruntime-genai's builder emits: fused CPU and CUDA kernels,
  per-sequence ``seqlens_k`` (= past + L - 1) and ``total_sequence_length`` (= max(past) + L), past and present
  caches of one shape ``[N, Hkv, S, D]`` (a runtime may bind both to one buffer: the cache is then updated in
  place). onnxruntime 1.32's CPU kernel refuses a batch of more than one sequence when a prompt continues from a
  past (``sequence_length > 1`` with past context): runtimes continue such batches one sequence at a time
  (:func:`gdn_deploy.runtime.generation.prefill`); fresh prompts and decode steps run batched.
- TensorRT copies (``*.trt.onnx``): :func:`expand_cache_attention` replaces every such node by the standard ops the
  TensorRT parser imports: each new key/value row written into its cache slot by ``ScatterND`` (one row per token,
  the cache is not rewritten), then the ONNX ``Attention`` operator (opset 23; TensorRT's ``IAttention``) of the
  queries ``[N, H, L, D]`` against the caches with a per-sequence boolean mask ``[N, 1, L, S]`` (slot <= the
  query's position). Nothing is sized by all packed tokens squared in either form.

``ATTENTION_FORMS`` is what the sidecar records per graph file (``attention``).
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from .onnx_graph import expand_nodes

__all__ = ["cache_attention_translation", "gqa_schema", "expand_cache_attention", "ATTENTION_FORMS",
           "GQA_DOMAIN", "ATTENTION_OPSET", "onnxruntime_attention_form", "fit_for_onnxruntime"]

GQA_DOMAIN = "com.microsoft"
ATTENTION_OPSET = 23            # the standard Attention operator of the TensorRT copies
ATTENTION_FORMS = {
    "onnxruntime": {"op": "com.microsoft::GroupQueryAttention", "cache_layout": "[B, Hkv, S, D]",
                    "cache_update": "in the op (past and present caches of one shape: bindable to one buffer)",
                    "limit": "a prompt continuing from a past runs one sequence per call (onnxruntime CPU)"},
    "tensorrt": {"op": f"onnx::Attention (opset {ATTENTION_OPSET})", "cache_layout": "[B, Hkv, S, D]",
                 "cache_update": "ScatterND rows (one per new token)", "mask": "per-sequence bool [N, 1, L, S]"},
}
_T = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
GQA_HEAD_MULTIPLE = 8           # onnxruntime's GroupQueryAttention kernels need head_size % 8 == 0


def onnxruntime_attention_form(head_dim: int) -> str:
    """The ATTENTION_FORMS key the onnxruntime graphs use for this head size: GroupQueryAttention where its
    kernels take the head size, else the standard form of the TensorRT copies (onnxruntime runs it too)."""
    return "onnxruntime" if int(head_dim) % GQA_HEAD_MULTIPLE == 0 else "tensorrt"


def fit_for_onnxruntime(model: onnx.ModelProto, input_shapes: dict) -> int:
    """Expand (in place) the GroupQueryAttention nodes whose head size onnxruntime's kernels refuse (the size read
    from the key cache input's last dim in ``input_shapes``: name -> shape list). Returns the count."""
    def refused(n: onnx.NodeProto) -> bool:
        shape = input_shapes.get(n.input[3]) or []
        return bool(shape) and isinstance(shape[-1], int) and onnxruntime_attention_form(shape[-1]) != "onnxruntime"
    return expand_cache_attention(model, only=refused)


def gqa_schema() -> OpSchema:
    """The part of onnxruntime's ``GroupQueryAttention`` schema the export uses (for onnxscript and the checker)."""
    FP, Opt = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    ins = [FP("query", "T"), FP("key", "T", param_option=Opt), FP("value", "T", param_option=Opt),
           FP("past_key", "T", param_option=Opt), FP("past_value", "T", param_option=Opt),
           FP("seqlens_k", "M"), FP("total_sequence_length", "M")]
    attrs = [OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "", required=True),
             OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, "", required=True),
             OpSchema.Attribute("scale", helper.make_attribute("scale", 0.0), "")]
    return OpSchema("GroupQueryAttention", GQA_DOMAIN, 1, "onnxruntime contrib GroupQueryAttention", inputs=ins,
                    outputs=[FP("output", "T"), FP("present_key", "T"), FP("present_value", "T")],
                    type_constraints=[("T", _T, ""), ("M", ["tensor(int32)"], "")], attributes=attrs)


def _register() -> None:
    try:
        onnx.defs.get_schema("GroupQueryAttention", 1, GQA_DOMAIN)
    except onnx.defs.SchemaError:
        onnx.defs.register_schema(gqa_schema())


def cache_attention_translation(q, k, v, k_cache, v_cache, past, num_heads: int, kv_heads: int, scale: float):
    """``gdn_export::cache_attention`` -> ``com.microsoft::GroupQueryAttention`` (torch dynamo exporter)."""
    import onnxscript
    from onnxscript.onnx_opset import opset18 as op
    _register()
    gqa = onnxscript.values.Op(onnxscript.values.Opset(GQA_DOMAIN, 1), "GroupQueryAttention", gqa_schema())
    L = op.Shape(q, start=1, end=2)                                             # [1] int64
    p = op.Cast(past, to=TensorProto.INT64)
    seqlens = op.Cast(op.Sub(op.Add(p, L), op.Constant(value_ints=[1])), to=TensorProto.INT32)
    total = op.Cast(op.Add(op.ReduceMax(p, keepdims=0), op.Squeeze(L, op.Constant(value_ints=[0]))),
                    to=TensorProto.INT32)
    return gqa(q, k, v, k_cache, v_cache, seqlens, total, num_heads=int(num_heads), kv_num_heads=int(kv_heads),
               scale=float(scale), _num_outputs=3)


def _expand_node(n: onnx.NodeProto, tag: str) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    H, Hkv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    scale = float(attrs.get("scale", 0.0))
    q, k, v, pk, pv, seqlens = n.input[:6]
    out, pres_k, pres_v = n.output[:3]
    t = lambda s: f"{tag}_{s}"                                                 # noqa: E731
    nodes = []

    def c(name, vals):
        nodes.append(helper.make_node("Constant", [], [t(name)], value=helper.make_tensor(
            t(name), TensorProto.INT64, [len(vals)], vals), name=t(name)))
        return t(name)

    def c0(name, val):
        nodes.append(helper.make_node("Constant", [], [t(name)], value=helper.make_tensor(
            t(name), TensorProto.INT64, [], [val]), name=t(name)))
        return t(name)

    def nd(op, ins, name, **kw):
        nodes.append(helper.make_node(op, ins, [t(name)], name=t(name), **kw))
        return t(name)

    ax0, ax1, axm1, one = c("ax0", [0]), c("ax1", [1]), c("axm1", [-1]), c("one", [1])
    zero_s, one_s = c0("zero_s", 0), c0("one_s", 1)
    L = nd("Shape", [q], "L", start=1, end=2)                                   # [1]
    N = nd("Shape", [q], "N", start=0, end=1)
    S = nd("Shape", [pk], "S", start=2, end=3)
    past = nd("Sub", [nd("Cast", [seqlens], "sl64", to=TensorProto.INT64), nd("Sub", [L, one], "Lm1")], "past")
    steps = nd("Range", [zero_s, nd("Squeeze", [L, ax0], "Ls"), one_s], "steps")             # [L]
    pos = nd("Add", [nd("Unsqueeze", [past, ax1], "past2"), nd("Unsqueeze", [steps, ax0], "steps2")], "pos")
    # ScatterND indices [N, L, Hkv, 3] = (n, h, pos[n, l]); updates [N, L, Hkv, D]
    shp = nd("Concat", [N, L, c("hkv", [Hkv])], "idx_shape", axis=0)
    n_i = nd("Reshape", [nd("Range", [zero_s, nd("Squeeze", [N, ax0], "Ns"), one_s], "n_r"), c("n_sh", [-1, 1, 1])],
             "n_i")
    h_i = nd("Reshape", [nd("Range", [zero_s, c0("hkv_s", Hkv), one_s], "h_r"), c("h_sh", [1, 1, -1])], "h_i")
    p_i = nd("Unsqueeze", [pos, axm1], "p_i")
    parts = [nd("Unsqueeze", [nd("Expand", [x, shp], f"{x}_e"), axm1], f"{x}_u") for x in (n_i, h_i, p_i)]
    idx = nd("Concat", parts, "idx", axis=-1)
    rows = c("rows", [0, 0, Hkv, -1])
    nodes.append(helper.make_node("ScatterND", [pk, idx, nd("Reshape", [k, rows], "k4")], [pres_k], name=t("wk")))
    nodes.append(helper.make_node("ScatterND", [pv, idx, nd("Reshape", [v, rows], "v4")], [pres_v], name=t("wv")))
    # Attention: q [N, H, L, D] vs caches [N, Hkv, S, D], mask [N, 1, L, S]: slot <= position
    slots = nd("Range", [zero_s, nd("Squeeze", [S, ax0], "Ss"), one_s], "slots")
    mask = nd("LessOrEqual", [nd("Unsqueeze", [slots, c("ax01", [0, 1])], "slots3"),
                              nd("Unsqueeze", [pos, axm1], "pos3")], "mask3")                  # [N, L, S]
    mask = nd("Unsqueeze", [mask, ax1], "mask")
    q4 = nd("Transpose", [nd("Reshape", [q, c("qsh", [0, 0, H, -1])], "q4")], "qt", perm=[0, 2, 1, 3])
    att_kw = {"scale": scale} if scale else {}
    y = nd("Attention", [q4, pres_k, pres_v, mask], "y", softmax_precision=TensorProto.FLOAT, **att_kw)
    yt = nd("Transpose", [y], "yt", perm=[0, 2, 1, 3])
    nodes.append(helper.make_node("Reshape", [yt, c("osh", [0, 0, -1])], [out], name=t("out")))
    return nodes


def expand_cache_attention(model: onnx.ModelProto, only=None) -> int:
    """Replace (in place) every ``com.microsoft::GroupQueryAttention`` node of the main graph (those for which
    ``only(node)`` holds, if given) by ScatterND row writes + the standard ``Attention`` (see the module
    docstring); raises the default opset to :data:`ATTENTION_OPSET` when a node was replaced and drops the
    com.microsoft opset import when no such node is left. Returns the count."""
    g = model.graph
    count = expand_nodes(g, lambda n: n.domain == GQA_DOMAIN and n.op_type == "GroupQueryAttention"
                         and (only is None or only(n)), lambda n, i: _expand_node(n, f"cache_attn{i}"))
    if not count:
        return 0
    keep = []
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(int(o.version), ATTENTION_OPSET)
        if o.domain != GQA_DOMAIN or any(n.domain == GQA_DOMAIN for n in g.node):
            keep.append(o)
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return count
