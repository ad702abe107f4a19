"""Read a Hugging Face config.json (as a dict) into a :class:`HybridConfig`, without transformers.

Supported architectures (the first supported ``architectures`` entry, whose family ``model_type`` must match
where given; else ``model_type``): Qwen3NextForCausalLM, Qwen3_5ForCausalLM,
Qwen3_5ForConditionalGeneration (its text model; the vision tower is not exported), Qwen3_5MoeForCausalLM,
Qwen3_5MoeForConditionalGeneration (text model), OlmoHybridForCausalLM. Missing fields take the defaults of the
transformers 5 config classes; legacy top-level ``rope_theta`` / ``partial_rotary_factor`` / ``rope_scaling``
are read like transformers reads them.
"""
from __future__ import annotations

from typing import Any

from .attention import AttentionConfig
from .config import HybridConfig
from .gdn import GDNConfig
from .mlp import MoEConfig

__all__ = ["config_from_hf_dict", "SUPPORTED_ARCHITECTURES", "UnsupportedModelError"]


class UnsupportedModelError(ValueError):
    """The folder holds a model this package does not reproduce."""


# architecture -> (family, composite: the text model sits under text_config)
SUPPORTED_ARCHITECTURES = {
    "Qwen3NextForCausalLM": ("qwen3_next", False),
    "Qwen3_5ForCausalLM": ("qwen3_5", False),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", True),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", False),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", True),
    "OlmoHybridForCausalLM": ("olmo_hybrid", False),
}
_BY_MODEL_TYPE = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                  "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                  "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration", "olmo_hybrid": "OlmoHybridForCausalLM"}

# transformers 5 defaults of the text configs (used for fields config.json leaves out)
_QWEN_COMMON = dict(hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                    partial_rotary_factor=0.25)
_DEFAULTS = {
    "qwen3_next": dict(_QWEN_COMMON, vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                       num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, decoder_sparse_step=1,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=10,
                       num_experts=512, norm_topk_prob=True, mlp_only_layers=[]),
    "qwen3_5": dict(_QWEN_COMMON, vocab_size=248320, hidden_size=4096, intermediate_size=12288,
                    num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4),
    "qwen3_5_moe": dict(_QWEN_COMMON, vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                        num_attention_heads=16, num_key_value_heads=2, moe_intermediate_size=512,
                        shared_expert_intermediate_size=512, num_experts_per_tok=8, num_experts=256),
    "olmo_hybrid": dict(vocab_size=100352, hidden_size=3840, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=30, hidden_act="silu", max_position_embeddings=65536,
                        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                        linear_conv_kernel_dim=4, linear_allow_neg_eigval=True, partial_rotary_factor=1.0),
}
OLMO_GATED_NORM_EPS = 1e-5   # OlmoHybridGatedDeltaNet.o_norm's eps is fixed, not rms_norm_eps


def _architecture(d: dict) -> str:
    archs = d.get("architectures") or []
    for a in archs:
        if a in SUPPORTED_ARCHITECTURES:
            _check_model_type(d, a)
            return a
    if archs:
        raise UnsupportedModelError(
            f"architecture {archs[0]!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    mt = d.get("model_type")
    if mt in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[mt]
    raise UnsupportedModelError(f"model_type {mt!r} (no 'architectures' entry) is not supported; supported "
                                f"model types: {', '.join(_BY_MODEL_TYPE)}")


def _check_model_type(d: dict, arch: str) -> None:
    """config.json's model_type, where given, must name the family of its architectures entry."""
    mt = d.get("model_type")
    family = SUPPORTED_ARCHITECTURES[arch][0]
    fits = sorted(t for t, a in _BY_MODEL_TYPE.items() if SUPPORTED_ARCHITECTURES[a][0] == family)
    if mt is not None and mt not in fits:
        raise ValueError(f"config.json: model_type {mt!r} does not match architectures entry {arch!r} (expected "
                         f"model_type {' or '.join(repr(t) for t in fits)}); the file is inconsistent: fix one of them")


def _int(d: dict, key: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"config.json: {key}={v!r} is not an integer")
    return v


def _layer_types(d: dict, family: str, n: int) -> list[str]:
    types = d.get("layer_types")
    if types is None:
        if family == "olmo_hybrid":
            types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
            if "full_attention" not in types:
                types[-1] = "full_attention"
        else:
            k = int(d.get("full_attention_interval", 4))
            types = ["linear_attention" if (i + 1) % k else "full_attention" for i in range(n)]
    types = list(types)
    if len(types) != n:
        raise ValueError(f"config.json: layer_types has {len(types)} entries but num_hidden_layers={n}")
    bad = sorted({t for t in types if t not in ("linear_attention", "full_attention")})
    if bad:
        raise UnsupportedModelError(f"config.json: layer type(s) {bad} are not supported (only linear_attention "
                                    "and full_attention)")
    return types


def _mlp_types(d: dict, family: str, n: int) -> list[str]:
    if family == "qwen3_5_moe":
        return ["moe"] * n
    if family != "qwen3_next":
        return ["dense"] * n
    only = set(d.get("mlp_only_layers") or [])
    step = int(d.get("decoder_sparse_step", 1))
    E = int(d.get("num_experts", 0))
    return ["moe" if (i not in only and E > 0 and (i + 1) % step == 0) else "dense" for i in range(n)]


def _rope(d: dict, family: str) -> dict:
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"config.json: rope_parameters must be an object, got {rope!r}")
    if any(isinstance(v, dict) for v in rope.values()):
        raise UnsupportedModelError("config.json: per-layer-type rope_parameters are not supported")
    theta = rope["rope_theta"] if "rope_theta" in rope else d.get("rope_theta", 10000.0)
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if partial is None:
        partial = _DEFAULTS[family]["partial_rotary_factor"]
    rtype = rope.get("rope_type", rope.get("type", "default"))
    factor = 1.0
    if rtype == "linear":
        factor = float(rope.get("factor", 1.0))
    elif rtype not in ("default", "mrope"):
        raise UnsupportedModelError(f"config.json: rope_type {rtype!r} is not supported (supported: default, linear, "
                                    "and Qwen3.5's multimodal default with mrope_section)")
    return dict(theta=None if theta is None else float(theta), partial=float(partial), factor=factor,
                mrope_section=rope.get("mrope_section"), mrope_interleaved=rope.get("mrope_interleaved"))


