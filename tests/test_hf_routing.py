"""HF Qwen3-Next / Qwen3.5 GatedDeltaNet modules routed to the gdn ops (gdn_deploy.hf_routing), in torch and
exported as they are by samples/export_hf_layer.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from gdn_deploy import hf_routing  # noqa: E402
from gdn_deploy.hf_routing import HFGDNDecode, HFGDNPrefill, hf_example_inputs  # noqa: E402


def _sample():
    path = Path(__file__).resolve().parents[1] / "samples" / "export_hf_layer.py"
    spec = importlib.util.spec_from_file_location("export_hf_layer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_small_hf_gdn(kind: str = "qwen3_next", *, hidden: int = 32, hk: int = 2, hv: int = 4,
                      head_k: int = 8, head_v: int = 8, kernel: int = 4, seed: int = 0) -> nn.Module:
    """A randomly initialised HF GatedDeltaNet layer with a small local config (no download)."""
    torch.manual_seed(seed)
    common = dict(hidden_size=hidden, linear_num_key_heads=hk, linear_num_value_heads=hv,
                  linear_key_head_dim=head_k, linear_value_head_dim=head_v, linear_conv_kernel_dim=kernel,
                  num_hidden_layers=1, layer_types=["linear_attention"], num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, intermediate_size=64, vocab_size=64)
    if kind == "qwen3_next":
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
        cfg = Qwen3NextConfig(**common, moe_intermediate_size=32, num_experts=2, num_experts_per_tok=1)
        layer = Qwen3NextGatedDeltaNet(cfg, 0)
    elif kind == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
        cfg = Qwen3_5TextConfig(**common)
        layer = Qwen3_5GatedDeltaNet(cfg, 0)
    else:
        raise ValueError(f"unknown HF GDN kind {kind!r} (qwen3_next or qwen3_5)")
    with torch.no_grad():  # non-trivial norm weights and gates so a wrong route cannot hide
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.dt_bias.uniform_(-1.0, 1.0)
        layer.A_log.uniform_(-2.0, 1.0)
    layer.config_for_cache = cfg
    return layer.eval()


KINDS = ["qwen3_next", "qwen3_5"]


def _hf_reference(layer, chunks, x_dec):
    """HF's own code path (torch fallbacks, real DynamicCache): prefill chunk(s), then decode steps."""
    cache = DynamicCache(config=layer.config_for_cache)
    with torch.no_grad():
        outs = [layer(x, cache_params=cache) for x in chunks]
        outs += [layer(x, cache_params=cache) for x in x_dec]
    return outs, cache.get_conv_state(0)[..., 1:], cache.get_recurrent_state(0)


def _ours_torch(layer, chunks, x_dec):
    (cd, kw), (hv, k, v) = hf_routing.hf_state_shapes(layer)
    B = chunks[0].shape[0]
    conv, rec = torch.zeros(B, cd, kw), torch.zeros(B, hv, k, v)
    outs = []
    with torch.no_grad():
        for x in chunks:
            y, conv, rec = HFGDNPrefill(layer)(x, conv, rec)
            outs.append(y)
        for x in x_dec:
            y, conv, rec = HFGDNDecode(layer)(x, conv, rec)
            outs.append(y)
    return outs, conv, rec


@pytest.mark.parametrize("kind", KINDS)
def test_adapters_match_hf_in_torch(kind):
    layer = make_small_hf_gdn(kind, hk=2, hv=4)
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(2, 7, 32, generator=g), torch.randn(2, 70, 32, generator=g)]   # 2nd crosses a chunk
    x_dec = [torch.randn(2, 1, 32, generator=g) for _ in range(3)]
    ref, ref_conv, ref_rec = _hf_reference(layer, chunks, x_dec)
    got, conv, rec = _ours_torch(layer, chunks, x_dec)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(conv, ref_conv, atol=0, rtol=0)
    torch.testing.assert_close(rec, ref_rec, atol=2e-5, rtol=1e-4)


