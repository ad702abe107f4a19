"""Multi-token-prediction (MTP) heads of Qwen3.5 (dense, MoE) and Qwen3-Next, run in PyTorch as draft models.

Checkpoint layout (``mtp.*`` beside the main model's weights; the public serving implementations read it the
same way): ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden`` (RMS norms of the model's kind),
``mtp.fc`` (``Linear(2 * hidden, hidden)``, no bias), ``mtp.layers.{i}.*`` (decoder layers with full attention and
the model's MLP kind: MoE for Qwen3-Next and Qwen3.5-MoE, dense for Qwen3.5), ``mtp.norm``; the embeddings and the
lm_head are the main model's.

One step at position p takes the main model's final-normed hidden state of token p-1 and the embedding of token
p, and predicts token p+1:

    x = fc(cat(pre_fc_norm_embedding(embed(token_p)), pre_fc_norm_hidden(hidden_{p-1})))
    x = layers[step % n](x at position p, with the head's own KV cache)
    hidden'_p = norm(x);  logits = lm_head(hidden'_p)

Further draft tokens chain the head on its own ``hidden'`` and its own previous draft.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import HybridConfig
from .model import DecoderLayer, HybridLM
from .norms import RMSNorm
from .speculative_steps import attend_cached

__all__ = ["MTPHead", "MTPWeightsMissing", "load_mtp_head", "mtp_layer_count"]

_MOE_KEY = ".mlp.experts."


class MTPWeightsMissing(LookupError):
    """The folder has no ``mtp.*`` tensors (or its model has no attention layers an MTP layer could use)."""


def mtp_layer_count(raw_config: dict) -> int:
    """Number of MTP layers config.json declares (``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``), 0 if
    none."""
    text = raw_config.get("text_config", raw_config)
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if key in text:
            return int(text[key] or 0)
    return 0


class MTPHead(nn.Module):
    """The MTP module of one checkpoint; parameter names are the checkpoint's without ``mtp.``."""

    def __init__(self, config: HybridConfig, num_layers: int = 1, mlp_type: str = "dense"):
        super().__init__()
        if config.attention is None:
            raise MTPWeightsMissing("the model has no attention configuration for an MTP layer")
        c = self.layer_config = dataclasses.replace(config, layer_types=["full_attention"] * num_layers,
                                                    mlp_types=[mlp_type] * num_layers, notes=[])
        H, eps, kind = config.hidden_size, config.rms_norm_eps, config.norm_kind
        self.pre_fc_norm_embedding = RMSNorm(H, eps, kind)
        self.pre_fc_norm_hidden = RMSNorm(H, eps, kind)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(num_layers))
        self.norm = RMSNorm(H, eps, kind)

    def init_caches(self, B: int, capacity: int, dtype=None, device=None) -> list[tuple[Tensor, Tensor]]:
        """Zero KV caches ``[B, Hkv, capacity, D]`` of every MTP layer."""
        a = self.layer_config.attention
        p = self.fc.weight
        shape = (B, a.num_kv_heads, capacity, a.head_dim)
        return [(torch.zeros(shape, dtype=dtype or p.dtype, device=device or p.device),
                 torch.zeros(shape, dtype=dtype or p.dtype, device=device or p.device)) for _ in self.layers]

    def forward_cached(self, embeds: Tensor, hidden: Tensor, positions: Tensor, caches: list, step: int = 0):
        """embeds, hidden [B, L, H] (token p's embedding, the normed hidden of token p-1), positions [B, L] ->
        (normed hidden' [B, L, H], caches with layer ``step % n``'s cache written at the positions)."""
        B, L, H = embeds.shape
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        i = step % len(self.layers)
        layer = self.layers[i]
        h = x.reshape(B * L, H)
        y, kc, vc = attend_cached(layer.self_attn, layer._mixer_in(h).reshape(B, L, H), positions, *caches[i])
        h = layer._finish(h, y.reshape(B * L, H))
        caches = list(caches)
        caches[i] = (kc, vc)
        return self.norm(h).reshape(B, L, H), caches


def _mlp_type(keys) -> str:
    return "moe" if any(_MOE_KEY in k or k.startswith("layers.0.mlp.gate.") for k in keys) else "dense"


def load_mtp_head(folder: str | Path, model: Optional[HybridLM] = None) -> MTPHead:
    """The MTP head of a Hugging Face folder (float32 unless ``model`` is given: then its dtype and device).

    Raises :class:`MTPWeightsMissing` when the folder has no ``mtp.*`` tensors, CheckpointError when they do not
    match config.json."""
    from .hf_folder import CheckpointError, _read_tensors, hf_state_dict_to_model, hf_weight_files, read_hf_config
    config, raw = read_hf_config(folder)
    files = hf_weight_files(folder)
    prefix = {k: k.split("mtp.", 1)[1] for k in files if k.startswith(("mtp.", "model.mtp."))}
    if not prefix:
        raise MTPWeightsMissing(f"{folder}: no mtp.* tensors in the weights (this checkpoint has no multi-token "
                                "prediction head); use --speculative ngram")
    sd = {prefix[k]: t for k, t in _read_tensors(files, list(prefix)).items()}
    layer_ids = {int(k.split(".")[1]) for k in sd if k.startswith("layers.")}
    n = max(layer_ids) + 1 if layer_ids else 0
    if n == 0 or mtp_layer_count(raw) not in (0, n):
        raise CheckpointError(f"{folder}: mtp.* holds {n} layer(s) but config.json declares {mtp_layer_count(raw)}")
    sd = hf_state_dict_to_model(config, sd)
    with torch.device("meta"):
        head = MTPHead(config, n, _mlp_type(sd))
    own = head.state_dict()
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    bad = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or bad:
        raise CheckpointError(f"{folder}: mtp.* weights do not match config.json: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}, shape mismatch {bad[:3]}")
    ref = model.embed_tokens.weight if model is not None else None
    sd = {k: v.to(ref.dtype if ref is not None else torch.float32) if v.is_floating_point() else v
          for k, v in sd.items()}
    head.load_state_dict(sd, strict=True, assign=True)
    if ref is not None:
        head.to(ref.device)
    return head.eval()


def lm_head_logits(model: HybridLM, normed: Tensor) -> Tensor:
    """The main model's lm_head on already-normed hidden states."""
    return F.linear(normed, model.embed_tokens.weight) if model.lm_head is None else model.lm_head(normed)