def config_from_hf_dict(root: dict[str, Any]) -> HybridConfig:
    """HybridConfig of a HF config.json dict. Raises UnsupportedModelError / ValueError with one clear line."""
    if not isinstance(root, dict):
        raise ValueError(f"config.json: expected a JSON object, got {type(root).__name__}")
    arch = _architecture(root)
    family, composite = SUPPORTED_ARCHITECTURES[arch]
    notes = []
    d = root
    if composite:
        if not isinstance(root.get("text_config"), dict):
            raise ValueError(f"config.json: {arch} has no text_config object")
        d = dict(root["text_config"])
        if root.get("vision_config") is not None:
            notes.append(f"{arch}: only the text model is exported; the vision tower is not")
        if "tie_word_embeddings" in root:     # HF ties by the top-level (composite) config
            d["tie_word_embeddings"] = root["tie_word_embeddings"]
    src = d
    d = {**_DEFAULTS[family], **{k: v for k, v in d.items() if v is not None}}
    if d.get("hidden_act", "silu") not in ("silu", "swish"):
        raise UnsupportedModelError(f"config.json: hidden_act={d['hidden_act']!r}; only silu is supported")
    H, n = _int(d, "hidden_size"), _int(d, "num_hidden_layers")
    layer_types = _layer_types(d, family, n)
    mlp_types = _mlp_types(d, family, n)
    eps = float(d["rms_norm_eps"])
    olmo = family == "olmo_hybrid"

    gdn = None
    if "linear_attention" in layer_types:
        nh = _int(d, "num_attention_heads")
        Hk = int(d.get("linear_num_key_heads") or nh)
        Hv = int(d.get("linear_num_value_heads") or nh)
        K = int(d.get("linear_key_head_dim") or int(0.75 * H / Hk))
        V = int(d.get("linear_value_head_dim") or 2 * K)
        gdn = GDNConfig(hidden_size=H, num_k_heads=Hk, num_v_heads=Hv, head_k_dim=K, head_v_dim=V,
                        conv_kernel_size=_int(d, "linear_conv_kernel_dim"), rms_norm_eps=eps,
                        projection_layout={"qwen3_next": "qwen3_next", "olmo_hybrid": "olmo_hybrid"}.get(
                            family, "qwen3_5"),
                        beta_scale=2.0 if olmo and d.get("linear_allow_neg_eigval", True) else 1.0,
                        gated_norm_eps=OLMO_GATED_NORM_EPS if olmo else None)

    attention = None
    if "full_attention" in layer_types:
        nh = _int(d, "num_attention_heads")
        nkv = d.get("num_key_value_heads") or nh
        head_dim = d.get("head_dim") or H // nh
        rope = _rope(src, family)
        attention = AttentionConfig(
            num_heads=nh, num_kv_heads=int(nkv), head_dim=int(head_dim), bias=bool(d.get("attention_bias", False)),
            output_gate=not olmo, qk_norm="proj" if olmo else "head",
            norm_kind="scale_fp32" if olmo else "zero_centered", rms_norm_eps=eps,
            rope_theta=rope["theta"], rotary_dim=int(int(head_dim) * rope["partial"]) if rope["theta"] else 0,
            rope_factor=rope["factor"], rope_fp32=olmo)

    moe = None
    if "moe" in mlp_types:
        moe = MoEConfig(num_experts=_int(d, "num_experts"), top_k=_int(d, "num_experts_per_tok"),
                        intermediate_size=_int(d, "moe_intermediate_size"),
                        shared_expert_intermediate_size=_int(d, "shared_expert_intermediate_size"),
                        norm_topk_prob=True if family == "qwen3_5_moe" else bool(d.get("norm_topk_prob", True)))

    eos = d.get("eos_token_id", root.get("eos_token_id"))
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return HybridConfig(
        family=family, vocab_size=_int(d, "vocab_size"), hidden_size=H, layer_types=layer_types,
        mlp_types=mlp_types, gdn=gdn, attention=attention, moe=moe,
        intermediate_size=int(d.get("intermediate_size") or 0) if "dense" in mlp_types else 0,
        rms_norm_eps=eps, norm_kind="scale_fp32" if olmo else "zero_centered", post_norm_attention=olmo,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=int(d.get("max_position_embeddings") or 0), eos_token_ids=eos_ids,
        bos_token_id=d.get("bos_token_id"), pad_token_id=d.get("pad_token_id"), architecture=arch, notes=notes)
