"""HybridLM against Hugging Face transformers on tiny random models built in the test (CPU, fp32, offline).

Each family is saved with ``save_pretrained`` and loaded back through ``load_hf_causal_lm`` (the on-disk key
layout: per-expert MoE weights, OLMo's split q/k/v convs and norm names, multimodal prefixes). HF runs every
prompt alone (no padding); ours runs them packed as one ragged batch.
"""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import rel_err

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402
from greedy_agreement import unexplained_difference  # noqa: E402

from gdn_deploy.lm.generate import greedy_generate, pack_prompts  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.lm.model import HybridLM, decode_states_from_prefill  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

# Logits of two fp32 computations of the same model: the spec's export_check float32 tolerance elementwise
# (|a - b| <= 1e-4 + 1e-3 |b|) and 5e-5 norm-relative, on models built with tiny.EPS_CONDITIONED (the configs'
# default eps lets these random models amplify fp32 rounding past it: see there); the greedy-token tests keep the
# default.
ATOL, RTOL = SPEC.check_tolerance("float32")["atol"], SPEC.check_tolerance("float32")["rtol"]
REL = 5e-5
# (family, HF config overrides): the five families plus variants that flip one feature each
CASES = {
    "qwen3_next": ("qwen3_next", {}),
    "qwen3_next_tied_unnormed": ("qwen3_next", dict(norm_topk_prob=False, tie_word_embeddings=True,
                                                    num_experts_per_tok=3, linear_num_value_heads=4)),
    "qwen3_5": ("qwen3_5", {}),
    "qwen3_5_vl": ("qwen3_5_vl", {}),
    "qwen3_5_moe": ("qwen3_5_moe", {}),
    "qwen3_5_moe_bias": ("qwen3_5_moe", dict(attention_bias=True, tie_word_embeddings=True)),
    "olmo_hybrid": ("olmo_hybrid", {}),
    "olmo_hybrid_nope_gqa1": ("olmo_hybrid", dict(rope_parameters=dict(rope_theta=None, rope_type="default"),
                                                  num_key_value_heads=4, linear_allow_neg_eigval=False)),
}


def _load(case: str, gen, tmp_path, conditioned: bool = True):
    family, over = CASES[case]
    if conditioned:
        over = {**tiny.EPS_CONDITIONED, **over}
    try:
        hf = tiny.build(family, gen, **over)
    except (TypeError, ValueError, AttributeError) as e:     # an older transformers without this option
        pytest.skip(f"transformers {transformers.__version__} cannot build {case}: {e}")
    tiny.save(hf, tmp_path)
    return hf, load_hf_causal_lm(tmp_path)


def _prompts(gen, lens, vocab):
    return [torch.randint(0, vocab, (L,), generator=gen).tolist() for L in lens]


@torch.no_grad()
def _hf_logits(hf, prompt):
    return hf(input_ids=torch.tensor([prompt])).logits[0]


def _assert_close(ours, ref, what):
    excess = float(((ours - ref).abs() - (ATOL + RTOL * ref.abs())).max())
    err, rel = float((ours - ref).abs().max()), rel_err(ours, ref)
    assert excess <= 0 and rel <= REL, f"{what}: max |logit diff| {err:.2e} (beyond {ATOL} + {RTOL}|ref| by " \
                                       f"{max(excess, 0):.1e}), rel {rel:.1e} (<= {REL})"


@pytest.mark.parametrize("case", list(CASES))
def test_ragged_prefill_logits_match_hf(case, gen, tmp_path):
    hf, ours = _load(case, gen, tmp_path)
    prompts = _prompts(gen, [7, 1, 13, 4], ours.hybrid_config.vocab_size)
    ids, cu = pack_prompts(prompts)
    ref = torch.cat([_hf_logits(hf, p) for p in prompts])
    for attention in ("spans", "mask"):             # eager PyTorch's form and the exported graphs' form
        with torch.no_grad():
            all_logits, _ = ours.prefill(ids, cu, attention=attention)
            last, _ = ours.prefill(ids, cu, last_only=True, attention=attention)
        _assert_close(all_logits, ref, f"{case} all-token logits ({attention})")
        _assert_close(last, ref[cu[1:].long() - 1], f"{case} last-token logits ({attention})")


