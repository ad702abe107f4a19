"""GDNBlock against the Hugging Face Qwen3-Next / Qwen3.5 Gated DeltaNet modules (torch fallback, CPU, offline).

Tiny random HF configs are built from the transformers classes (no download). HF runs its pure PyTorch
fallbacks (no flash-linear-attention / causal-conv1d installed), which is the behaviour compared with.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import rel_err

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet  # noqa: E402

from gdn_deploy.hf import (block_from_hf, blocks_from_hf_state_dict, config_from_hf,  # noqa: E402
                           load_hf_folder)

TINY = dict(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=64,
            intermediate_size=32)
KINDS = {
    "qwen3_next": (transformers.Qwen3NextConfig, Qwen3NextGatedDeltaNet,
                   dict(moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=2,
                        num_experts_per_tok=1)),
    "qwen3_5": (transformers.Qwen3_5TextConfig, Qwen3_5GatedDeltaNet, {}),
}


def hf_config(kind: str, layer_types=("linear_attention",)):
    cfg_cls, _, extra = KINDS[kind]
    return cfg_cls(**TINY, **extra, num_hidden_layers=len(layer_types), layer_types=list(layer_types))


def hf_block(kind: str, gen: torch.Generator):
    cfg = hf_config(kind)
    m = KINDS[kind][1](cfg, 0).eval()
    with torch.no_grad():  # random weights everywhere (norm weight, dt_bias too) so every parameter matters
        for p in m.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        m.A_log.copy_(torch.empty(m.A_log.shape).uniform_(-1, 1.5, generator=gen))
    return cfg, m


def assert_layers_match_hf(model, blocks, x):
    """Each (layer index, GDNBlock) against that layer's HF linear_attn on the one sequence x [1, T, hidden]."""
    cu = torch.tensor([0, x.shape[1]], dtype=torch.int32)
    for i, blk in blocks:
        with torch.no_grad():
            ref = model.model.layers[i].linear_attn(x)
            ours, _, _ = blk.prefill(x[0], cu)
        assert rel_err(ours, ref[0]) < 1e-5, f"layer {i}"


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("kind", list(KINDS))
def test_block_param_names_equal_hf(kind, gen):
    _, m = hf_block(kind, gen)
    b = block_from_hf(m)
    assert set(b.state_dict()) == set(m.state_dict())
    for k, v in m.state_dict().items():
        assert torch.equal(b.state_dict()[k], v), k
    assert b.config.projection_layout == kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_prefill_matches_hf_padded_batch(kind, gen):
    """HF on a right-padded [B, L] batch vs our packed varlen prefill, per valid token (lengths incl. 0, 1)."""
    _, m = hf_block(kind, gen)
    b = block_from_hf(m)
    lens = [7, 1, 0, 12, 4]
    xs = [torch.randn(L, 32, generator=gen) for L in lens]
    pad = torch.zeros(len(lens), max(lens), 32)
    for i, x in enumerate(xs):
        pad[i, :len(x)] = x
    with torch.no_grad():
        ref = m(pad)
        ours, _, _ = b.prefill(torch.cat(xs), _cu(lens))
    ref = torch.cat([ref[i, :L] for i, L in enumerate(lens)])
    assert rel_err(ours, ref) < 1e-5


@pytest.mark.parametrize("kind", list(KINDS))
def test_prefill_then_decode_matches_hf_cache(kind, gen):
    """HF cache path (chunked prefill of K tokens, then M single-token recurrent steps) vs ours, incl. states."""
    cfg, m = hf_block(kind, gen)
    b = block_from_hf(m)
    B, K, M = 3, 6, 4
    x = torch.randn(B, K + M, 32, generator=gen)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        hf = [m(x[:, :K], cache_params=cache)] + [m(x[:, K + t:K + t + 1], cache_params=cache) for t in range(M)]
        hf = torch.cat(hf, 1)
        y, cs, rs = b.prefill(x[:, :K].reshape(B * K, 32), torch.arange(B + 1, dtype=torch.int32) * K)
        ys = [y.reshape(B, K, 32)]
        for t in range(M):
            yt, cs, rs = b.decode(x[:, K + t], cs, rs)
            ys.append(yt[:, None])
    ys = torch.cat(ys, 1)
    layer = cache.layers[0]
    assert rel_err(ys, hf) < 1e-5
    # HF keeps `kernel` conv inputs, the first of which is never read again; ours keeps kernel-1
    assert cs.shape == (B, b.conv_dim, b.conv_kernel_size - 1)
    assert rel_err(cs, layer.conv_states[0][..., 1:]) < 1e-6
    assert rs.dtype == torch.float32 and rel_err(rs, layer.recurrent_states[0]) < 1e-5


