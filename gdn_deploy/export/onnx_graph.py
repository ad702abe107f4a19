"""Building blocks of the gdn ONNX function bodies: a node builder and the shared input preparation.

:class:`GraphBuilder` collects ``NodeProto``s with names unique across a function and all its
subgraphs. :func:`prepare_inputs` is the op contract's input stage in standard ONNX ops (float32
casts, raw gates, L2 norm, scale); :func:`repeat_heads` expands q/k heads to the value heads (GVA).
"""
from __future__ import annotations

import math

from typing import Any

import onnx
from onnx import TensorProto, helper

from ..spec import GATE_RAW

__all__ = ["GraphBuilder", "value_info", "prepare_inputs", "repeat_heads", "expand_nodes", "names_read",
           "graph_constants", "FLOAT", "INT64"]

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64


class GraphBuilder:
    """Collects NodeProtos; value names are unique across a function and all its subgraphs."""

    def __init__(self, counter: list[int] | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self._counter = counter if counter is not None else [0]

    def sub(self) -> "GraphBuilder":
        """A builder for a subgraph (Loop/Scan/If body) sharing this one's name counter."""
        return GraphBuilder(self._counter)

    def name(self, hint: str) -> str:
        self._counter[0] += 1
        return f"{hint}__{self._counter[0]}"

    def __call__(self, op_type: str, *inputs: str, n_out: int = 1, hint: str | None = None,
                 outputs: list[str] | None = None, **attrs: Any):
        outs = outputs or [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def ints(self, *values: int) -> str:
        """Constant int64 vector."""
        return self.const_i64(list(values), [len(values)])

    def const_i64(self, values: list[int], dims: list[int], hint: str = "ints") -> str:
        return self("Constant", value=helper.make_tensor("c", INT64, dims, values), hint=hint)

    def scalar_i64(self, value: int) -> str:
        return self("Constant", value=helper.make_tensor("c", INT64, [], [value]), hint="i64")

    def scalar_f(self, value: float) -> str:
        return self("Constant", value=helper.make_tensor("c", FLOAT, [], [value]), hint="f32")

    def const_bool(self, values: list[bool], dims: list[int], hint: str = "mask") -> str:
        return self("Constant", value=helper.make_tensor("c", TensorProto.BOOL, dims, values), hint=hint)

    def attr_f(self, attr: str) -> str:
        """Constant float taken from the function attribute ``attr`` (ref_attr_name)."""
        ref = onnx.AttributeProto(name="value_float", ref_attr_name=attr, type=onnx.AttributeProto.FLOAT)
        node = helper.make_node("Constant", [], [self.name(attr)])
        node.attribute.append(ref)
        self.nodes.append(node)
        return node.output[0]


def expand_nodes(graph: onnx.GraphProto, match, expand) -> int:
    """Replace (in place) every node of ``graph`` for which ``match(node)`` holds by the nodes
    ``expand(node, index)`` returns (``index`` counts the replaced nodes from 0). Returns the count."""
    new, count = [], 0
    for n in graph.node:
        if match(n):
            new += expand(n, count)
            count += 1
        else:
            new.append(n)
    if count:
        del graph.node[:]
        graph.node.extend(new)
    return count


def names_read(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads, with every name its subgraphs (If/Loop/Scan bodies) read, outer values included."""
    out = set(node.input)
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in sub.node:
                out |= names_read(n)
    return out


def graph_constants(graph: onnx.GraphProto) -> tuple[set[str], dict[str, onnx.TensorProto]]:
    """The names of ``graph``'s constants (initializers and ``Constant`` outputs) and the tensors that hold them
    (a ``Constant`` by its ``value`` attribute)."""
    names = {t.name for t in graph.initializer}
    values = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            names.update(n.output)
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = a.t
    return names, values


def value_info(name: str, rank: int, elem: int = FLOAT) -> onnx.ValueInfoProto:
    """Subgraph I/O: element type and rank, every dimension unknown."""
    return helper.make_tensor_value_info(name, elem, [None] * rank)


def prepare_inputs(b: GraphBuilder, q: str, k: str, v: str, g: str, beta: str, A_log: str | None,
                   dt_bias: str | None, attrs: dict[str, Any],
                   k_dim: int | None = None) -> tuple[str, str, str, str, str]:
    """float32 q (L2 norm, scale), k (L2 norm), v, log decay g and beta; q/k keep their Hk heads.

    Rows first, as the inputs: q, k [rows, Hk, K], v [rows, Hv, V], g, beta [rows, Hv]. ``k_dim``: K when the body
    is built for a static K (the default scale 1/sqrt(K) a constant, which a runtime folds), else read from q.
    """
    qf, kf, vf = (b("Cast", x, to=FLOAT, hint=n) for x, n in ((q, "qf"), (k, "kf"), (v, "vf")))
    gf, bf = b("Cast", g, to=FLOAT, hint="gf"), b("Cast", beta, to=FLOAT, hint="bf")
    if int(attrs["gate_mode"]) == GATE_RAW:
        decay = b("Neg", b("Exp", b("Cast", A_log, to=FLOAT)))
        gf = b("Mul", decay, b("Softplus", b("Add", gf, b("Cast", dt_bias, to=FLOAT))), hint="g_raw")
        bf = b("Sigmoid", bf, hint="beta_raw")
    scale_attr = b.attr_f("scale")
    if k_dim:
        default_scale = b.scalar_f(1.0 / math.sqrt(k_dim))
    else:
        default_scale = b("Reciprocal", b("Sqrt", b("Cast", b("Shape", q, start=2, end=3), to=FLOAT, hint="k_dim")))
    scale = b("Where", b("Equal", scale_attr, b.scalar_f(0.0)), default_scale, scale_attr, hint="scale")
    if not int(attrs["use_qk_l2norm"]):
        return b("Mul", qf, scale, hint="q_scaled"), kf, vf, gf, bf
    # x / sqrt(sum x^2 + eps); q's row factor times the scale, so one pass over q and one over k
    eps, last = b.attr_f("l2norm_eps"), b.ints(-1)
    q_factor, k_factor = (b("Reciprocal", b("Sqrt", b("Add", b("ReduceSumSquare", x, last, keepdims=1), eps)))
                          for x in (qf, kf))
    return b("Mul", qf, b("Mul", q_factor, scale), hint="q_scaled"), b("Mul", kf, k_factor, hint="l2n"), vf, gf, bf


def repeat_heads(b: GraphBuilder, x: str, v: str) -> str:
    """x [rows, Hk, D] -> [rows, Hv, D] with value head h reading head h // (Hv / Hk) (GVA); Hv from v [rows, Hv, V]."""
    rows, hk, d = b("Shape", x, start=0, end=1), b("Shape", x, start=1, end=2), b("Shape", x, start=2, end=3)
    hv = b("Shape", v, start=1, end=2)
    rep = b("Div", hv, hk, hint="gva_rep")
    expanded = b("Expand", b("Unsqueeze", x, b.ints(2)), b("Concat", rows, hk, rep, d, axis=0))
    return b("Reshape", expanded, b("Concat", rows, hv, d, axis=0), hint="gva")
