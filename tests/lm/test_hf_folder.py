"""Loading HF folders: sharded and fused layouts, and bad folders ending in one clear error."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.lm.generate import pack_prompts  # noqa: E402
from gdn_deploy.lm.hf_folder import (CheckpointError, UnsupportedModelError, hf_state_dict_to_model,  # noqa: E402
                                     load_hf_causal_lm, read_hf_config)


def _saved(family, gen, path, **save_kw):
    hf = tiny.build(family, gen)
    hf.save_pretrained(str(path), **save_kw)
    return hf


def _logits(model, gen):
    ids, cu = pack_prompts([torch.randint(0, 90, (L,), generator=gen).tolist() for L in (4, 1, 6)])
    with torch.no_grad():
        return model.forward_prefill(ids, cu)[0]


def test_sharded_folder_equals_single_file(gen, tmp_path):
    hf = _saved("qwen3_5_moe", gen, tmp_path / "one")
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    a, b = load_hf_causal_lm(tmp_path / "one"), load_hf_causal_lm(tmp_path / "sharded")
    g2 = torch.Generator().manual_seed(7)
    assert torch.equal(_logits(a, g2), _logits(b, torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe", "olmo_hybrid"])
def test_in_memory_layout_loads_like_the_saved_one(family, gen, tmp_path):
    """transformers' in-memory names (fused experts, fused OLMo conv) map as well as the saved ones."""
    hf = _saved(family, gen, tmp_path)
    cfg, _ = read_hf_config(tmp_path)
    from gdn_deploy.lm.model import HybridLM
    if family == "olmo_hybrid":
        cfg.gdn.conv_bias = True
    m = HybridLM(cfg).eval()
    m.load_state_dict(hf_state_dict_to_model(cfg, hf.state_dict()), strict=True)
    disk = load_hf_causal_lm(tmp_path)
    assert torch.equal(_logits(m, torch.Generator().manual_seed(3)), _logits(disk, torch.Generator().manual_seed(3)))


def test_dtype_option_casts_weights(gen, tmp_path):
    _saved("qwen3_5", gen, tmp_path)
    m = load_hf_causal_lm(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert torch.isfinite(_logits(m, gen).float()).all()


def test_missing_shard(gen, tmp_path):
    _saved("qwen3_5", gen, tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shard\\(s\\) \\['{shard.name}'\\] named in model.safetensors"):
        load_hf_causal_lm(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(UnsupportedModelError, match="architecture 'LlamaForCausalLM' is not supported; supported: "
                                                    "Qwen3NextForCausalLM"):
        load_hf_causal_lm(tmp_path)


def test_layer_types_disagreeing_with_weights(gen, tmp_path):
    _saved("qwen3_5", gen, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["layer_types"][1], cfg["layer_types"][2] = "linear_attention", "full_attention"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="layer_types says layer 1 is linear_attention, but the weights hold "
                                              "an attention \\(self_attn\\) block"):
        load_hf_causal_lm(tmp_path)


def test_missing_and_wrong_shaped_weights(gen, tmp_path):
    from safetensors.torch import load_file, save_file
    _saved("qwen3_next", gen, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.pop("model.layers.1.self_attn.q_norm.weight")
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="1 missing \\(e.g. layers.1.self_attn.q_norm.weight\\)"):
        load_hf_causal_lm(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    shutil.rmtree(tmp_path)
    _saved("qwen3_next", gen, tmp_path)
    cfg["intermediate_size"] += 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="weight shapes do not match config.json: layers.3.mlp.gate_proj.weight"):
        load_hf_causal_lm(tmp_path)


def test_folder_problems(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_hf_causal_lm(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_hf_causal_lm(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_hf_causal_lm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pickle weights are never read"):
        load_hf_causal_lm(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_hf_causal_lm(tmp_path)


def test_multimodal_folder_notes_the_vision_tower(gen, tmp_path):
    _saved("qwen3_5_vl", gen, tmp_path)
    cfg, raw = read_hf_config(tmp_path)
    assert raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg.family == "qwen3_5" and any("vision tower is not" in n for n in cfg.notes)
