"""The ONNX operators a gdn-export graph may contain: every one runs in onnxruntime's CPU provider and is imported
by the TensorRT 10.x ONNX parser (onnx-tensorrt ``docs/operators.md`` of TensorRT 10.1: "Y" for each, the oldest
10.x list, so later 10.x parsers take them too), plus the gdn custom ops that become the TensorRT plugins.

:func:`graph_op_problems` lists what in a model breaks that promise: an operator outside :data:`ALLOWED_OPS`, or
one of the parser's restrictions on the operators we use (``axes`` of Squeeze / Unsqueeze / Slice / Reduce* and
the ``axis`` of CumSum from initializers or constants; TopK ``sorted=1`` with ``K < 3840``).
onnxruntime graphs may also hold ``com.microsoft::GroupQueryAttention`` and ``com.microsoft::MoE`` (``ORT_ONLY_OPS``:
their TensorRT copies replace them, :func:`gdn_deploy.export.onnx_cache_attention.expand_cache_attention`,
:func:`gdn_deploy.export.onnx_moe.expand_moe`); pass ``onnxruntime=True``.
The gdn nodes' function bodies are onnxruntime's alone (the TensorRT copies drop them: plugins); besides standard
ops the dense-state decode body may hold ``com.microsoft::LinearAttention`` (``ORT_BODY_OPS``,
:mod:`gdn_deploy.export.onnx_functions`). ``tests/export/test_hybrid_export.py`` holds every exported graph to it.
"""
from __future__ import annotations

import onnx

from .onnx_graph import graph_constants

__all__ = ["ALLOWED_OPS", "GDN_OPS", "ORT_ONLY_OPS", "ORT_BODY_OPS", "graph_op_problems"]

GDN_OPS = frozenset({"GatedDeltaPrefill", "GatedDeltaDecode"})
ORT_ONLY_OPS = frozenset({("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "MoE")})
ORT_BODY_OPS = frozenset({("com.microsoft", "LinearAttention")})     # inside gdn decode function bodies only
ALLOWED_OPS = frozenset({
    # tensor plumbing
    "Shape", "Reshape", "Squeeze", "Unsqueeze", "Slice", "Concat", "Split", "Transpose", "Expand", "Tile",
    "Gather", "GatherND", "ScatterElements", "Range", "Cast", "Constant", "ConstantOfShape", "Identity",
    # arithmetic and comparisons
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Max", "Min", "Clip",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Not", "Where",
    # activations, reductions, products
    "Sigmoid", "Softplus", "Tanh", "Erf", "Softmax", "Cos", "Sin", "ReduceSum", "ReduceMean", "ReduceMax",
    "TopK", "MatMul", "Gemm",
    # MoE "grouped" prefill (gdn_deploy.lm.mlp): float CumSum (the parser's CumSum takes FP32/FP16/BF16 only)
    "CumSum",
    # attention of the TensorRT copies (gdn_deploy.export.onnx_cache_attention): cache rows written by ScatterND,
    # then the opset-23 Attention, which the parser imports as IAttention from TensorRT 10.15 (older 10.x parsers
    # do not import Attention; no TensorRT is installed here to confirm the exact release)
    "ScatterND", "Attention",
})
_AXES_INPUT = {"Squeeze": 1, "Unsqueeze": 1, "ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "Slice": 3,
               "CumSum": 1}
TOPK_MAX = 3840


def graph_op_problems(model: onnx.ModelProto, onnxruntime: bool = False) -> list[str]:
    """Problems of the main graph of ``model`` for onnxruntime + the TensorRT parser (empty: none);
    ``onnxruntime``: the graph is an onnxruntime one (``ORT_ONLY_OPS`` allowed)."""
    g = model.graph
    consts, values = graph_constants(g)
    out = []
    for n in g.node:
        if n.domain not in ("", "ai.onnx"):
            if onnxruntime and (n.domain, n.op_type) in ORT_ONLY_OPS:
                continue
            if not (n.domain == "gdn" and n.op_type in GDN_OPS):
                out.append(f"{n.name}: {n.domain}::{n.op_type} is not an ONNX or gdn operator")
            continue
        if n.op_type not in ALLOWED_OPS:
            out.append(f"{n.name}: {n.op_type} is not in ALLOWED_OPS (onnxruntime CPU + TensorRT 10.x parser)")
            continue
        k = _AXES_INPUT.get(n.op_type)
        if k is not None and len(n.input) > k and n.input[k] and n.input[k] not in consts:
            out.append(f"{n.name}: {n.op_type}'s axes input {n.input[k]!r} is computed; TensorRT needs an initializer")
        if n.op_type == "TopK":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if int(attrs.get("sorted", 1)) != 1:
                out.append(f"{n.name}: TopK with sorted=0; TensorRT needs sorted=1")
            kt = values.get(n.input[1]) if len(n.input) > 1 else None
            if kt is None:
                out.append(f"{n.name}: TopK's K is computed; TensorRT needs a constant K")
            elif int(onnx.numpy_helper.to_array(kt).reshape(-1)[0]) >= TOPK_MAX:
                out.append(f"{n.name}: TopK K >= {TOPK_MAX}")
    return out
