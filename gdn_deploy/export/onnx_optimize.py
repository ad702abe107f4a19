"""Linear-time matching of the onnxscript rewriter's multi-output patterns while a graph is optimized.

``torch.onnx.export(..., optimize=True)`` and ``ONNXProgram.optimize()`` run onnxscript's default rewrite rules on
every node. For a pattern with several output nodes (``SlicesSplit``, two Slices of one input -> a Split),
``SimplePatternMatcher.match`` first indexes every node of the graph by op type and only then tries the given node
as the first output: one pass over the whole graph per node, quadratic in the graph's size. On the Qwen3.5 prefill
graph this was 90% of the optimizer's time (12 layers: 3486 nodes, 250 s of 270 s; 32 layers: most of the 9B
export's 7-minute "constant folding").

:func:`linear_multi_output_matching` first checks the given node against the pattern's first output node's op type
and domain, the first thing the original match checks for every combination it tries, and only calls the original
when that passes: the same matches, the same rewrites, the same graph (``tests/export/test_onnx_optimize.py``).
Without the private API it changes nothing.
"""
from __future__ import annotations

import contextlib

__all__ = ["linear_multi_output_matching"]


@contextlib.contextmanager
def linear_multi_output_matching():
    try:
        from onnxscript.rewriter import _basics, _matcher
        cls = _matcher.SimplePatternMatcher
        original = cls.__dict__["match"]
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def match(self, model, graph_or_function, node, *args, **kwargs):
        pattern = self.pattern
        if not pattern.has_single_output_node:
            first = pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail(f"OpType mismatch: expected {first.op}, got {node.op_type}.")
        return original(self, model, graph_or_function, node, *args, **kwargs)

    cls.match = match
    try:
        yield
    finally:
        cls.match = original
