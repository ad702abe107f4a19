"""Tiny random Hugging Face hybrid causal LMs built in the test (no downloads), shared by tests/lm and the GPU tests.

``build(family, seed, **overrides)`` returns an eval-mode HF model in float32 whose every parameter is random
(fan-in scaled matrices, norms away from their init, non-trivial gates, identity-ish convs), so a wrong layout,
norm placement or gate cannot hide. Families: qwen3_next (MoE top-k 2 + a dense layer, GVA 3, untied),
qwen3_5 (dense, tied, GVA 1), qwen3_5_vl (Qwen3_5ForConditionalGeneration with a tiny vision tower),
qwen3_5_moe (MoE top-k 2, GVA 2, untied), olmo_hybrid (GVA 2, conv bias, beta in [0, 2], untied).
Head dims are small and not the CUDA kernels' (the reference path runs on CPU); ``gpu=True`` picks 64/128.
"""
from __future__ import annotations

import contextlib
import math

import torch

FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_vl", "qwen3_5_moe", "olmo_hybrid")
LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
# build(..., **EPS_CONDITIONED) for tests comparing fp32 logits of two implementations: with the configs' default
# rms_norm_eps (1e-6) these random models' gated norms amplify fp32 rounding where a value head's output is near
# zero (rms ~1e-3), in HF's, onnxruntime's and our results alike: worst max |diff| 2.5e-4 over 60 models (a float64
# run of our model shows both fp32 paths off by the same amount), 4.4e-4 and 9.4e-4 in two CI runs; with 1e-4 the
# same 60 models reach 3.1e-5 (tests/lm/test_hybrid_hf.py).
EPS_CONDITIONED = dict(rms_norm_eps=1e-4)


def _common(gpu: bool) -> dict:
    if gpu:
        return dict(vocab_size=256, hidden_size=256, intermediate_size=384, num_hidden_layers=len(LAYERS),
                    layer_types=list(LAYERS), num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096)
    return dict(vocab_size=96, hidden_size=48, intermediate_size=72, num_hidden_layers=len(LAYERS),
                layer_types=list(LAYERS), num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                linear_conv_kernel_dim=4, linear_key_head_dim=12, linear_value_head_dim=10,
                linear_num_key_heads=2, linear_num_value_heads=6, max_position_embeddings=256)


def hf_config(family: str, gpu: bool = False, **overrides):
    import transformers as tf
    c = _common(gpu)
    moe = dict(moe_intermediate_size=40 if not gpu else 128, shared_expert_intermediate_size=56 if not gpu else 192,
               num_experts=6, num_experts_per_tok=2)
    rope = dict(rope_theta=10000.0, partial_rotary_factor=0.25)
    if family == "qwen3_next":
        c.update(moe, mlp_only_layers=[3], norm_topk_prob=True, tie_word_embeddings=False, rope_parameters=rope)
        c.update(overrides)
        return tf.Qwen3NextConfig(**c)
    if family in ("qwen3_5", "qwen3_5_vl"):
        rd = int(c["head_dim"] * 0.25) // 2                       # rotary frequencies
        mrope = [rd - 2 * (rd // 3), rd // 3, rd // 3]
        c.update(linear_num_value_heads=2, tie_word_embeddings=True,
                 rope_parameters=dict(rope, rope_type="default", mrope_section=mrope, mrope_interleaved=True))
        c.update(overrides)
        if family == "qwen3_5":
            return tf.Qwen3_5TextConfig(**c)
        vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=c["hidden_size"],
                      patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
        return tf.Qwen3_5Config(text_config=c, vision_config=vision, tie_word_embeddings=True,
                                image_token_id=c["vocab_size"] - 1, video_token_id=c["vocab_size"] - 2,
                                vision_start_token_id=c["vocab_size"] - 3, vision_end_token_id=c["vocab_size"] - 4)
    if family == "qwen3_5_moe":
        c.pop("intermediate_size")
        c.update(moe, linear_num_value_heads=4, tie_word_embeddings=False, rope_parameters=rope)
        c.update(overrides)
        return tf.Qwen3_5MoeTextConfig(**c)
    if family == "olmo_hybrid":
        c.pop("head_dim")
        c.update(linear_num_value_heads=4, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                 rope_parameters=dict(rope_theta=10000.0, rope_type="default"))
        c.update(overrides)
        return tf.OlmoHybridConfig(**c)
    raise ValueError(family)


def model_class(family: str):
    import transformers as tf
    return {"qwen3_next": tf.Qwen3NextForCausalLM, "qwen3_5": tf.Qwen3_5ForCausalLM,
            "qwen3_5_vl": tf.Qwen3_5ForConditionalGeneration, "qwen3_5_moe": tf.Qwen3_5MoeForCausalLM,
            "olmo_hybrid": tf.OlmoHybridForCausalLM}[family]


@torch.no_grad()
def randomize_(model, gen: torch.Generator) -> None:
    """Every parameter random at a scale that keeps activations O(1) (see the module docstring)."""
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() >= 2 and "conv1d" not in name:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(fan_in)))
        elif "conv1d" in name and leaf == "weight":
            W = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / math.sqrt(W)))
            p[:, 0, -1] += 1.0
        elif leaf == "A_log":
            p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.5, generator=gen))
        elif leaf == "dt_bias":
            p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.0, generator=gen))
        elif "norm" in name and torch.all(p == 0):       # zero-centred norms: an offset from 1
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        elif "norm" in name:
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        else:                                            # biases
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    for name, m in model.named_modules():                # embeddings: rows of norm ~1 (O(1) tied logits)
        if isinstance(m, torch.nn.Embedding):
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (1.0 / math.sqrt(m.weight.shape[1])))


