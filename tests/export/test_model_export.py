"""Whole-model export: GDNLM / GDNBlock -> prefill/decode(/decode_pool).onnx -> onnxruntime vs PyTorch."""
from __future__ import annotations

import json

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from gdn_deploy.export import metadata as md  # noqa: E402
from gdn_deploy.export.graphs import example_feed, graph_plan  # noqa: E402
from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.export.runtimes import compare_outputs, run_onnxruntime, run_torch  # noqa: E402
from gdn_deploy.export.targets import cast_target, target_from_module  # noqa: E402
from gdn_deploy.export.verify import reference_outputs  # noqa: E402
from gdn_deploy.model import GDNBlock, GDNConfig, GDNLM  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

_ELEM = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
         onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64"}


def _lm(num_k_heads=1, num_v_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = GDNConfig(hidden_size=32, num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=16, head_v_dim=16,
                    vocab_size=64, num_layers=2, intermediate_size=48)
    lm = GDNLM(cfg)
    lm.reset_parameters()          # O(1) activations: errors in the graph show in the logits
    return lm.eval()


def _block(seed=0):
    torch.manual_seed(seed)
    cfg = GDNConfig(hidden_size=24, num_k_heads=1, num_v_heads=4, head_k_dim=8, head_v_dim=8,
                    projection_layout="qwen3_5")
    b = GDNBlock(cfg)
    b.reset_parameters()
    return b.eval()


@pytest.fixture(scope="module")
def lm_fp32(tmp_path_factory):
    target = target_from_module(_lm(), {"model": "test"})
    out = tmp_path_factory.mktemp("lm_fp32")
    res = export_model(target, out, ExportOptions(graphs=("prefill", "decode", "decode_pool"), max_tokens=4096,
                                                  max_seqs=32))
    return target, res


@pytest.fixture(scope="module")
def lm_fp16(tmp_path_factory):
    target = target_from_module(_lm(seed=1), {"model": "test"})
    out = tmp_path_factory.mktemp("lm_fp16")
    return target, export_model(target, out, ExportOptions(precision="fp16", graphs=("prefill", "decode")))


@pytest.fixture(scope="module")
def block_gva4(tmp_path_factory):
    target = target_from_module(_block(), {"model": "test"})
    out = tmp_path_factory.mktemp("block")
    return target, export_model(target, out, ExportOptions(graphs=("prefill", "decode")))


def _assert_close(ref, got, dtype="float32"):
    rows = compare_outputs(ref, got, SPEC.check_tolerance(dtype))
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


def test_files_checker_and_verification(lm_fp32):
    _, res = lm_fp32
    names = sorted(p.name for p in res.files)
    graphs = ["decode", "decode_pool", "prefill"]
    assert names == sorted([f"{g}.onnx" for g in graphs] + [f"{g}.trt.onnx" for g in graphs]
                           + [f"{g}_inputs.json" for g in graphs]
                           + [f"{g}_reference.json" for g in graphs] + [md.SIDECAR_NAME, "weights.data"])
    for p in res.files:
        if p.suffix == ".onnx":
            onnx.checker.check_model(str(p))
    assert set(res.verification) == {"prefill", "decode", "decode_pool"}
    assert all(r["ok"] for rows in res.verification.values() for r in rows)


def test_metadata_matches_the_onnx_graphs(lm_fp32):
    target, res = lm_fp32
    meta = md.read_metadata(res.outdir)
    assert meta["model"]["kind"] == "lm" and meta["model"]["num_gdn_layers"] == 2
    assert meta["opset"] >= 18 and meta["interop"] is None
    assert meta["model"]["config"]["vocab_size"] == 64
    assert meta["model"]["heads"]["gva_ratio"] == 2
    assert meta["dtypes"] == {"weights": "float32", "activations": "float32", "states": "float32"}
    for g, info in meta["graphs"].items():
        m = onnx.load(str(res.outdir / info["file"]))
        for entries, values in ((info["inputs"], m.graph.input), (info["outputs"], m.graph.output)):
            assert [t["name"] for t in entries] == [v.name for v in values]
            for t, v in zip(entries, values):
                assert _ELEM[v.type.tensor_type.elem_type] == t["dtype"], t
                dims = v.type.tensor_type.shape.dim
                assert len(dims) == len(t["shape"]), t
                for d, s in zip(dims, t["shape"]):
                    if isinstance(s, int):
                        assert d.dim_value == s, (t, d)
                    else:
                        assert d.dim_param == s, (t, d)
    prof = meta["profiles"]["prefill"]
    assert prof["input_ids"] == {"min": [1], "opt": [1024], "max": [4096]}
    assert prof["cu_seqlens"]["max"] == [33]
    assert prof["rec_state_1"]["max"] == [32, 2, 16, 16]
    assert meta["profiles"]["decode_pool"]["slots"]["max"] == [32]
    assert meta["profiles"]["decode_pool"]["conv_pool_0"]["min"][0] == 1


@pytest.mark.parametrize("seed,tokens,seqs", [(11, 17, 4), (12, 5, 5), (13, 70, 2)])
def test_prefill_varlen_matches_torch(lm_fp32, seed, tokens, seqs):
    """Random ragged batches (zero-length sequences included) and random initial states."""
    target, res = lm_fp32
    plan = graph_plan(target, "prefill")
    feed = example_feed(target, "prefill", tokens=tokens, seqs=seqs, seed=seed)
    if seed == 12:
        feed["cu_seqlens"] = torch.tensor([0, 0, 3, 3, 5, 5], dtype=torch.int32)
    _assert_close(run_torch(plan, feed), run_onnxruntime(res.outdir / "prefill.onnx", feed))


@pytest.mark.parametrize("batch", [1, 4])
def test_decode_matches_torch(lm_fp32, batch):
    target, res = lm_fp32
    feed = example_feed(target, "decode", batch=batch, seed=batch)
    _assert_close(run_torch(graph_plan(target, "decode"), feed), run_onnxruntime(res.outdir / "decode.onnx", feed))


def test_decode_pool_matches_torch_and_keeps_unused_rows(lm_fp32):
    target, res = lm_fp32
    feed = example_feed(target, "decode_pool", batch=3, pool=6, seed=5)
    feed["slots"] = torch.tensor([4, -1, 1], dtype=torch.int32)
    got = run_onnxruntime(res.outdir / "decode_pool.onnx", feed)
    _assert_close(run_torch(graph_plan(target, "decode_pool"), feed), got)
    for i in range(2):
        for stem in ("conv", "rec"):
            before, after = feed[f"{stem}_pool_{i}"], got[f"{stem}_pool_out_{i}"]
            for row in (0, 2, 3, 5):
                assert torch.equal(before[row], after[row]), (stem, i, row)
            assert not torch.equal(before[4], after[4])


def test_states_carry_from_prefill_into_decode_steps(lm_fp32):
    """ORT prefill -> 3 ORT decode steps == the PyTorch model doing the same, and == one long prefill."""
    target, res = lm_fp32
    lm = target.module
    gen = torch.Generator().manual_seed(21)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    ids = torch.randint(0, 64, (13,), generator=gen)
    steps = torch.randint(0, 64, (3, 3), generator=gen)          # [step, seq]
    conv0, rec0 = lm.init_states(3)
    states = {}
    for i in range(2):
        states[f"conv_state_{i}"], states[f"rec_state_{i}"] = conv0[i].float(), rec0[i]
    out = run_onnxruntime(res.outdir / "prefill.onnx", {"input_ids": ids, "cu_seqlens": cu, **states})
    ort_logits = []
    for s in range(3):
        states = {k: out[k.replace("_state_", "_state_out_")] for k in states}
        out = run_onnxruntime(res.outdir / "decode.onnx", {"input_ids": steps[s], **states})
        ort_logits.append(out["logits"])
    with torch.no_grad():
        _, conv, rec = lm.prefill(ids, cu, None, None)
        torch_logits = []
        for s in range(3):
            lg, conv, rec = lm.decode(steps[s], conv, rec)
            torch_logits.append(lg)
        # the same tokens as one prefill: decode logits == prefill logits at those positions
        seqs = [torch.cat([ids[cu[j]:cu[j + 1]], steps[:, j]]) for j in range(3)]
        lens = torch.tensor([len(x) for x in seqs])
        cu_full = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
        full, _, _ = lm.prefill(torch.cat(seqs), cu_full, None, None)
    for s in range(3):
        torch.testing.assert_close(ort_logits[s], torch_logits[s], atol=1e-4, rtol=1e-3)
        pos = cu_full[1:].long() - 3 + s
        torch.testing.assert_close(torch_logits[s], full[pos], atol=1e-4, rtol=1e-3)
    for i in range(2):
        torch.testing.assert_close(out[f"rec_state_out_{i}"], rec[i], atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(out[f"conv_state_out_{i}"], conv[i].float(), atol=1e-5, rtol=1e-4)


def test_fp16_weights(lm_fp16):
    target, res = lm_fp16
    meta = md.read_metadata(res.outdir)
    assert meta["precision"] == "fp16" and meta["dtypes"]["activations"] == "float16"
    m = onnx.load(str(res.outdir / "prefill.onnx"))
    floats = {i.data_type for i in m.graph.initializer if i.data_type in (1, 10)}
    assert onnx.TensorProto.FLOAT16 in floats
    state_in = next(v for v in m.graph.input if v.name == "rec_state_0")
    assert state_in.type.tensor_type.elem_type == onnx.TensorProto.FLOAT          # states stay fp32
    half = cast_target(target, "fp16")
    for g in ("prefill", "decode"):
        feed = example_feed(half, g, tokens=13, seqs=3, batch=2, seed=31)
        ref = reference_outputs(half, g, feed)          # the fp16 weights computed in float32
        got = run_onnxruntime(res.outdir / f"{g}.onnx", feed)
        assert got[next(iter(ref))].dtype == torch.float16
        _assert_close(ref, got, "float16")
        # the fp16 tolerance is not vacuous: fp16 PyTorch itself is within it, a wrong model is not
        _assert_close(ref, run_torch(graph_plan(half, g), feed), "float16")
        other = cast_target(target_from_module(_lm(seed=99)), "fp16")
        rows = compare_outputs(ref, run_torch(graph_plan(other, g), feed), SPEC.check_tolerance("float16"))
        assert not all(r["ok"] for r in rows)


def test_block_gva4(block_gva4):
    target, res = block_gva4
    meta = md.read_metadata(res.outdir)
    assert meta["model"]["kind"] == "block" and meta["model"]["heads"]["gva_ratio"] == 4
    assert [t["name"] for t in meta["graphs"]["prefill"]["inputs"]] == ["x", "cu_seqlens", "conv_state_0",
                                                                        "rec_state_0"]
    for g, kw in (("prefill", dict(tokens=20, seqs=3)), ("decode", dict(batch=5))):
        feed = example_feed(target, g, seed=41, **kw)
        _assert_close(run_torch(graph_plan(target, g), feed), run_onnxruntime(res.outdir / f"{g}.onnx", feed))


def test_a_wrong_graph_is_detected(lm_fp32, tmp_path):
    """The comparison can fail: a perturbed torch model no longer matches the exported graph."""
    target, res = lm_fp32
    other = target_from_module(_lm(seed=99))
    feed = example_feed(target, "decode", seed=3)
    rows = compare_outputs(run_torch(graph_plan(other, "decode"), feed),
                           run_onnxruntime(res.outdir / "decode.onnx", feed), SPEC.check_tolerance("float32"))
    assert not all(r["ok"] for r in rows)
    t = SPEC.check_tolerance("float32")
    assert (t["atol"], t["rtol"], t["rel"]) == (rows[0]["atol"], rows[0]["rtol"], rows[0]["rel_tol"])


def test_sidecar_errors(tmp_path):
    with pytest.raises(md.MetadataError, match="no gdn_model.json"):
        md.read_metadata(tmp_path)
    (tmp_path / md.SIDECAR_NAME).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(md.MetadataError, match="not a gdn-deploy export sidecar"):
        md.read_metadata(tmp_path)
    assert md.eval_dim("N+1", {"N": 4}) == 5 and md.eval_dim(7, {}) == 7
