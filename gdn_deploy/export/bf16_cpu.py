"""Run a bf16 graph on onnxruntime's CPU provider: the same graph computed in float32, bf16 at its inputs/outputs.

onnxruntime's CPU provider has bfloat16 kernels for data movement only (Cast, Reshape, Gather, ...), none for
MatMul, Add, Exp, ... (its automatic float16 fallback does not cover bfloat16), so a bf16 export does not load there.
:func:`float32_compute` rewrites a bf16 model in memory: every bf16 weight and constant becomes the float32 of the
same value (exact), every ``Cast(to=bfloat16)`` inside the graph and its functions becomes ``Cast(to=float)``, and
the graph's bf16 inputs and outputs keep their type through a ``Cast`` at the boundary. The weights are the exported
bf16 ones; the activations are not rounded to bf16 between ops, so the result is the bf16 model's float32 arithmetic,
the quantity the float32 reference of an export folder holds (:mod:`.verify`). TensorRT runs the files as they are.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["has_bfloat16", "float32_compute", "cpu_session"]

IN_MEMORY_BYTES = 1 << 30     # bigger converted models go through a temporary file (protobuf stops at 2 GB)


def has_bfloat16(model) -> bool:
    """Whether a ModelProto has bfloat16 graph inputs, outputs or initializers."""
    import onnx
    bf16 = onnx.TensorProto.BFLOAT16
    return any(v.type.tensor_type.elem_type == bf16 for v in [*model.graph.input, *model.graph.output]) or \
        any(t.data_type == bf16 for t in model.graph.initializer)


def _tensor_to_float(t) -> None:
    import onnx
    from onnx import numpy_helper
    if t.data_type != onnx.TensorProto.BFLOAT16:
        return
    if t.raw_data:
        bits = np.frombuffer(t.raw_data, dtype=np.uint16)
    else:
        bits = np.asarray(t.int32_data, dtype=np.uint32).astype(np.uint16)
    arr = (bits.astype(np.uint32) << 16).view(np.float32).reshape(tuple(t.dims))
    t.CopyFrom(numpy_helper.from_array(arr, t.name))


def _rewrite_nodes(nodes, rename: dict[str, str]) -> None:
    import onnx
    bf16, f32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    for n in nodes:
        for i, x in enumerate(n.input):
            if x in rename:
                n.input[i] = rename[x]
        for i, x in enumerate(n.output):
            if x in rename:
                n.output[i] = rename[x]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == bf16:
                a.i = f32
            elif a.type == onnx.AttributeProto.TENSOR:
                _tensor_to_float(a.t)
            elif a.type == onnx.AttributeProto.TENSORS:
                for t in a.tensors:
                    _tensor_to_float(t)
            elif a.type == onnx.AttributeProto.GRAPH:
                _rewrite_graph(a.g, rename)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rewrite_graph(g, rename)


def _rewrite_graph(g, rename: dict[str, str]) -> None:
    """A subgraph: its weights, casts, value types to float32 (its own inputs/outputs included)."""
    import onnx
    for t in g.initializer:
        _tensor_to_float(t)
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    _rewrite_nodes(g.node, rename)


def float32_compute(model: Any):
    """A copy of ``model`` (ModelProto or path; external data loaded) that onnxruntime's CPU provider runs: see the
    module doc. Its inputs and outputs keep their names and dtypes."""
    import onnx
    from onnx import helper
    m = onnx.ModelProto()
    m.CopyFrom(model if isinstance(model, onnx.ModelProto) else onnx.load(str(model)))
    g, bf16, f32 = m.graph, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    ins = [v.name for v in g.input if v.type.tensor_type.elem_type == bf16]
    outs = [v.name for v in g.output if v.type.tensor_type.elem_type == bf16]
    rename = {n: f"{n}__as_float32" for n in [*ins, *outs]}
    for t in g.initializer:
        _tensor_to_float(t)
    del g.value_info[:]
    _rewrite_nodes(g.node, rename)
    for f in m.functions:
        del f.value_info[:]
        _rewrite_nodes(f.node, {})
    head = [helper.make_node("Cast", [n], [rename[n]], to=f32, name=f"{n}__cast_in") for n in ins]
    tail = [helper.make_node("Cast", [rename[n]], [n], to=bf16, name=f"{n}__cast_out") for n in outs]
    nodes = [*head, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
    return m


def cpu_session(path, options=None):
    """An onnxruntime CPU session of the bf16 graph file ``path`` computed in float32 (:func:`float32_compute`)."""
    import tempfile
    from pathlib import Path

    import onnx

    from .runtimes import onnxruntime_session
    m = float32_compute(path)
    # weights first: protobuf cannot even size (ByteSize) a message over 2 GB, a real-size model's case
    if sum(len(t.raw_data) for t in m.graph.initializer) <= IN_MEMORY_BYTES and m.ByteSize() <= IN_MEMORY_BYTES:
        return onnxruntime_session(m, ("CPUExecutionProvider",), options)
    with tempfile.TemporaryDirectory(prefix="gdn_bf16_cpu_") as tmp:
        f = Path(tmp) / Path(path).name
        onnx.save_model(m, str(f), save_as_external_data=True, location=f.name + ".data")
        del m
        return onnxruntime_session(f, ("CPUExecutionProvider",), options)
