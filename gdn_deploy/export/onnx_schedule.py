"""Node order in which onnxruntime's default execution order frees each layer's activations within the layer.

onnxruntime's default execution order (``ExecutionOrder.DEFAULT``) is a reverse depth-first walk from the graph's
leaf nodes (nodes whose outputs nothing reads), taking the leaf of the highest node index first, and running a node
once everything it reads has run. A prefill graph has one leaf per state that a small side chain computes from a
large per-token tensor, e.g. each GDN layer's new conv state, gathered from that layer's ``[T + N(W-1), conv_dim]``
window table. The logits' node, written last, was walked first, so every layer ran before any of those side
chains, and every GDN layer's table stayed alive until the end of the graph: ``L x T x conv_dim`` values held
(Qwen3.5-9B in bf16: 24 layers x 16 KB = 393 KB per prompt token, 12.9 GB at 32K tokens), where one layer's table
is needed at a time.

:func:`leaves_walked_in_order` moves the leaf nodes to the end of the node list in reverse order: the walk then
takes them in the order they were written (layer 0's state first, the logits last), each side chain runs as soon as
its layer has produced its input, and the table is freed inside its layer. The graph is the same graph (only leaves
move, and nothing reads a leaf); onnxruntime's ``ExecutionOrder.PRIORITY_BASED`` (a topological order by node index)
and other runtimes, which schedule by their own rules, are unaffected by the move.
"""
from __future__ import annotations

import onnx

from .onnx_graph import names_read

__all__ = ["leaves_walked_in_order"]


def leaves_walked_in_order(graph: onnx.GraphProto) -> int:
    """Move ``graph``'s leaf nodes (in place) to the end of its node list, in reverse order; returns how many."""
    read = set().union(*map(names_read, graph.node))   # with the names subgraphs read from this scope
    leaves = [i for i, n in enumerate(graph.node) if not any(o in read for o in n.output if o)]
    if len(leaves) < 2:
        return 0
    moving = set(leaves)
    keep = [n for i, n in enumerate(graph.node) if i not in moving]
    moved = [graph.node[i] for i in reversed(leaves)]
    nodes = [onnx.NodeProto() for _ in range(len(keep) + len(moved))]
    for dst, src in zip(nodes, keep + moved):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(moved)
