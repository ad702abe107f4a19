"""HybridLM on the GPU with its GDN layers on our CUDA kernels, against Hugging Face on tiny random models whose
GDN head dims are the kernels' (K=128, V=64; attention head_dim 64): logits and greedy tokens, fp32 and bf16.

fp32: HF's float32 model on the CPU (its exact PyTorch path) is the reference; our logits must be within the
kernels' fp32 tolerance and our greedy tokens equal its tokens except at a near-tie (two tokens within 1e-3 of
each other in the reference, after which the sequences may part). bf16: both bf16 computations (HF's on the GPU,
with FLA when installed, and ours) are measured against the fp32 model, and ours must be as close as HF's is;
teacher-forced on HF's greedy tokens, our argmax may differ only where the fp32 model does not rank our pick below
HF's token by more than the bf16 noise of that position (tests/greedy_agreement.py).
"""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import rel_err

from greedy_agreement import pick_errors

from ._gpu_util import count_kernel_launches

pytest.importorskip("transformers", reason="needs transformers (pip install -e .[test])")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.lm.generate import greedy_generate, pack_prompts  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"]
FP32_TOL = 1e-4
BF16_FLOOR = 3e-2
NEW = 24


def _models(family, gen, tmp_path):
    hf = tiny.build_saved(family, gen, tmp_path, gpu=True)
    return hf, load_hf_causal_lm(tmp_path)


def _prompts(gen):
    return [torch.randint(0, 256, (L,), generator=gen).tolist() for L in (1, 40, 130)]


@torch.no_grad()
def _hf_generate(hf, prompt, device, with_logits=False):
    """HF's greedy tokens; with_logits: also the logits [NEW, V] each generation step chose from."""
    ids = torch.tensor([prompt], device=device)
    hf.generation_config.eos_token_id = None     # no early stop, and no suppressed EOS (min_new_tokens would)
    out = hf.generate(ids, do_sample=False, max_new_tokens=NEW, attention_mask=torch.ones_like(ids),
                      output_logits=with_logits, return_dict_in_generate=True)
    assert out.sequences.shape[1] == len(prompt) + NEW
    tokens = out.sequences[0, len(prompt):].tolist()
    return (tokens, torch.cat(out.logits).float()) if with_logits else tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_on_kernels_matches_hf(kernels, gen, family, tmp_path, monkeypatch):
    hf, ours = _models(family, gen, tmp_path)
    ours = ours.cuda()
    prompts = _prompts(gen)
    calls = count_kernel_launches(monkeypatch)
    ids, cu = pack_prompts(prompts, "cuda")
    with torch.no_grad():
        logits, _ = ours.forward_prefill(ids, cu)
    assert calls["prefill"] == len(ours.hybrid_config.gdn_layers()), calls
    with torch.no_grad(), tiny.hf_torch_path(hf):
        ref = torch.cat([hf(input_ids=torch.tensor([p])).logits[0] for p in prompts])
    e = rel_err(logits.cpu(), ref)
    assert e <= FP32_TOL, f"{family}: fp32 logits rel err {e:.2e} > {FP32_TOL}"

    got = greedy_generate(ours, prompts, NEW)
    assert calls["decode"] >= (NEW - 1) * len(ours.hybrid_config.gdn_layers()), calls
    for p, g in zip(prompts, got):
        with tiny.hf_torch_path(hf):
            want = _hf_generate(hf, p, "cpu")
        for j, (a, b) in enumerate(zip(g, want)):
            if a == b:
                continue
            with torch.no_grad(), tiny.hf_torch_path(hf):   # a difference is allowed only at a near-tie
                lg = hf(input_ids=torch.tensor([p + want[:j]])).logits[0, -1]
            gap = float((lg[b] - lg[a]).abs())
            assert gap <= 1e-3, f"{family}: token {j} is {a}, HF {b}, reference gap {gap:.2e} (no near-tie)"
            break


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_on_kernels_as_close_to_fp32_as_hf_bf16(kernels, gen, family, tmp_path, monkeypatch):
    hf, ours = _models(family, gen, tmp_path)
    hf32 = hf.cuda()
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16)
    ours = ours.to("cuda", torch.bfloat16)
    prompts = _prompts(gen)
    calls = count_kernel_launches(monkeypatch)
    with torch.no_grad():
        ids, cu = pack_prompts(prompts, "cuda")
        mine = ours.forward_prefill(ids, cu)[0].float()
        ref = torch.cat([hf32(input_ids=torch.tensor([p], device="cuda")).logits[0] for p in prompts]).float()
        theirs = torch.cat([hf16(input_ids=torch.tensor([p], device="cuda")).logits[0] for p in prompts]).float()
    assert calls["prefill"] >= len(ours.hybrid_config.gdn_layers())
    e_hf, e_ours = rel_err(theirs, ref), rel_err(mine, ref)
    assert e_ours <= max(2 * e_hf, BF16_FLOOR), f"{family}: bf16 logits rel err {e_ours:.2e} vs HF bf16 {e_hf:.2e}"

    got = greedy_generate(ours, prompts, NEW)
    for p, g in zip(prompts, got):
        want, steps = _hf_generate(hf16, p, "cuda", with_logits=True)
        full = torch.tensor([p + want], device="cuda")
        with torch.no_grad():       # teacher-forced on HF's tokens: our pick vs HF's, judged by the fp32 model
            forced = ours.forward_prefill(full[0], torch.tensor([0, full.shape[1]], dtype=torch.int32,
                                                                device="cuda"))[0].float()
            r32 = hf32(full).logits[0].float()
            r16 = hf16(full).logits[0].float()
        new = slice(len(p) - 1, full.shape[1] - 1)
        pick, tgt = forced[new].argmax(-1), full[0, len(p):]
        # a differing pick is wrong only where fp32 ranks it below HF's token by more than the bf16 noise of HF's
        # generation step, HF's prefill and ours at that position (a MoE router near a tie may pick another expert
        # in any of them); where fp32 prefers our pick, HF's bf16 slipped (tests/greedy_agreement.py)
        bad = pick_errors(pick, tgt, r32[new], steps, r16[new], forced[new])
        assert not bad, f"{family}: teacher-forced argmax differs from HF beyond the bf16 noise at {bad[:5]}"
        if g[0] != want[0]:
            assert pick_errors(torch.tensor([g[0]]), torch.tensor([want[0]]), r32[new][:1].cpu(), steps[:1].cpu(),
                               r16[new][:1].cpu(), forced[new][:1].cpu()) == [], \
                f"{family}: first generated token differs from HF"
