"""gdn_deploy.export.onnx_norm_form: ``Mul(x, Reciprocal(Sqrt(v)))`` becomes ``Div(x, Sqrt(v))`` where nothing else
reads the reciprocal; onnxruntime then fuses the RMS norm into SimplifiedLayerNormalization, with the float64
result of the original graph (whole exported models: tests/export/test_hybrid_export.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import seed_for

ort = pytest.importorskip("onnxruntime")

from gdn_deploy.export.onnx_norm_form import rsqrt_mul_as_div  # noqa: E402

H = 64


def _norm_model(weight: np.ndarray, swap: bool = False, extra_reader: bool = False) -> onnx.ModelProto:
    """y = x * rsqrt(mean(x^2, -1) + eps) * weight as PyTorch exports it (``swap``: Mul(rsqrt, x));
    ``extra_reader``: the reciprocal is also a graph output (it must then stay)."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(weight.astype(np.float32), "w")]
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["r"]),
             helper.make_node("Mul", ["r", "x"] if swap else ["x", "r"], ["xn"]),
             helper.make_node("Mul", ["xn", "w"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", H])]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["T", 1]))
    g = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", H])], outs,
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return _ops(onnx.load(str(tmp_path / "optimized.onnx")))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("T", [0, 1, 63, 64, 65])
def test_rewrite_fires_and_keeps_the_result(swap, T, tmp_path):
    rng = np.random.default_rng(seed_for(f"norm_form::{swap}::{T}"))
    w = rng.standard_normal(H)
    model = _norm_model(w, swap)
    assert "SimplifiedLayerNormalization" not in _optimized_ops(model, tmp_path)   # the export's form: not fused
    assert rsqrt_mul_as_div(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    assert _ops(model) == ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    assert list(model.graph.node[4].input) == ["x", "rms"]
    assert _optimized_ops(model, tmp_path).count("SimplifiedLayerNormalization") == 1
    x = (rng.standard_normal((T, H)) * rng.uniform(0.01, 100.0, (T, 1))).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w.astype(np.float32).astype(np.float64)
    assert got.shape == (T, H)
    if T:
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6


def test_a_reciprocal_read_elsewhere_stays(tmp_path):
    model = _norm_model(np.ones(H), extra_reader=True)
    before = model.SerializeToString()
    assert rsqrt_mul_as_div(model.graph) == 0
    assert model.SerializeToString() == before


def test_only_reciprocals_of_sqrt_are_rewritten():
    model = _norm_model(np.ones(H))
    model.graph.node[3].op_type = "Exp"          # Reciprocal(Exp(v)): not a square root, left alone
    before = model.SerializeToString()
    assert rsqrt_mul_as_div(model.graph) == 0
    assert model.SerializeToString() == before
