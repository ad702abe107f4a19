"""The logits of a loaded HF folder do not depend on how its weights lie in memory (issue 31, item 1).

MKL's results depend on the operands' alignment; safetensors tensors are views into the mapped file at 4- or
8-byte aligned offsets, so before the loader aligned them the same weights gave last-bit different logits from a
single file, a sharded folder and an in-memory copy (the routed-MoE models' ``[1, hidden]`` shared_expert_gate
showed it: ``torch.equal`` failed for most random models). This repeats those comparisons over many inputs.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.lm.generate import pack_prompts  # noqa: E402
from gdn_deploy.lm.hf_folder import hf_state_dict_to_model, load_hf_causal_lm, read_hf_config  # noqa: E402
from gdn_deploy.lm.model import HybridLM  # noqa: E402

ROUNDS = 12          # input batches per model; the old loader differed on most of them


def _batch(gen):
    lens = torch.randint(1, 9, (3,), generator=gen).tolist()
    return pack_prompts([torch.randint(0, 90, (L,), generator=gen).tolist() for L in lens])


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_single_file_sharded_and_in_memory_logits_are_bitwise_equal(family, gen, tmp_path):
    hf = tiny.build(family, gen)
    hf.save_pretrained(str(tmp_path / "one"))
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="40KB")
    cfg, _ = read_hf_config(tmp_path / "one")
    mem = HybridLM(cfg).eval()
    mem.load_state_dict(hf_state_dict_to_model(cfg, hf.state_dict()), strict=True)
    one, sharded = load_hf_causal_lm(tmp_path / "one"), load_hf_causal_lm(tmp_path / "sharded")
    for name, p in one.state_dict().items():             # the same bytes: what the loader must guarantee first
        assert torch.equal(p, sharded.state_dict()[name]) and torch.equal(p, mem.state_dict()[name]), name
    differ = []
    with torch.no_grad():
        for r in range(ROUNDS):
            ids, cu = _batch(gen)
            ref = one.forward_prefill(ids, cu)[0]
            assert torch.isfinite(ref).all()
            for what, m in (("sharded", sharded), ("in-memory", mem)):
                if not torch.equal(m.forward_prefill(ids, cu)[0], ref):
                    differ.append(f"round {r}: {what}")
    assert not differ, f"logits not bitwise equal to the single-file load's in {len(differ)} of {2 * ROUNDS}: {differ}"


def test_every_loaded_tensor_is_64_byte_aligned(gen, tmp_path):
    tiny.build("qwen3_5_moe", gen).save_pretrained(str(tmp_path), max_shard_size="40KB")
    m = load_hf_causal_lm(tmp_path)
    bad = [n for n, t in m.state_dict().items() if t.numel() and t.data_ptr() % 64]
    assert not bad, f"{len(bad)} tensors not 64-byte aligned, e.g. {bad[:3]}"
