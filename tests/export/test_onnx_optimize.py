"""gdn_deploy.export.onnx_optimize: the optimizer with the linear multi-output matching gives the same model as
onnxscript's own matcher (same bytes) on graphs with two Slices of one value (the multi-output SlicesSplit pattern's
shape: the original matcher runs for them) among many other nodes (skipped by the first-node check)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ir = pytest.importorskip("onnx_ir")
optimizer = pytest.importorskip("onnxscript.optimizer")

from gdn_deploy.export.onnx_optimize import linear_multi_output_matching  # noqa: E402


def _const(name: str, values) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _model(split_halves: bool, chain: int) -> onnx.ModelProto:
    """x [4, 10] -> a chain of Relu/Neg nodes -> two Slices of the last axis ([0:5] and [5:10], the halves that
    SlicesSplit turns into a Split, when split_halves, else overlapping [0:6] and [4:10]) -> each through another
    chain -> two outputs."""
    consts = [_const("ax", [1]), _const("b0", [0]), _const("e0", [5 if split_halves else 6]),
              _const("b1", [5 if split_halves else 4]), _const("e1", [10])]
    nodes = []
    prev = "x"
    for i in range(chain):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", [prev], [f"h{i}"]))
        prev = f"h{i}"
    nodes += [helper.make_node("Slice", [prev, "b0", "e0", "ax"], ["s0"]),
              helper.make_node("Slice", [prev, "b1", "e1", "ax"], ["s1"])]
    for k in (0, 1):
        p = f"s{k}"
        for i in range(chain):
            nodes.append(helper.make_node("Neg" if i % 2 else "Relu", [p], [f"t{k}_{i}"]))
            p = f"t{k}_{i}"
        nodes.append(helper.make_node("Identity", [p], [f"y{k}"]))
    n0, n1 = (5, 5) if split_halves else (6, 6)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 10])],
                              [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [4, n0]),
                               helper.make_tensor_value_info("y1", TensorProto.FLOAT, [4, n1])], initializer=consts)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


def _optimized(proto: onnx.ModelProto, patched: bool) -> onnx.ModelProto:
    model = ir.from_proto(proto)
    if patched:
        with linear_multi_output_matching():
            optimizer.optimize_ir(model)
    else:
        optimizer.optimize_ir(model)
    return ir.to_proto(model)


@pytest.mark.parametrize("split_halves", [True, False])
def test_same_model_as_the_original_matcher(split_halves):
    proto = _model(split_halves, chain=30)
    want, got = _optimized(proto, False), _optimized(proto, True)
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    ops = [n.op_type for n in got.graph.node]
    assert ops.count("Slice") == 2 and len(ops) == 3 * 30 + 2, ops     # the Identity outputs are folded away


def test_still_computes_the_slices():
    ort = pytest.importorskip("onnxruntime")
    proto = _model(True, chain=3)
    x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    got = ort.InferenceSession(_optimized(proto, True).SerializeToString()).run(None, {"x": x})
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_restores_the_matcher():
    from onnxscript.rewriter import _matcher
    before = _matcher.SimplePatternMatcher.__dict__["match"]
    with linear_multi_output_matching():
        assert _matcher.SimplePatternMatcher.__dict__["match"] is not before
    assert _matcher.SimplePatternMatcher.__dict__["match"] is before
