"""Tiny random Hugging Face Qwen3.5 / Qwen3-Next causal LMs on the GPU with their Gated DeltaNet calls
routed to our CUDA kernels (``route_to_gdn_ops``), against the same models on their own PyTorch path.

This is the path that silently went wrong when HF passed g in float32 and beta in bfloat16: logits,
greedy tokens and the decode steps (HF's one-token calls go to ``gdn::decode``) must agree.
Head dims are 64/128 so the CUDA kernels run (not the reference fallback).
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch

import hf_tiny_models as tiny
from conftest import rel_err

from ._gpu_util import count_kernel_launches

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[test])")

DEVICE = "cuda"
LOGIT_TOL = 3e-2     # bf16 model: two bf16 computations of the same logits (norm-relative)


def _tiny(family: str, seed: int):
    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4,
                  linear_key_head_dim=128, linear_value_head_dim=64, linear_num_key_heads=2,
                  linear_num_value_heads=4, max_position_embeddings=512, initializer_range=0.06,
                  layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    if family == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**common))
    else:
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**common, moe_intermediate_size=128, num_experts=4,
                                                     num_experts_per_tok=2, shared_expert_intermediate_size=128))
    with torch.no_grad():   # non-trivial gates and norms so a wrong route cannot hide
        for m in model.modules():
            if hasattr(m, "A_log") and hasattr(m, "dt_bias"):
                m.A_log.uniform_(-2.0, 1.0)
                m.dt_bias.uniform_(-1.0, 1.0)
                m.norm.weight.uniform_(0.5, 1.5)
                w = m.conv1d.weight                     # identity-ish conv: q/k/v of O(1), not O(0.05)
                w.normal_(0.0, 0.5 / w.shape[-1] ** 0.5)
                w[:, 0, -1] += 1.0
    return model.to(DEVICE, torch.bfloat16).eval()


@contextlib.contextmanager
def _routed(model):
    from gdn_deploy.hf_routing import is_hf_gdn_module, route_to_gdn_ops
    layers = [m for m in model.modules() if is_hf_gdn_module(m)]
    assert layers, "no Gated DeltaNet layer found"
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # a reference fallback ("kernel unavailable") fails the test
        for m in layers:
            stack.enter_context(route_to_gdn_ops(m))
        yield


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_hf_model_routed_to_kernels_matches_hf(kernels, seed, family, monkeypatch):
    """bf16 model: our path must be as close to the model's fp32 logits as HF's own bf16 path is.

    (Two bf16 computations of a MoE model differ by more than bf16 rounding: a router near a tie
    picks another expert. So both bf16 paths are measured against the fp32 model, not each other.)"""
    model = _tiny(family, seed)
    model32 = copy.deepcopy(model).float()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, 300), generator=gen).cuda()
    calls = count_kernel_launches(monkeypatch)
    with torch.no_grad():
        with tiny.hf_torch_path(model32):      # the fp32 truth: HF's own torch path, not FLA's tf32 kernels
            ref32 = model32(ids).logits.float()
        hf16 = model(ids).logits.float()
        with _routed(model):
            ours = model(ids).logits.float()
    assert calls["prefill"] == 3, calls
    e_hf, e_ours = rel_err(hf16, ref32), rel_err(ours, ref32)
    assert e_ours <= max(2 * e_hf, LOGIT_TOL), \
        f"{family}: routed logits rel err {e_ours:.3e} vs fp32, HF's own bf16 path {e_hf:.3e}"

    # greedy generation: HF's path and ours; then ours teacher-forced on HF's tokens. Where our token differs
    # from HF's, the fp32 model must rank the two within the bf16 noise of that position: the larger of HF's and
    # ours (a MoE router near a tie picks another expert in either bf16 computation; the logits check above bounds
    # our path as a whole).
    prompt = ids[:, :37]
    with torch.no_grad():
        hf = model.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24)
        with _routed(model):
            routed = model.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24)
            forced = model(hf).logits.float()
        hf_forced = model(hf).logits.float()
        with tiny.hf_torch_path(model32):
            ref_forced = model32(hf).logits.float()
    assert calls["decode"] >= 23 * 3, calls           # one-token steps went through gdn::decode
    new = slice(prompt.shape[1] - 1, hf.shape[1] - 1)
    want = hf[:, new.start + 1:new.stop + 1]
    pick = forced[:, new].argmax(-1)
    ref = ref_forced[:, new]
    gap = (ref.gather(-1, want[..., None]) - ref.gather(-1, pick[..., None]))[..., 0].abs()
    noise = torch.maximum((hf_forced[:, new] - ref).abs().amax(-1), (forced[:, new] - ref).abs().amax(-1))
    agree = (pick == want) | (gap <= 2 * noise)
    assert bool(agree.all()), f"{family}: routed argmax differs from HF at {(~agree).nonzero().tolist()[:5]}"
    # the free-running routed generation (its steps decoded through gdn::decode) starts with the token
    # its prefill picks: HF's first token unless that position is a near-tie
    P = prompt.shape[1]
    first_ok = (routed[:, P] == hf[:, P]) | (gap[:, 0] <= 2 * noise[:, 0])
    assert bool(first_ok.all()), f"{family}: first generated token differs from HF"
