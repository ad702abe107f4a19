"""gdn-deploy checkpoint format: round trips (.pt, .safetensors), weights_only loading, pickle opt-in, errors."""
from __future__ import annotations

import json

import pytest
import torch

from gdn_deploy.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from gdn_deploy.model import GDNBlock, GDNConfig, GDNLM

CFG = dict(hidden_size=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, vocab_size=40,
           num_layers=2, intermediate_size=16)


def _lm(seed, **kw):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = GDNLM(GDNConfig(**{**CFG, **kw}))
        m.reset_parameters()
    return m.eval()


def _logits(m, gen):
    ids = torch.randint(0, 40, (9,), generator=gen)
    with torch.no_grad():
        return m.prefill(ids, torch.tensor([0, 4, 9], dtype=torch.int32))[0]


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize("tied", [True, False])
def test_lm_round_trip(tmp_path, seed, gen, suffix, tied):
    m = _lm(seed, tie_word_embeddings=tied, projection_layout="qwen3_5" if tied else "qwen3_next")
    path = save_checkpoint(m, tmp_path / f"m{suffix}")
    back = load_checkpoint(path)
    assert type(back) is GDNLM and back.config == m.config and _same(back, m)
    g2 = torch.Generator().manual_seed(seed)
    assert torch.equal(_logits(back, g2), _logits(m, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_bf16_block_round_trip_keeps_dtype(tmp_path, seed, suffix):
    b = GDNBlock(GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8))
    b.reset_parameters()
    b = b.to(torch.bfloat16)
    back = load_checkpoint(save_checkpoint(b, tmp_path / f"b{suffix}"))
    assert type(back) is GDNBlock and back.out_proj.weight.dtype == torch.bfloat16 and _same(back, b)


def test_pt_file_is_plain_weights_only_data(tmp_path, seed):
    path = save_checkpoint(_lm(seed), tmp_path / "m.pt")
    raw = torch.load(path, weights_only=True, map_location="cpu")
    assert raw["format"] == FORMAT and raw["kind"] == "GDNLM"
    assert GDNConfig.from_dict(raw["config"]) == GDNConfig(**CFG)
    assert all(isinstance(v, torch.Tensor) for v in raw["state_dict"].values())


def test_pickled_module_needs_opt_in(tmp_path, seed, gen):
    m = _lm(seed)
    path = tmp_path / "whole_module.pt"
    torch.save(m, path)
    with pytest.raises(ValueError, match="allow_pickle=True") as e:
        load_checkpoint(path)
    assert "arbitrary code" in str(e.value)
    back = load_checkpoint(path, allow_pickle=True)
    assert type(back) is GDNLM and _same(back, m)


def test_errors_name_the_problem(tmp_path, seed):
    m = _lm(seed)
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    good = torch.load(save_checkpoint(m, tmp_path / "m.pt"), weights_only=True)

    def write(obj, name):
        torch.save(obj, tmp_path / name)
        return tmp_path / name

    with pytest.raises(ValueError, match="unsupported format 'other/9'"):
        load_checkpoint(write({**good, "format": "other/9"}, "fmt.pt"))
    with pytest.raises(ValueError, match="not a gdn-deploy checkpoint"):
        load_checkpoint(write({"weights": torch.zeros(2)}, "plain.pt"))
    with pytest.raises(ValueError, match="not a gdn-deploy checkpoint"):
        load_checkpoint(write(torch.zeros(3), "tensor.pt"))
    with pytest.raises(ValueError, match="kind 'Llama'"):
        load_checkpoint(write({**good, "kind": "Llama"}, "kind.pt"))
    sd = dict(good["state_dict"])
    sd.pop("norm.weight")
    with pytest.raises(ValueError, match=r"missing keys \['norm.weight'\]"):
        load_checkpoint(write({**good, "state_dict": sd}, "missing.pt"))
    sd = {**good["state_dict"], "extra.bias": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"unexpected keys \['extra.bias'\]"):
        load_checkpoint(write({**good, "state_dict": sd}, "extra.pt"))
    sd = {**good["state_dict"], "embed_tokens.weight": torch.zeros(41, 32)}
    with pytest.raises(ValueError, match=r"shape mismatch: embed_tokens.weight \(41, 32\) \(expected \(40, 32\)\)"):
        load_checkpoint(write({**good, "state_dict": sd}, "shape.pt"))
    with pytest.raises(ValueError, match="bad config.*projection_layout"):
        load_checkpoint(write({**good, "config": {**good["config"], "projection_layout": "x"}}, "cfg.pt"))
    with pytest.raises(ValueError, match="bad config.*unknown key"):
        load_checkpoint(write({**good, "config": {**good["config"], "heads": 3}}, "cfg2.pt"))
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="garbage.pt"):
        load_checkpoint(tmp_path / "garbage.pt")


def test_safetensors_without_gdn_config_is_refused(tmp_path):
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "x.safetensors"), metadata={"note": json.dumps({})})
    with pytest.raises(ValueError, match="no 'gdn_config'"):
        load_checkpoint(tmp_path / "x.safetensors")
