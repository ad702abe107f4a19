"""gdn-export writes TensorRT-ready copies (``<graph>.trt.onnx``) beside the onnxruntime files, and the sidecar
names them: no gdn FunctionProto (the onnxruntime bodies that TensorRT 10.0-10.6 parsers import instead of the
plugin, and later ones fall back to), every gdn node marked for the plugins with string attributes."""
from __future__ import annotations

import json

import onnx
import pytest
import torch

from gdn_deploy.export.model_export import ExportOptions, export_model
from gdn_deploy.export.targets import target_from_module
from gdn_deploy.model import GDNConfig, GDNLM
from gdn_deploy.onnx_nodes import (all_gdn_nodes, prepare_onnx_for_tensorrt, tensorrt_onnx_path,
                                   tensorrt_ready_problems, write_tensorrt_onnx)
from gdn_deploy.spec import SPEC

from .onnx_graphs import gdn_model

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = GDNConfig(hidden_size=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, vocab_size=64,
                    num_layers=1, intermediate_size=48)
    lm = GDNLM(cfg)
    lm.reset_parameters()
    out = tmp_path_factory.mktemp("export")
    export_model(target_from_module(lm.eval(), {"model": "test"}), out,
                 ExportOptions(graphs=("prefill", "decode", "decode_pool"), verify=False))
    return out


@pytest.mark.parametrize("graph", ["prefill", "decode", "decode_pool"])
def test_export_writes_tensorrt_ready_files(export_dir, graph):
    info = json.loads((export_dir / "gdn_model.json").read_text())["graphs"][graph]
    assert info["file"] == f"{graph}.onnx" and info["tensorrt_file"] == f"{graph}.trt.onnx"
    ort_model = onnx.load(str(export_dir / info["file"]))
    trt_model = onnx.load(str(export_dir / info["tensorrt_file"]))
    # the onnxruntime file keeps its bodies; the TensorRT file has none
    assert any(f.domain == SPEC.domain and f.name in SPEC.ops for f in ort_model.functions)
    assert not [f for f in trt_model.functions if f.domain == SPEC.domain]
    nodes = all_gdn_nodes(trt_model)
    assert len(nodes) == len(all_gdn_nodes(ort_model)) == 1     # one per GDN layer
    for node in nodes:
        attrs = {a.name: a for a in node.attribute}
        for name, want in (("plugin_namespace", SPEC.plugin_namespace), ("plugin_version", SPEC.plugin_version)):
            assert attrs[name].type == onnx.AttributeProto.STRING and attrs[name].s.decode() == want
        assert not node.overload
    assert tensorrt_ready_problems(trt_model) == []
    onnx.checker.check_model(trt_model)
    # everything but the gdn bodies is the same graph
    assert [n.op_type for n in trt_model.graph.node] == [n.op_type for n in ort_model.graph.node]
    assert [i.name for i in trt_model.graph.input] == [i.name for i in ort_model.graph.input]


def test_onnxruntime_file_is_not_tensorrt_ready(export_dir):
    problems = tensorrt_ready_problems(onnx.load(str(export_dir / "prefill.onnx")))
    assert problems and all("onnxruntime body" in p or "overload" in p for p in problems)


def test_ready_problems_name_each_defect():
    m = gdn_model("GatedDeltaDecode", state_mode=1)
    assert "model-local function gdn::GatedDeltaDecode (the onnxruntime body) is present" in tensorrt_ready_problems(m)
    assert "GatedDeltaDecode node 'GatedDeltaDecode_0' has no plugin_namespace attribute" in tensorrt_ready_problems(m)
    prepare_onnx_for_tensorrt(m)
    assert tensorrt_ready_problems(m) == []
    node = m.graph.node[0]
    for a in node.attribute:
        if a.name == "plugin_version":
            a.type, a.i = onnx.AttributeProto.INT, 1
            a.ClearField("s")
    node.overload = "x"
    assert tensorrt_ready_problems(m) == [
        "GatedDeltaDecode node 'GatedDeltaDecode_0': plugin_version is not a string attribute (the parser reads it "
        "as a string)", "GatedDeltaDecode node 'GatedDeltaDecode_0' has overload 'x'"]


def test_write_tensorrt_onnx(tmp_path):
    src = tmp_path / "decode.onnx"
    onnx.save(gdn_model("GatedDeltaDecode"), str(src))
    out = write_tensorrt_onnx(src)
    assert out == tensorrt_onnx_path(src) == tmp_path / "decode.trt.onnx"
    assert tensorrt_ready_problems(onnx.load(str(out))) == []
    assert onnx.load(str(src)).functions, "the onnxruntime file stays untouched"
    plain = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    onnx.save(plain, str(tmp_path / "plain.onnx"))
    assert write_tensorrt_onnx(tmp_path / "plain.onnx") is None and not (tmp_path / "plain.trt.onnx").exists()


def test_speculative_ops_are_plugin_nodes(tmp_path):
    """GatedDeltaVerify / GatedDeltaCommit have plugins too: their nodes are stamped and their bodies dropped in the
    TensorRT copy (a verify.onnx / commit.onnx of gdn-export gets a .trt.onnx beside it)."""
    from gdn_deploy.spec import COMMIT, VERIFY
    h = onnx.helper
    nodes, functions, names = [], [], set()
    for op, attrs in ((VERIFY, {"state_mode": 1}), (COMMIT, {"state_mode": 1})):
        full = op.attrs(**attrs)
        ins, outs = [f"{op.name}.{n}" for n in op.input_names(full)], [f"{op.name}.{n}" for n in op.output_names()]
        names.update(ins)
        nodes.append(h.make_node(op.name, ins, outs, name=f"{op.name}_0", domain=SPEC.domain,
                                 **{a: full[a] for a in op.attributes}))
        functions.append(h.make_function(SPEC.domain, op.name, op.input_names(full), op.output_names(),
                                         [h.make_node("Identity", [op.input_names(full)[0]], [o])
                                          for o in op.output_names()],
                                         [h.make_opsetid("", 18)], list(op.attributes)))
    graph = h.make_graph(nodes, "spec", [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names],
                         [h.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for n in nodes for o in n.output])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid(SPEC.domain,
                                                                                       SPEC.opset_version)])
    model.functions.extend(functions)
    src = tmp_path / "verify.onnx"
    onnx.save(model, str(src))
    assert len(tensorrt_ready_problems(model)) == 2 + 2 * 2   # two bodies, two attributes missing per node
    out = write_tensorrt_onnx(src)
    trt = onnx.load(str(out))
    assert out.name == "verify.trt.onnx" and tensorrt_ready_problems(trt) == [] and not trt.functions
    assert sorted(n.op_type for n in all_gdn_nodes(trt)) == ["GatedDeltaCommit", "GatedDeltaVerify"]
    assert set(SPEC.plugin_ops) == {"GatedDeltaPrefill", "GatedDeltaDecode", "GatedDeltaVerify", "GatedDeltaCommit"}
