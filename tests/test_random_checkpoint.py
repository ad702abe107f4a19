"""scripts/make_random_checkpoint.py on a tiny Qwen3.5 config: the shards are valid safetensors that transformers
loads (every tensor present, finite logits), the values have the documented ranges, and the bytes depend only on
the seed and the tensor's name (not on the sharding)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")   # the script reads the config classes' shapes from transformers

REPO = Path(__file__).resolve().parents[1]
TINY = dict(hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, vocab_size=320, rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                mrope_interleaved=True))


@pytest.fixture(scope="module")
def mrc():
    spec = importlib.util.spec_from_file_location("make_random_checkpoint", REPO / "scripts" /
                                                  "make_random_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(mrc, out: Path, seed: int, shard_bytes: int, **over) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    mrc.write_checkpoint(mrc.full_config("qwen3.5-9b", dict(TINY, **over)), out, shard_bytes=shard_bytes,
                         seed=seed, say=lambda *_: None)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = {}
    for fname in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(out / fname)))
    assert set(tensors) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    assert not list(out.glob("*.tmp"))
    return tensors


def test_deterministic_by_seed_and_name(mrc, tmp_path):
    a = _write(mrc, tmp_path / "a", 0, 1 << 30)
    b = _write(mrc, tmp_path / "b", 0, 40_000)                  # other sharding: same tensors
    c = _write(mrc, tmp_path / "c", 1, 1 << 30)
    assert len({p.name for p in (tmp_path / "b").glob("*.safetensors")}) > 2
    assert set(a) == set(b) == set(c)
    for name in a:
        assert a[name].dtype == torch.bfloat16
        assert torch.equal(a[name].view(torch.int16), b[name].view(torch.int16)), name
        assert not torch.equal(a[name].view(torch.int16), c[name].view(torch.int16)), name


def test_value_ranges(mrc, tmp_path):
    t = _write(mrc, tmp_path / "a", 3, 1 << 30, vocab_size=4096, linear_num_value_heads=32)
    t = {k: v.float() for k, v in t.items()}
    assert all(torch.isfinite(v).all() for v in t.values())
    for name, v in t.items():
        if name.endswith("A_log"):
            assert 0 <= v.min() and v.max() <= math.log(16) + 1e-2 and v.std() > 0.3, name
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            assert (v - 1).abs().max() < 0.6 and 0.05 < (v - 1).std() < 0.2, name
        elif v.dim() == 1:
            assert v.abs().max() < 0.6 and 0.05 < v.std() < 0.2, name
        else:
            std = 0.02 if "embed_tokens" in name else 1 / math.sqrt(math.prod(v.shape[1:]))
            rms = v.pow(2).mean().sqrt().item()
            assert std / 1.5 < rms < std * 1.5, (name, rms, std)
            assert abs(v.mean().item()) < 0.1 * rms and abs((v > 0).float().mean().item() - 0.5) < 0.05, name
            ratio = v.abs().max() / v.abs().min()
            assert 8 <= ratio <= 16, (name, ratio)              # four binades, no zeros
            assert len(np.unique(v.numpy())) > min(v.numel() // 4, 200), name


def test_transformers_loads_it(mrc, tmp_path):
    import transformers as tf
    _write(mrc, tmp_path / "m", 0, 1 << 30)
    model, info = tf.Qwen3_5ForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32,
                                                        output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.tensor([[5, 17, 300, 2, 99, 64, 1, 250]])
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    assert 0.1 < logits.std().item() < 10
