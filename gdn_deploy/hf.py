"""Hugging Face compatibility: GDN blocks from Qwen3-Next / Qwen3.5 modules, configs, state dicts, folders.

Parameter names of :class:`~gdn_deploy.model.GDNBlock` equal those of ``Qwen3NextGatedDeltaNet`` and
``Qwen3_5GatedDeltaNet`` (and ``Qwen3_5MoeGatedDeltaNet``), so weights load 1:1. Folders are read from
``config.json`` + ``*.safetensors`` only (never pickle); only the ``linear_attn`` tensors are read.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .model import GDNBlock, GDNConfig, check_state_dict

__all__ = ["block_from_hf", "config_from_hf", "blocks_from_hf_state_dict", "load_hf_folder", "layout_for_model_type"]

_LAYOUTS = {"qwen3_next": "qwen3_next", "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
            "qwen3_5_moe": "qwen3_5", "qwen3_5_moe_text": "qwen3_5"}
_HF_FIELDS = ("hidden_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim")
_KEY_RE = re.compile(r"^(?P<prefix>(?:.*\.)?)layers\.(?P<idx>\d+)\.linear_attn\.(?P<name>.+)$")


def layout_for_model_type(model_type: str) -> str:
    """``projection_layout`` of a HF ``model_type`` (qwen3_next -> interleaved qkvz/ba, qwen3_5* -> split)."""
    if model_type not in _LAYOUTS:
        raise ValueError(f"model_type {model_type!r} is not a supported Gated DeltaNet model "
                         f"(supported: {', '.join(sorted(_LAYOUTS))})")
    return _LAYOUTS[model_type]


def _as_dict(hf_config: Any) -> dict:
    d = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    # multimodal Qwen3.5 configs nest the language model under text_config
    if "linear_num_key_heads" not in d and isinstance(d.get("text_config"), dict):
        inner = dict(d["text_config"])
        inner.setdefault("model_type", d.get("model_type", ""))
        return inner
    return d


def config_from_hf(hf_config: Any) -> GDNConfig:
    """GDNConfig of the Gated DeltaNet layers of a HF config (object or config.json dict).

    Only the block fields are filled; the LM fields stay at their defaults (the whole hybrid model, attention
    and MoE layers included, is :func:`gdn_deploy.lm.hf_folder.load_hf_causal_lm`)."""
    d = _as_dict(hf_config)
    missing = [f for f in _HF_FIELDS if f not in d]
    if missing:
        raise ValueError(f"HF config: missing field(s) {missing}; is this a Qwen3-Next / Qwen3.5 config? "
                         f"(model_type={d.get('model_type')!r})")
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"HF config: hidden_act={act!r}; the Gated DeltaNet conv supports only silu")
    return GDNConfig(hidden_size=int(d["hidden_size"]), num_k_heads=int(d["linear_num_key_heads"]),
                     num_v_heads=int(d["linear_num_value_heads"]), head_k_dim=int(d["linear_key_head_dim"]),
                     head_v_dim=int(d["linear_value_head_dim"]), conv_kernel_size=int(d["linear_conv_kernel_dim"]),
                     rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                     projection_layout=layout_for_model_type(d.get("model_type", "")))


def block_from_hf(module: nn.Module) -> GDNBlock:
    """A GDNBlock with the weights (dtype, device) of a ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``."""
    if hasattr(module, "in_proj_qkvz") and hasattr(module, "in_proj_ba"):
        layout = "qwen3_next"
    elif all(hasattr(module, n) for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
        layout = "qwen3_5"
    else:
        raise ValueError(f"{type(module).__name__} is not a Qwen3-Next / Qwen3.5 Gated DeltaNet module "
                         "(expected in_proj_qkvz + in_proj_ba, or in_proj_qkv/z/b/a)")
    act = getattr(module, "activation", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{type(module).__name__}.activation={act!r}; only silu is supported")
    if getattr(module.conv1d, "bias", None) is not None:
        raise ValueError(f"{type(module).__name__}.conv1d has a bias; HF Gated DeltaNet convs have none")
    cfg = GDNConfig(hidden_size=module.hidden_size, num_k_heads=module.num_k_heads, num_v_heads=module.num_v_heads,
                    head_k_dim=module.head_k_dim, head_v_dim=module.head_v_dim,
                    conv_kernel_size=module.conv_kernel_size, rms_norm_eps=float(module.norm.variance_epsilon),
                    projection_layout=layout)
    p = module.out_proj.weight
    block = GDNBlock(cfg).to(dtype=p.dtype, device=p.device)
    _load_strict(block, module.state_dict(), f"{type(module).__name__}")
    return block


def _load_strict(block: GDNBlock, sd: dict, what: str) -> None:
    check_state_dict(block, sd, f"{what}: state dict does not match GDNBlock({block.config.projection_layout})")
    block.load_state_dict(sd, strict=True)


def _linear_layer_ids(d: dict) -> list[int] | None:
    types = d.get("layer_types")
    if types is None:
        return None
    return [i for i, t in enumerate(types) if t == "linear_attention"]


def blocks_from_hf_state_dict(config_dict: Any, state_dict: dict) -> list[tuple[int, GDNBlock]]:
    """GDNBlocks of every ``*layers.{i}.linear_attn.*`` group (``mtp.*`` ignored), sorted by layer index.

    ``config_dict`` is a config.json dict or a HF config. Blocks take the dtype of their in/out projections.
    Raises ValueError naming missing layers / keys or shape mismatches."""
    d = _as_dict(config_dict)
    cfg = config_from_hf(d)
    groups: dict[int, dict[str, torch.Tensor]] = {}
    prefixes: dict[int, str] = {}
    for key, t in state_dict.items():
        m = _KEY_RE.match(key)
        if m is None or m.group("prefix").startswith("mtp"):
            continue
        i = int(m.group("idx"))
        if i in prefixes and prefixes[i] != m.group("prefix"):
            raise ValueError(f"state dict: layer {i} linear_attn keys under two prefixes "
                             f"{prefixes[i]!r} and {m.group('prefix')!r}")
        prefixes[i] = m.group("prefix")
        groups.setdefault(i, {})[m.group("name")] = t
    expected = _linear_layer_ids(d)
    if expected is not None:
        absent = [i for i in expected if i not in groups]
        if absent:
            raise ValueError(f"state dict: no linear_attn weights for linear_attention layer(s) {absent} "
                             f"(expected keys like 'model.layers.{absent[0]}.linear_attn.out_proj.weight')")
        extra = sorted(set(groups) - set(expected))
        if extra:
            raise ValueError(f"state dict: linear_attn weights for layer(s) {extra}, which layer_types "
                             "does not mark as linear_attention")
    if not groups:
        raise ValueError("state dict: no '*layers.{i}.linear_attn.*' keys found")
    out = []
    for i in sorted(groups):
        sd = groups[i]
        ref = sd.get("out_proj.weight")
        block = GDNBlock(cfg)
        if ref is not None and ref.is_floating_point():
            block = block.to(ref.dtype)
        _load_strict(block, sd, f"layer {i} ({prefixes[i]}layers.{i}.linear_attn)")
        out.append((i, block))
    return out


def load_hf_folder(path: str | Path) -> list[tuple[int, GDNBlock]]:
    """GDNBlocks of a HF model folder (config.json + *.safetensors; pickle files are never read)."""
    try:
        from safetensors import safe_open
    except ImportError as e:  # pragma: no cover
        raise ValueError("load_hf_folder needs the 'safetensors' package (pip install safetensors)") from e
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory (expected a HF model folder with config.json + *.safetensors)")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{root}: config.json is missing")
    config = json.loads(cfg_file.read_text())
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({root / f for k, f in weight_map.items() if _KEY_RE.match(k)})
        lost = [f.name for f in files if not f.is_file()]
        if lost:
            raise ValueError(f"{root}: shard(s) {lost} named in model.safetensors.index.json are missing")
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in root.glob("*.bin")] + [p.name for p in root.glob("*.pt")]
        hint = f" (found {pickles}; pickle weights are not read, convert them to safetensors)" if pickles else ""
        raise ValueError(f"{root}: no *.safetensors files{hint}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                if _KEY_RE.match(k):
                    sd[k] = fh.get_tensor(k)
    return blocks_from_hf_state_dict(config, sd)
