"""RMS norms in the form onnxruntime fuses: ``x / Sqrt(v)`` instead of ``x * Reciprocal(Sqrt(v))``.

PyTorch's ``x * torch.rsqrt(mean(x^2) + eps)`` (every RMSNorm of :mod:`gdn_deploy.lm.norms`) exports as
``Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul(x, .) -> Mul(., weight)``: seven nodes per norm, 98 of the
372 in the ``mid`` decode step. onnxruntime's ``SimplifiedLayerNormFusion`` (graph optimization level basic and
up, every provider) turns ``Pow -> ReduceMean -> Add -> Sqrt -> Div(x, .) -> Mul(., weight)`` into one
``SimplifiedLayerNormalization`` node, but not the Reciprocal form. :func:`rsqrt_mul_as_div` rewrites each
``Mul(x, Reciprocal(Sqrt(v)))`` of the main graph whose Reciprocal feeds only that Mul into ``Div(x, Sqrt(v))``
(standard ONNX, in the allowlist; TensorRT copies get the same graph). In float32 the two differ by rounding only
(one division instead of a reciprocal and a product). Function bodies are left as they are.
"""
from __future__ import annotations

import onnx

__all__ = ["rsqrt_mul_as_div"]

_STD = ("", "ai.onnx")


def rsqrt_mul_as_div(graph: onnx.GraphProto) -> int:
    """Rewrite ``Mul(x, Reciprocal(Sqrt(v)))`` (either input order) into ``Div(x, Sqrt(v))`` in place where the
    Reciprocal's output has no other reader and is not a graph output; the Reciprocal is removed. Returns the
    number of Muls rewritten."""
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
        for a in n.attribute:                       # subgraphs read outer values too: keep those untouched
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                for sub in g.node:
                    for x in sub.input:
                        readers[x] = readers.get(x, 0) + 2
    outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    count = 0
    for n in graph.node:
        if n.op_type != "Mul" or n.domain not in _STD or len(n.input) != 2:
            continue
        for j in (0, 1):
            r = producer.get(n.input[j])
            if r is None or r.op_type != "Reciprocal" or r.domain not in _STD or id(r) in dropped:
                continue
            if readers.get(r.output[0], 0) != 1 or r.output[0] in outputs:
                continue
            s = producer.get(r.input[0])
            if s is None or s.op_type != "Sqrt" or s.domain not in _STD:
                continue
            x = n.input[1 - j]
            n.op_type = "Div"
            del n.input[:]
            n.input.extend([x, s.output[0]])
            dropped.add(id(r))
            count += 1
            break
    if dropped:
        gone = {n.output[0] for n in graph.node if id(n) in dropped}
        keep = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(keep)
        infos = [v for v in graph.value_info if v.name not in gone]
        del graph.value_info[:]
        graph.value_info.extend(infos)
    return count