def _decode_vs_prefill(model, full, K, M):
    """(prefill(K+M) logits at positions K..K+M-1, prefill(K) + M decode steps' logits), both [M, N, vocab]."""
    c = model.hybrid_config
    ids, cu = pack_prompts([p[:k] for p, k in zip(full, K)])
    with torch.no_grad():
        ref, _ = model.forward_prefill(*pack_prompts(full))
        _, st = model.forward_prefill(ids, cu)
        st = decode_states_from_prefill(c, st, cu, capacity=12)
        pos = torch.tensor(K)
        starts = pack_prompts(full)[1].long()[:-1]
        want, got = [], []
        for m in range(M):
            tok = torch.tensor([p[k + m] for p, k in zip(full, K)])
            lg, st = model.forward_decode(tok, pos, st)
            got.append(lg)
            want.append(ref[starts + pos])
            pos = pos + 1
    return torch.stack(want), torch.stack(got)


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_then_decode_equals_longer_prefill(case, gen, tmp_path):
    """prefill(K) + decode(M) logits == prefill(K+M) at the same positions, on a ragged batch: to float64
    rounding when the model runs in float64, and both fp32 paths within fp32 error of that float64 result."""
    _, ours = _load(case, gen, tmp_path)
    full = _prompts(gen, [9, 4, 6], ours.hybrid_config.vocab_size)
    K, M = [6, 1, 3], 3
    want64, got64 = _decode_vs_prefill(copy.deepcopy(ours).double(), full, K, M)
    assert rel_err(got64, want64) < 1e-12, f"{case}: float64 decode vs prefill rel err {rel_err(got64, want64):.1e}"
    want32, got32 = _decode_vs_prefill(ours, full, K, M)
    for what, x in (("prefill", want32), ("decode", got32)):
        _assert_close(x, want64, f"{case} fp32 {what} vs float64")


@pytest.mark.parametrize("case", ["qwen3_next", "qwen3_5", "qwen3_5_vl", "qwen3_5_moe", "olmo_hybrid"])
def test_greedy_tokens_equal_hf_generate(case, gen, tmp_path):
    """3 prompts of different lengths (one of length 1) in one batch, 24 new tokens each, vs HF generate alone: the
    same tokens, or the first difference at a near-tie of HF's logits (greedy_agreement.unexplained_difference)."""
    hf, ours = _load(case, gen, tmp_path, conditioned=False)
    prompts = _prompts(gen, [1, 6, 11], ours.hybrid_config.vocab_size)
    n = 24
    got = greedy_generate(ours, prompts, n)
    hf.generation_config.eos_token_id = None     # no early stop, and no suppressed EOS (min_new_tokens would)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n,
                              attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert out.shape[1] == len(p) + n
        want = out[0, len(p):].tolist()

        def hf_logits_at(j, p=p, want=want):       # HF's logits for new token j
            with torch.no_grad():
                return hf(torch.tensor([p + want[:j]])).logits[0, -1]
        # two fp32 computations may part only at a near-tie (summation order differs with threads and alignment)
        why = unexplained_difference(got[i], want, hf_logits_at, atol=1e-5, rtol=1e-5)
        assert why is None, f"{case} prompt {i}: {why}"


def test_layers_and_state_shapes(gen, tmp_path):
    """Which layer is what, and the state convention of every layer kind."""
    _, ours = _load("qwen3_next", gen, tmp_path)
    c = ours.hybrid_config
    assert c.layer_types == tiny.LAYERS and c.mlp_types == ["moe", "moe", "moe", "dense", "moe"]
    ids, cu = pack_prompts([[1, 2, 3], [4]])
    with torch.no_grad():
        _, st = ours.prefill(ids, cu)
    g, a = c.gdn, c.attention
    for t, (x, y) in zip(c.layer_types, st):
        if t == "linear_attention":
            assert x.shape == (2, g.conv_dim, g.conv_kernel_size - 1) and y.shape == (2, g.num_v_heads,
                                                                                        g.head_k_dim, g.head_v_dim)
            assert y.dtype == torch.float32
        else:
            assert x.shape == y.shape == (4, a.num_kv_heads, a.head_dim)
    dec = decode_states_from_prefill(c, st, cu, capacity=7)
    k = dec[1][0]
    assert k.shape == (2, a.num_kv_heads, 7, a.head_dim)
    assert torch.equal(k[0, :, :3], st[1][0][:3].permute(1, 0, 2)) and not k[0, :, 3:].any()
    assert torch.equal(k[1, :, :1], st[1][0][3:4].permute(1, 0, 2)) and not k[1, :, 1:].any()
    assert isinstance(ours, HybridLM)
