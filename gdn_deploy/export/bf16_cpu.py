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

IN_MEMORY_BYTES = 1 << 30     # bigger models keep their bf16 weights, cast when the session loads (cpu_session)


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


def float32_compute(model: Any, weights: str = "convert"):
    """A copy of ``model`` (ModelProto or path) that onnxruntime's CPU provider runs: see the module doc. Its
    inputs and outputs keep their names and dtypes. ``weights``: ``"convert"`` (a path's external data loaded; bf16
    initializers become float32 ones) or ``"cast"`` (a path's external data left where it is; bf16 initializers
    kept, each read through a ``Cast`` to float32, which onnxruntime folds into a float32 constant when the
    session loads: no float32 copy of the weights in Python or on disk)."""
    import onnx
    from onnx import helper

    from .onnx_graph import names_read
    if weights not in ("convert", "cast"):
        raise ValueError(f"weights={weights!r}: expected 'convert' or 'cast'")
    m = onnx.ModelProto()
    m.CopyFrom(model if isinstance(model, onnx.ModelProto) else
               onnx.load(str(model), load_external_data=weights == "convert"))
    g, bf16, f32 = m.graph, onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    ins = [v.name for v in g.input if v.type.tensor_type.elem_type == bf16]
    outs = [v.name for v in g.output if v.type.tensor_type.elem_type == bf16]
    cast_weights = [t.name for t in g.initializer if t.data_type == bf16] if weights == "cast" else []
    rename = {n: f"{n}__as_float32" for n in [*ins, *outs, *cast_weights]}
    if weights == "convert":
        for t in g.initializer:
            _tensor_to_float(t)
    del g.value_info[:]
    _rewrite_nodes(g.node, rename)
    for f in m.functions:
        del f.value_info[:]
        _rewrite_nodes(f.node, {})
    cast = {n: helper.make_node("Cast", [n], [rename[n]], to=f32, name=f"{n}__cast_in") for n in [*cast_weights, *ins]}
    tail = [helper.make_node("Cast", [rename[n]], [n], to=bf16, name=f"{n}__cast_out") for n in outs]
    nodes = [cast.pop(n) for n in ins]
    by_new = {rename[n]: n for n in cast_weights}
    for node in g.node:                        # each weight's Cast just before its first reader (file order)
        for x in names_read(node):
            if x in by_new and by_new[x] in cast:
                nodes.append(cast.pop(by_new[x]))
        nodes.append(node)
    nodes = [*cast.values(), *nodes, *tail]    # weights no node reads: cast first, as before
    del g.node[:]
    g.node.extend(nodes)
    return m


def cpu_session(path, options=None, fold_weights: bool = True):
    """An onnxruntime CPU session of the bf16 graph file ``path`` computed in float32 (:func:`float32_compute`).

    A file whose weights exceed ``IN_MEMORY_BYTES`` (a real-size model, whose float32 copy would also pass
    protobuf's 2 GB limit) keeps its bf16 weights where they are: the rewritten graph alone goes to onnxruntime,
    which reads the file's external data from its folder and casts each weight to float32 once when the session
    loads (``weights="cast"``; nothing is written to disk). ``options`` then also get the folder as their
    ``session.model_external_initializers_file_folder_path``. With ``fold_weights=False`` (a session run once, as
    a check's) onnxruntime's constant folding is off, so that each weight is cast in the call, just before its
    first reader, and freed after its last: the session holds the bf16 weights (memory-mapped from the file)
    instead of their float32 copies (Qwen3.5-9B: 18 GB instead of 36 GB)."""
    import os
    from pathlib import Path

    import onnx

    from .runtimes import onnxruntime_session, session_options
    head = onnx.load(str(path), load_external_data=False)
    size = 0
    for t in head.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            length = [int(e.value) for e in t.external_data if e.key == "length"]
            size += length[0] if length else IN_MEMORY_BYTES + 1       # no length: as big as the file may be
        else:
            size += len(t.raw_data)
    if size <= IN_MEMORY_BYTES:
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(head, os.fspath(Path(path).resolve().parent))
        return onnxruntime_session(float32_compute(head), ("CPUExecutionProvider",), options)
    m = float32_compute(head, weights="cast")
    del head
    opts = options if options is not None else session_options()
    if not fold_weights:
        # onnxruntime's priority-based order runs every weight's Cast at the start (each is ready then), holding
        # all the float32 copies at once (a 4-layer Qwen3.5-9B-wide prefill: 6.4 GB peak against 3.2 GB); its
        # default order (a walk back from the outputs) runs each Cast just before its reader
        import onnxruntime as ort
        opts.execution_order = ort.ExecutionOrder.DEFAULT
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                  os.fspath(Path(path).resolve().parent))
    return onnxruntime_session(m, ("CPUExecutionProvider",), opts,
                               disabled_optimizers=() if fold_weights else ("ConstantFolding",))
