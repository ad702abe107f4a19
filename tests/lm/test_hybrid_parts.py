"""HybridLM pieces: RoPE (incl. Qwen3.5's interleaved mRoPE), MoE compute modes, the GDNLM case, configs."""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err
from gdn_deploy.lm.attention import (Attention, AttentionConfig, packed_causal_mask, packed_spans, rope_cos_sin,
                                     rope_inv_freq)
from gdn_deploy.lm.config import HybridConfig
from gdn_deploy.lm.generate import check_prompt_lengths, greedy_generate, pack_prompts
from gdn_deploy.lm.mlp import MoEConfig, SparseMoE
from gdn_deploy.lm.model import GDNLM, HybridLM, decode_states_from_prefill, grow_decode_states
from gdn_deploy.models import load_default_model


# ---- attention within packed sequences ------------------------------------------------------------
def _attention_f64_reference(layer, x, positions, lens):
    """Per sequence, plain float64 softmax attention on the layer's own q/k/v (GQA by repeating heads)."""
    q, k, v, gate = layer._qkv(x, positions)
    rep = layer.num_heads // layer.num_kv_heads
    out, start = [], 0
    for n in lens:
        qs, ks, vs = (t[start:start + n].double().transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        s = qs @ ks.transpose(-1, -2) * layer.scaling
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((torch.softmax(s, -1) @ vs).transpose(0, 1).reshape(n, layer.num_heads * layer.head_dim))
        start += n
    o = torch.cat(out) if out else q.new_zeros(0, layer.num_heads * layer.head_dim).double()
    return layer._out(o.to(x.dtype), gate).double()


@pytest.mark.parametrize("lens", [[5, 0, 1, 9, 3], [6, 6, 6], [1], [0, 0], [64, 63, 65]])
@pytest.mark.parametrize("heads,kv", [(4, 2), (6, 1), (3, 3)])
@pytest.mark.parametrize("gate", [True, False])
def test_packed_attention_spans_and_mask_agree_with_float64(lens, heads, kv, gate, gen):
    """Both forms of 'attend within the same sequence' (the exported graphs' [T, T] mask, eager PyTorch's fused
    attention per span) equal a float64 per-sequence softmax on ragged, equal, single and empty sequences."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    layer = Attention(32, AttentionConfig(heads, kv, 16, output_gate=gate, rotary_dim=8)).eval()
    T = sum(lens)
    x = torch.randn(T, 32, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens]) if T else torch.zeros(0, dtype=torch.long)
    with torch.no_grad():
        ref = _attention_f64_reference(layer, x, pos, lens)
        for form in (packed_causal_mask(cu, T), packed_spans(cu)):
            y, k, v = layer.prefill(x, pos, form)
            assert y.shape == (T, 32) and k.shape == v.shape == (T, kv, 16)
            if T:
                assert rel_err(y, ref) <= 1e-5, (type(form), rel_err(y, ref))


def test_packed_spans_must_split_the_tokens(gen):
    layer = Attention(32, AttentionConfig(2, 1, 16)).eval()
    x, pos = torch.randn(5, 32, generator=gen), torch.arange(5)
    y, _, _ = layer.prefill(x[:0], pos[:0], (0,))                      # no sequences at all: nothing to attend
    assert y.shape == (0, 32)
    for bad in ((0, 3), (0, 4, 3, 5), (1, 5), ()):
        with pytest.raises(ValueError, match="do not split the 5 packed tokens"):
            layer.prefill(x, pos, bad)


# ---- RoPE -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim,partial,section", [(256, 0.25, [11, 11, 10]), (64, 0.5, [6, 5, 5]),
                                                      (24, 0.25, [1, 1, 1])])
def test_interleaved_mrope_with_equal_positions_is_1d_rope(head_dim, partial, section, gen):
    """Qwen3.5's text rotary module (3 equal t/h/w position streams, interleaved sections) == our 1-D RoPE."""
    tf = pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding
    cfg = tf.Qwen3_5TextConfig(head_dim=head_dim, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                               rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=partial,
                                                    mrope_section=section, mrope_interleaved=True))
    hf = Qwen3_5TextRotaryEmbedding(cfg)
    pos = torch.randint(0, 30000, (2, 17), generator=gen)
    x = torch.zeros(1, dtype=torch.float32)
    cos_hf, sin_hf = hf(x, pos[None].expand(3, -1, -1))        # what Qwen3_5TextModel passes for text
    cos_hf2, _ = hf(x, pos)                                    # and the 2-D path (expanded inside)
    rd = int(head_dim * partial)
    cos, sin = rope_cos_sin(pos.reshape(-1), rope_inv_freq(1e7, rd))
    assert torch.equal(cos_hf.reshape(-1, rd), cos) and torch.equal(sin_hf.reshape(-1, rd), sin)
    assert torch.equal(cos_hf2.reshape(-1, rd), cos)
    # the same module with *different* streams is not 1-D RoPE: the check above can fail
    other = pos[None].expand(3, -1, -1).clone()
    other[1] += 7
    assert not torch.equal(hf(x, other)[0].reshape(-1, rd), cos)