@pytest.mark.parametrize("kind", list(KINDS))
def test_bf16_smoke_vs_hf(kind, gen):
    _, m = hf_block(kind, gen)
    m = m.to(torch.bfloat16)
    b = block_from_hf(m)
    assert b.out_proj.weight.dtype == torch.bfloat16
    x = torch.randn(2, 24, 32, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        ref = m(x)
        ours, cs, rs = b.prefill(x.reshape(48, 32), torch.tensor([0, 24, 48], dtype=torch.int32))
    assert ours.dtype == torch.bfloat16 and cs.dtype == torch.bfloat16 and rs.dtype == torch.float32
    # Smoke bounds. HF rounds beta to bf16 (we keep it fp32); a token whose head output nearly cancels is
    # ill-conditioned under the gated RMSNorm and may differ a lot in either bf16 path, so the typical
    # token is checked tightly (median seen < 8e-3 over 600 random cases) and the whole loosely (< 8e-2).
    ref = ref.reshape(48, 32).float()
    per_token = (ours.float() - ref).norm(dim=1) / ref.norm(dim=1)
    assert float(per_token.median()) < 2e-2 and rel_err(ours, ref) < 0.25


def test_block_from_hf_rejects_other_modules():
    with pytest.raises(ValueError, match="not a Qwen3-Next / Qwen3.5 Gated DeltaNet"):
        block_from_hf(torch.nn.Linear(4, 4))


@pytest.mark.parametrize("kind", list(KINDS))
def test_blocks_from_full_model_state_dict(kind, gen):
    types = ("linear_attention", "full_attention", "linear_attention")
    cfg = hf_config(kind, types)
    model_cls = transformers.Qwen3NextForCausalLM if kind == "qwen3_next" else transformers.Qwen3_5ForCausalLM
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = model_cls(cfg).eval()
    sd = model.state_dict()
    blocks = blocks_from_hf_state_dict(cfg.to_dict(), sd)
    assert [i for i, _ in blocks] == [0, 2]
    assert_layers_match_hf(model, blocks, torch.randn(1, 5, 32, generator=gen))
    # a linear_attention layer without weights, and a shape mismatch, are named in the error
    broken = {k: v for k, v in sd.items() if not k.startswith("model.layers.2.linear_attn.")}
    with pytest.raises(ValueError, match=r"linear_attention layer\(s\) \[2\]"):
        blocks_from_hf_state_dict(cfg.to_dict(), broken)
    bad = dict(sd)
    bad["model.layers.0.linear_attn.out_proj.weight"] = torch.zeros(32, 7)
    with pytest.raises(ValueError, match="out_proj.weight"):
        blocks_from_hf_state_dict(cfg.to_dict(), bad)
    partial = {k: v for k, v in sd.items() if not k.endswith("linear_attn.A_log")}
    with pytest.raises(ValueError, match="A_log"):
        blocks_from_hf_state_dict(cfg.to_dict(), partial)


def test_config_from_hf_variants():
    c = config_from_hf(hf_config("qwen3_next"))
    assert (c.hidden_size, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim) == (32, 2, 4, 16, 8)
    assert c.projection_layout == "qwen3_next"
    assert config_from_hf(hf_config("qwen3_5")).projection_layout == "qwen3_5"
    # multimodal Qwen3.5 config.json nests the text model
    nested = {"model_type": "qwen3_5", "text_config": {**hf_config("qwen3_5").to_dict()}}
    assert config_from_hf(nested).projection_layout == "qwen3_5"
    with pytest.raises(ValueError, match="missing field"):
        config_from_hf({"model_type": "llama", "hidden_size": 8})
    with pytest.raises(ValueError, match="not a supported Gated DeltaNet"):
        config_from_hf({**hf_config("qwen3_5").to_dict(), "model_type": "llama"})


def test_load_hf_folder_safetensors_only(tmp_path, gen):
    cfg = hf_config("qwen3_5", ("linear_attention", "full_attention"))
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    blocks = load_hf_folder(tmp_path / "m")
    assert [i for i, _ in blocks] == [0]
    assert_layers_match_hf(model, blocks, torch.randn(1, 6, 32, generator=gen))
    # pickle weights are never read
    pk = tmp_path / "pickled"
    pk.mkdir()
    (pk / "config.json").write_text(json.dumps(cfg.to_dict()))
    torch.save(model.state_dict(), pk / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle weights are not read"):
        load_hf_folder(pk)
    with pytest.raises(ValueError, match="config.json is missing"):
        load_hf_folder(tmp_path)


def test_load_hf_folder_sharded(tmp_path, gen):
    """A sharded checkpoint (model.safetensors.index.json + several shards) loads every linear_attention
    layer from whichever shard holds it; a shard named in the index but absent is reported by name."""
    types = ("linear_attention", "full_attention", "linear_attention", "linear_attention")
    cfg = hf_config("qwen3_next", types)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = transformers.Qwen3NextForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "m", safe_serialization=True, max_shard_size="40KB")
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    gdn_shards = {f for k, f in index["weight_map"].items() if ".linear_attn." in k}
    assert len(gdn_shards) >= 2, f"fixture must spread the GDN layers over shards, got {shards}"
    blocks = load_hf_folder(tmp_path / "m")
    assert [i for i, _ in blocks] == [0, 2, 3]
    assert_layers_match_hf(model, blocks, torch.randn(1, 7, 32, generator=gen))
    gone = sorted(gdn_shards)[-1]
    (tmp_path / "m" / gone).unlink()
    with pytest.raises(ValueError, match=re.escape(gone)):
        load_hf_folder(tmp_path / "m")
