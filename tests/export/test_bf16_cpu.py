"""A bf16 graph rewritten for onnxruntime's CPU provider computes the bf16 model in float32: compared with float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from gdn_deploy.export.bf16_cpu import cpu_session, float32_compute, has_bfloat16  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402


def _bf16_tensor(name: str, a: torch.Tensor):
    bits = a.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return helper.make_tensor(name, TensorProto.BFLOAT16, list(a.shape), bits.tobytes(), raw=True)


def _model(w: torch.Tensor, c: torch.Tensor):
    """y = Cast<bf16>(exp(x @ W) * c) + Where(flag, x@W, 0) -- a MatMul, an Exp, a constant, a cast to bf16 and an
    If with a bf16 subgraph, none of which onnxruntime's CPU provider runs in bf16."""
    then_g = helper.make_graph([helper.make_node("Identity", ["xw"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.BFLOAT16, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["xw", "xw"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.BFLOAT16, None)])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Exp", ["xw"], ["ex"]),
             helper.make_node("Constant", [], ["c"], value=_bf16_tensor("c", c)),
             helper.make_node("Mul", ["ex", "c"], ["m"]),
             helper.make_node("Cast", ["m"], ["mc"], to=TensorProto.BFLOAT16),
             helper.make_node("If", ["flag"], ["branch"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["mc", "branch"], ["y"]),
             helper.make_node("ReduceSum", ["xw"], ["s"], keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["T", 8]),
                                       helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["T", 4]),
                           helper.make_tensor_value_info("s", TensorProto.BFLOAT16, [])],
                          [_bf16_tensor("W", w)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("rows, flag", [(1, True), (5, False), (64, True), (65, False)])
def test_float32_compute_matches_float64_of_the_bf16_model(rows, flag):
    gen = torch.Generator().manual_seed(rows)
    w, c = torch.randn(8, 4, generator=gen) * 0.3, torch.randn(4, generator=gen)
    x = torch.randn(rows, 8, generator=gen).to(torch.bfloat16)
    m = _model(w, c)
    assert has_bfloat16(m)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        run_onnxruntime(m, {"x": x, "flag": torch.tensor(flag)})     # the reason for the rewrite
    got = run_onnxruntime(float32_compute(m), {"x": x, "flag": torch.tensor(flag)})
    assert got["y"].dtype == torch.bfloat16 and list(got["y"].shape) == [rows, 4]
    xw = x.double() @ w.to(torch.bfloat16).double()                  # the bf16 weights, float64 arithmetic
    ref = (xw.exp() * c.to(torch.bfloat16).double()) + (xw if flag else 0 * xw)
    rel = float((got["y"].double() - ref).norm() / ref.norm())
    assert rel < 2 ** -8, rel                                         # only the bf16 rounding of the output
    assert abs(float(got["s"]) - float(xw.sum())) <= 2 ** -7 * max(1.0, abs(float(xw.sum())))


def test_cpu_session_from_a_file_keeps_io_names_and_types(tmp_path):
    m = _model(torch.randn(8, 4), torch.randn(4))
    onnx.save_model(m, str(tmp_path / "g.onnx"))
    sess = cpu_session(tmp_path / "g.onnx")
    assert [(i.name, i.type) for i in sess.get_inputs()] == [("x", "tensor(bfloat16)"), ("flag", "tensor(bool)")]
    assert [(o.name, o.type) for o in sess.get_outputs()] == [("y", "tensor(bfloat16)"), ("s", "tensor(bfloat16)")]


def test_cpu_session_of_a_model_too_big_for_protobuf_keeps_its_bf16_weights(tmp_path, monkeypatch):
    """A real-size bf16 model (float32 copy over 2 GB): protobuf's ByteSize raises on such a message, so the size
    test must not call it; the weights stay bf16, each read through a Cast that onnxruntime folds when the session
    loads, and the session computes exactly what the converted small model computes."""
    import gdn_deploy.export.bf16_cpu as bf16_cpu
    w, c = torch.randn(8, 4), torch.randn(4)
    onnx.save_model(_model(w, c), str(tmp_path / "g.onnx"))
    feed = {"x": torch.randn(5, 8).to(torch.bfloat16), "flag": torch.tensor(True)}
    small = run_onnxruntime(cpu_session(tmp_path / "g.onnx"), feed)

    def too_big(self):
        raise AssertionError("ByteSize called on a model whose weights exceed the in-memory limit")
    monkeypatch.setattr(bf16_cpu, "IN_MEMORY_BYTES", 16)                     # W (8x4 bf16, 64 B) is "big"
    monkeypatch.setattr(onnx.ModelProto, "ByteSize", too_big)
    big = run_onnxruntime(cpu_session(tmp_path / "g.onnx"), feed)
    for name in small:
        assert torch.equal(torch.as_tensor(big[name]).float(), torch.as_tensor(small[name]).float()), name


def test_cpu_session_reads_external_bf16_weights_from_the_files_folder(tmp_path, monkeypatch):
    """External data (an export folder's weights.data) is read where it is, whatever the working directory, with
    nothing written to disk; the folded float32 weights equal the converted model's outputs bitwise; the weight's
    Cast is folded into a float32 constant when the session loads."""
    import tempfile

    import gdn_deploy.export.bf16_cpu as bf16_cpu
    from gdn_deploy.export.runtimes import session_options
    d = tmp_path / "folder"
    d.mkdir()
    w, c = torch.randn(8, 4), torch.randn(4)
    onnx.save_model(_model(w, c), str(d / "g.onnx"), save_as_external_data=True, location="weights.data",
                    size_threshold=0)
    assert onnx.load(str(d / "g.onnx"), load_external_data=False).graph.initializer[0].data_location == \
        TensorProto.EXTERNAL
    feed = {"x": torch.randn(7, 8).to(torch.bfloat16), "flag": torch.tensor(False)}
    small = run_onnxruntime(cpu_session(d / "g.onnx"), feed)
    monkeypatch.setattr(bf16_cpu, "IN_MEMORY_BYTES", 16)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("cpu_session wrote a temporary copy"))
    opts = session_options()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    big = run_onnxruntime(cpu_session(d / "g.onnx", opts), feed)
    for name in small:
        assert torch.equal(torch.as_tensor(big[name]).float(), torch.as_tensor(small[name]).float()), name
    opt = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert {t.name: t.data_type for t in opt.graph.initializer}.get("W__as_float32") == TensorProto.FLOAT
    assert not any(n.op_type == "Cast" and n.input[0] == "W" for n in opt.graph.node)