# ---- MoE ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", [True, False])
def test_moe_modes_agree_and_routed_runs_only_chosen_experts(norm, gen):
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    moe = SparseMoE(32, MoEConfig(num_experts=8, top_k=2, intermediate_size=16, shared_expert_intermediate_size=24,
                                  norm_topk_prob=norm)).eval()
    x = torch.randn(11, 32, generator=gen)
    out = {}
    with torch.no_grad():
        for impl in ("routed", "gather", "dense"):
            moe.impl = impl
            out[impl] = moe(x)
        # float32, the experts' rows summed in another order per form (2.6e-7 seen); a wrong expert or weight is O(1)
        assert rel_err(out["gather"], out["routed"]) < 4e-6 and rel_err(out["dense"], out["routed"]) < 4e-6
        idx, _ = moe.route(x)
        unused = sorted(set(range(8)) - set(idx.flatten().tolist()))
        if unused:                      # poisoned experts nobody chose must not reach the routed result
            moe.experts.gate_up_proj[unused] = float("nan")
            moe.impl = "routed"
            assert torch.equal(moe(x), out["routed"])


# ---- GDNLM is one case of HybridLM --------------------------------------------------------------------
def test_gdnlm_is_a_hybrid_model_with_the_same_weights_and_logits(gen):
    m = load_default_model()
    assert isinstance(m, HybridLM) and m.hybrid_config.layer_types == ["linear_attention"] * 2
    h = HybridLM(HybridConfig.from_gdn_config(m.config)).eval()
    h.load_state_dict(m.state_dict(), strict=True)
    prompts = [torch.randint(0, 256, (L,), generator=gen).tolist() for L in (5, 1, 9)]
    ids, cu = pack_prompts(prompts)
    with torch.no_grad():
        a, convs, recs = m.prefill(ids, cu)
        b, st = h.prefill(ids, cu)
        b2, _ = m.forward_prefill(ids, cu)
    assert torch.equal(a, b) and torch.equal(b2, b)
    for (c, r), c2, r2 in zip(st, convs, recs):
        assert torch.equal(c, c2) and torch.equal(r, r2)
    assert greedy_generate(m, prompts, 5) == greedy_generate(h, prompts, 5)


# ---- configs and guards -------------------------------------------------------------------------------
def test_hybrid_config_round_trip_and_digest():
    c = HybridConfig.from_gdn_config(load_default_model().config)
    d = c.to_dict()
    back = HybridConfig.from_dict(d)
    assert back == c and back.digest() == c.digest()
    d2 = dict(d, vocab_size=d["vocab_size"] + 1)
    assert HybridConfig.from_dict(d2).digest() != c.digest()
    with pytest.raises(ValueError, match="unknown key"):
        HybridConfig.from_dict(dict(d, bogus=1))
    with pytest.raises(ValueError, match="full_attention layers need the attention sizes"):
        HybridConfig.from_dict(dict(d, layer_types=["linear_attention", "full_attention"]))


def test_prompt_guards():
    m = load_default_model()
    m.hybrid_config.max_position_embeddings = 16
    with pytest.raises(ValueError, match="prompt 1: 12 tokens \\+ 5 new exceed .*max_position_embeddings=16"):
        check_prompt_lengths(m, [[1, 2], [3] * 12], 5)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        check_prompt_lengths(m, [[]], 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_prompt_lengths(m, [[300]], 1)


def test_decode_cache_helpers(gen):
    from gdn_deploy.lm.attention import AttentionConfig
    c = HybridConfig(family="qwen3_5", vocab_size=16, hidden_size=8, layer_types=["full_attention"],
                     mlp_types=["dense"], gdn=None, attention=AttentionConfig(num_heads=2, num_kv_heads=1, head_dim=4),
                     intermediate_size=8)
    k = torch.randn(5, 1, 4, generator=gen)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="capacity 2 is smaller than the longest prompt \\(3\\)"):
        decode_states_from_prefill(c, [(k, k)], cu, 2)
    st = decode_states_from_prefill(c, [(k, k)], cu, 4)
    grown = grow_decode_states(c, st, 6)
    assert grown[0][0].shape == (2, 1, 6, 4) and torch.equal(grown[0][0][:, :, :4], st[0][0])
    assert not grown[0][0][:, :, 4:].any()


def test_gdnlm_keeps_its_api_and_errors():
    m = load_default_model()
    assert type(m) is GDNLM and m.config.num_layers == 2
    with pytest.raises(ValueError, match="expected 2 per-layer states"):
        m.prefill(torch.tensor([1, 2]), torch.tensor([0, 2], dtype=torch.int32), [None], [None])