def test_route_really_calls_the_gdn_ops(monkeypatch):
    layer = make_small_hf_gdn("qwen3_next")
    calls = []
    real_prefill, real_decode = torch.ops.gdn.prefill, torch.ops.gdn.decode

    class _Spy:
        def __init__(self):
            self.prefill = lambda *a, **k: (calls.append("prefill"), real_prefill(*a, **k))[1]
            self.decode = lambda *a, **k: (calls.append("decode"), real_decode(*a, **k))[1]

    monkeypatch.setattr(hf_routing.torch.ops, "gdn", _Spy())
    x, conv, rec = hf_example_inputs(layer, 2, 5)
    with torch.no_grad():
        _, conv, rec = HFGDNPrefill(layer)(x, conv, rec)
        HFGDNDecode(layer)(x[:, :1], conv, rec)
    assert calls == ["prefill", "decode"]
    mod = sys.modules[type(layer).__module__]
    assert mod.torch_chunk_gated_delta_rule is not hf_routing._chunk_adapter     # restored after the call


def test_route_rejects_a_non_gdn_module():
    with pytest.raises(TypeError, match="expected one of"):
        HFGDNPrefill(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module", params=KINDS)
def exported(request, tmp_path_factory):
    layer = make_small_hf_gdn(request.param, hk=2, hv=4, seed=1)
    out = tmp_path_factory.mktemp(f"hf_{request.param}")
    files = _sample().export_hf_gdn(layer, out)
    return layer, files


def test_onnxruntime_matches_hf(exported):
    """Prefill (zero states) then two decode steps: onnxruntime graphs == HF torch module with its cache."""
    onnx = pytest.importorskip("onnx")
    from gdn_deploy.export.runtimes import run_onnxruntime
    layer, files = exported
    for f in files.values():
        onnx.checker.check_model(str(f))
    g = torch.Generator().manual_seed(7)
    B = 3                                                   # not the export sample's batch
    chunks = [torch.randn(B, 9, 32, generator=g)]
    x_dec = [torch.randn(B, 1, 32, generator=g) for _ in range(2)]
    ref, ref_conv, ref_rec = _hf_reference(layer, chunks, x_dec)
    (cd, kw), (hv, k, v) = hf_routing.hf_state_shapes(layer)
    feed = {"conv_state": torch.zeros(B, cd, kw), "rec_state": torch.zeros(B, hv, k, v)}
    got = []
    for path, xs in ((files["prefill"], chunks), (files["decode"], x_dec)):
        for x in xs:
            out = run_onnxruntime(path, {"hidden_states": x, **feed})
            got.append(out["out"])
            feed = {"conv_state": out["conv_state_out"], "rec_state": out["rec_state_out"]}
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(feed["conv_state"], ref_conv, atol=1e-6, rtol=0)
    torch.testing.assert_close(feed["rec_state"], ref_rec, atol=1e-4, rtol=1e-3)


def test_onnx_graph_holds_gdn_nodes_not_the_unrolled_loop(exported):
    onnx = pytest.importorskip("onnx")
    _, files = exported
    for graph, op in (("prefill", "GatedDeltaPrefill"), ("decode", "GatedDeltaDecode")):
        m = onnx.load(str(files[graph]))
        ops = [(n.domain, n.op_type) for n in m.graph.node]
        assert ("gdn", op) in ops, ops
        assert len(m.graph.node) < 200   # the torch fallback would unroll 64-step loops


def test_sample_cli_exports_a_layer_of_an_hf_folder(tmp_path, capsys):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=8, num_hidden_layers=2, layer_types=["full_attention",
                                                                                      "linear_attention"],
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32,
                            vocab_size=32)
    Qwen3_5ForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    main = _sample().main
    assert main([str(tmp_path / "hf"), "--layer", "1", "-o", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "hf_prefill.onnx").is_file() and (tmp_path / "o" / "hf_decode.onnx").is_file()
    assert main([str(tmp_path / "hf"), "--layer", "0", "-o", str(tmp_path / "o0")]) == 2   # an attention layer
    assert "not a GatedDeltaNet layer" in capsys.readouterr().err
