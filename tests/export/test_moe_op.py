"""MoE layers on onnxruntime's ``com.microsoft::MoE`` (``SparseMoE.impl = "op"``) and the TensorRT copies' forms.

One SparseMoE layer exported in the op form, run by onnxruntime on CPU as exported and after
:func:`expand_moe` into the ``grouped`` and ``gather`` forms of the TensorRT copies (those hold standard ops only)
and the ``split`` form (one Gemm per expert; an expert no row chose runs on zero rows),
against the routed layer in float64: 64 experts top-2 and top-3, 4 experts, ``norm_topk_prob`` on and off, lengths
1 to 300, every token on one or two experts with every other expert's weights NaN. Whole models: the onnxruntime
graphs of tiny Qwen3.5-MoE / Qwen3-Next exports hold one MoE node per MoE layer (their logits against HF:
test_hybrid_export.py, test_moe_export.py) and their TensorRT forms compute what the op does.
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch

from conftest import rel_err, seed_for
from moe_reference import clear_routing, export_layer, float64_routed, route_all_to

ort = pytest.importorskip("onnxruntime")

from gdn_deploy.export import onnx_moe  # noqa: E402
from gdn_deploy.export.onnx_moe import expand_moe, onnxruntime_has_moe, tensorrt_moe_form  # noqa: E402
from gdn_deploy.export.op_allowlist import graph_op_problems  # noqa: E402
from gdn_deploy.lm.mlp import MoEConfig, SparseMoE  # noqa: E402

pytestmark = pytest.mark.skipif(not onnxruntime_has_moe(), reason="the installed onnxruntime does not run "
                                "com.microsoft::MoE (swiglu, interleaved fc1) on CPU")

H, INTER, SHARED = 32, 16, 24
LENGTHS = (1, 2, 63, 64, 65, 300)
FORMS = ("op", "grouped", "gather", "split")
_CACHE: dict = {}


def _moe_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.domain == "com.microsoft" and n.op_type == "MoE"]


def _sessions(model: onnx.ModelProto) -> dict:
    """The op form as exported, both TensorRT forms and the ``split`` form, each an onnxruntime CPU session."""
    out = {}
    assert len(_moe_nodes(model)) == 1 and graph_op_problems(model, onnxruntime=True) == []
    for form in FORMS:
        m = copy.deepcopy(model)
        if form != "op":
            assert expand_moe(m, form) == 1
            problems = [] if form == "split" else graph_op_problems(m)      # split: onnxruntime only (TopK of M)
            assert not _moe_nodes(m) and problems == [], problems[:3]
            assert all(o.domain != "com.microsoft" for o in m.opset_import)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        out[form] = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return out


def _layer(experts, top_k, norm, tmp_path_factory, tag="random", prepare=None):
    key = (experts, top_k, norm, tag)
    if key not in _CACHE:
        torch.manual_seed(seed_for(f"moe_op::{key}"))
        moe = SparseMoE(H, MoEConfig(experts, top_k, INTER, SHARED, norm_topk_prob=norm)).eval()
        if prepare is not None:
            prepare(moe)
        _CACHE[key] = moe, _sessions(export_layer(moe, "op", tmp_path_factory.mktemp("moe_op") / "moe.onnx"))
    return _CACHE[key]


def _run(sess, x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("experts,top_k", [(64, 2), (64, 3), (4, 2)])
def test_op_and_tensorrt_forms_equal_routed_float64(experts, top_k, norm, tmp_path_factory, gen):
    moe, sessions = _layer(experts, top_k, norm, tmp_path_factory)
    for n in LENGTHS:
        x = clear_routing(moe, torch.randn(3 * n + 8, H, generator=gen))[:n].contiguous()
        assert len(x) == n
        want = float64_routed(moe, x)
        assert float(want.norm()) > 0
        for form, sess in sessions.items():
            got = _run(sess, x)
            assert got.shape == (n, H) and rel_err(got, want) <= 2e-6, (form, n, rel_err(got, want))


@pytest.mark.parametrize("top_k,expert,second", [(2, 63, 5), (2, 0, 1), (1, 0, None), (1, 63, None)])
def test_every_token_on_the_same_experts_other_experts_nan(top_k, expert, second, tmp_path_factory, gen):
    moe, sessions = _layer(64, top_k, True, tmp_path_factory, f"one:{expert}:{second}", route_all_to(expert, second))
    for n in (1, 64, 65, 300):
        x = torch.rand(n, H, generator=gen) + 0.5
        idx, _ = moe.route(x)
        assert set(idx.flatten().tolist()) == {expert} | ({second} if second is not None else set())
        want = float64_routed(moe, x)
        assert torch.isfinite(want).all()
        for form, sess in sessions.items():
            got = _run(sess, x)
            assert torch.isfinite(got).all() and rel_err(got, want) <= 2e-6, (form, n, rel_err(got, want))


def test_expert_weights_stored_once(tmp_path_factory):
    """The graph interleaves fc1 from gate_up_proj; no second copy of the expert weights is stored."""
    _layer(64, 2, True, tmp_path_factory)                        # the export is checked there
    torch.manual_seed(0)
    moe = SparseMoE(H, MoEConfig(64, 2, INTER, SHARED)).eval()
    model = export_layer(moe, "op", tmp_path_factory.mktemp("moe_once") / "moe.onnx")
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    expert = 64 * 2 * INTER * H
    assert sorted(n for n, s in sizes.items() if s >= expert // 2) == ["experts.down_proj", "experts.gate_up_proj"]
    fc1 = _moe_nodes(model)[0].input[2]
    assert fc1 not in sizes                                      # computed from gate_up_proj in the graph


def test_forms_of_the_graphs(monkeypatch):
    """op for float32 graphs where onnxruntime runs it; the TensorRT forms otherwise (float16: the CPU kernel's
    accuracy, see onnx_moe; bfloat16; an onnxruntime without the op)."""
    from gdn_deploy.export.hybrid_graphs import HybridDecodeGraph, HybridPrefillGraph
    assert onnx_moe.onnxruntime_moe_form(torch.float32, "grouped") == "op"
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        assert onnx_moe.onnxruntime_moe_form(dt, "grouped") == "grouped"
    assert [tensorrt_moe_form(g) for g in ("prefill.onnx", "decode.onnx", "decode_pool.onnx", "verify.onnx",
                                           "draft.onnx")] == ["grouped"] + ["gather"] * 4

    class Net(torch.nn.Module):           # what the wrappers read at construction: the model dtype
        dtype = torch.float32
    assert (HybridPrefillGraph(Net()).moe_impl, HybridDecodeGraph(Net()).moe_impl) == ("op", "op")
    monkeypatch.setattr(onnx_moe, "onnxruntime_has_moe", lambda: False)
    assert (HybridPrefillGraph(Net()).moe_impl, HybridDecodeGraph(Net()).moe_impl) == ("grouped", "gather")


def test_expand_refuses_an_unknown_form(tmp_path_factory):
    torch.manual_seed(0)
    moe = SparseMoE(H, MoEConfig(4, 2, INTER, SHARED)).eval()
    model = export_layer(moe, "op", tmp_path_factory.mktemp("bad") / "m.onnx")
    with pytest.raises(ValueError, match="form 'dense'"):
        expand_moe(model, "dense")


def test_split_form_needs_the_expert_count(tmp_path_factory):
    torch.manual_seed(0)
    moe = SparseMoE(H, MoEConfig(4, 2, INTER, SHARED)).eval()
    model = export_layer(moe, "op", tmp_path_factory.mktemp("nocount") / "m.onnx")
    fc2 = _moe_nodes(model)[0].input[4]
    model.graph.node.insert(0, onnx.helper.make_node("Identity", [fc2], ["fc2_unknown"]))
    _moe_nodes(model)[0].input[4] = "fc2_unknown"
    with pytest.raises(ValueError, match="form 'split' needs the expert count"):
        expand_moe(model, "split")