@torch.no_grad()
def add_olmo_conv_bias_(model, gen: torch.Generator) -> None:
    """Give every OLMo-Hybrid GDN conv a random bias (HF's causal_conv1d_* pass ``conv1d.bias`` through)."""
    for m in model.modules():
        if type(m).__name__ == "OlmoHybridGatedDeltaNet" and isinstance(getattr(m, "conv1d", None), torch.nn.Conv1d):
            old = m.conv1d
            new = torch.nn.Conv1d(old.in_channels, old.out_channels, old.kernel_size[0], groups=old.groups,
                                  padding=old.padding[0], bias=True)
            new.weight.copy_(old.weight)
            new.bias.copy_(0.3 * torch.randn(new.bias.shape, generator=gen))
            m.conv1d = new


def build(family: str, gen: torch.Generator, gpu: bool = False, **overrides):
    """A tiny random HF model of ``family`` (float32, eval, attention implementation "eager")."""
    cfg = hf_config(family, gpu=gpu, **overrides)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "text_config"):
        cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    model = model_class(family)(cfg)
    randomize_(model, gen)
    if family == "olmo_hybrid":
        add_olmo_conv_bias_(model, gen)
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def save(model, path) -> None:
    """save_pretrained into ``path`` (safetensors; per-expert MoE and OLMo's split convs as transformers writes them)."""
    model.save_pretrained(str(path))


def build_saved(family: str, gen: torch.Generator, path, gpu: bool = False, **overrides):
    """:func:`build` then :func:`save` to ``path``; the test skips (with the reason) when this transformers cannot
    build the family."""
    import pytest
    import transformers
    try:
        model = build(family, gen, gpu=gpu, **overrides)
    except (TypeError, ValueError, AttributeError) as e:
        pytest.skip(f"transformers {transformers.__version__} cannot build a tiny {family}: {e}")
    save(model, path)
    return model


_KERNEL_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "chunk_gated_delta_rule",
                     "fused_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")


@contextlib.contextmanager
def hf_torch_path(model):
    """Within the block, ``model``'s modeling module runs HF's own PyTorch functions, not FLA / causal-conv1d
    kernels even where those are installed (they are CUDA-only: a CPU reference would fail, and in float32 they
    may use tf32). transformers wraps each such function with functools.wraps: ``__wrapped__`` is the torch path."""
    import sys
    mods = {sys.modules[type(m).__module__] for m in model.modules()
            if type(m).__module__.startswith("transformers.models.")}
    saved = []
    for mod in mods:
        for name in _KERNEL_FUNCTIONS:
            fn = getattr(mod, name, None)
            if fn is not None and hasattr(fn, "__wrapped__"):
                saved.append((mod, name, fn))
                setattr(mod, name, fn.__wrapped__)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


_EXPORTS: dict = {}


def exported_folder(family: str, tmp_path_factory, tag: str, **overrides):
    """(ExportFolder of a tiny random ``family`` model exported with the default options, the generator that
    built it, seeded by ``tag``), built once per (tag, family) in a test session; ``overrides`` go to
    :func:`build`."""
    key = (tag, family)
    if key not in _EXPORTS:
        from conftest import seed_for

        from gdn_deploy.export.loading import load_targets
        from gdn_deploy.export.model_export import ExportOptions, export_model
        from gdn_deploy.runtime.folder import ExportFolder
        gen = torch.Generator().manual_seed(seed_for(f"{tag}::{family}"))
        root = tmp_path_factory.mktemp(f"{tag}_{family}")
        save(build(family, gen, **overrides), root / "hf")
        export_model(load_targets(str(root / "hf"))[0], root / "out", ExportOptions(verify=False))
        _EXPORTS[key] = (ExportFolder(root / "out"), gen)
    return _EXPORTS[key]
