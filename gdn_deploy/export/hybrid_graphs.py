"""Whole hybrid causal LMs (:class:`~gdn_deploy.lm.HybridLM`) as prefill / decode graphs with flat tensor I/O.

One state convention per layer kind, listed in the sidecar (``states``) with names, symbolic shapes, dtypes,
layer index and kind, so a runtime needs nothing else (``i`` = the model's layer index)::

  prefill  in:  input_ids [T] int64, cu_seqlens [N+1] int32, positions [T] int64
           out: logits [N, vocab] (each sequence's last token; [T, vocab] with all_logits)
                GDN layer i:       conv_state_out_i [N, conv_dim, W-1] float32, rec_state_out_i [N, Hv, K, V] float32
                attention layer i: key_i [T, Hkv, D], value_i [T, Hkv, D]   (post-RoPE, model dtype, packed tokens)
  decode   in:  input_ids [B] int64, positions [B] int64 (tokens already cached = the new token's position)
                GDN layer i:       conv_state_i [B, conv_dim, W-1], rec_state_i [B, Hv, K, V] (float32)
                attention layer i: key_cache_i [B, Hkv, S, D], value_cache_i [B, Hkv, S, D] (model dtype, S = capacity)
           out: logits [B, vocab], conv_state_out_i, rec_state_out_i, key_cache_out_i, value_cache_out_i (same shapes)

Every output shape is a function of input shapes (no data-dependent shapes, as TensorRT needs): prefill returns
keys/values of the packed tokens and the runtime scatters them into ``[B, Hkv, S, D]`` caches
(:func:`gdn_deploy.lm.model.decode_states_from_prefill`); decode writes the new token's key/value at its position
(``position < S``) and masks slots after it. Every sequence of a prefill needs >= 1 token and starts at an empty
cache. MoE layers run ``grouped`` in prefill and ``gather`` in decode (see :mod:`gdn_deploy.lm.mlp` for the cost).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["HybridPrefillGraph", "HybridDecodeGraph", "hybrid_io", "hybrid_state_specs", "hybrid_example_feed",
           "HYBRID_DIM_DOCS"]

HYBRID_DIM_DOCS = {"S": "decode KV-cache capacity (slots per sequence; every position < S)"}


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dt]


def hybrid_state_specs(model) -> list[dict[str, Any]]:
    """Every state tensor: name in decode (input), its prefill output, shapes with dim symbols, dtype, layer, kind."""
    c = model.hybrid_config
    act = _dtype_name(model.dtype)
    out = []
    for i, t in enumerate(c.layer_types):
        if t == "linear_attention":
            g = c.gdn
            for role, name, shape in (("conv", "conv_state", [g.conv_dim, g.conv_kernel_size - 1]),
                                      ("recurrent", "rec_state", [g.num_v_heads, g.head_k_dim, g.head_v_dim])):
                out.append({"layer": i, "kind": "gdn", "role": role, "dtype": "float32",
                            "decode_input": f"{name}_{i}", "decode_output": f"{name}_out_{i}",
                            "prefill_output": f"{name}_out_{i}", "decode_shape": ["B", *shape],
                            "prefill_shape": ["N", *shape]})
        else:
            a = c.attention
            for role in ("key", "value"):
                out.append({"layer": i, "kind": "attention", "role": role, "dtype": act,
                            "decode_input": f"{role}_cache_{i}", "decode_output": f"{role}_cache_out_{i}",
                            "prefill_output": f"{role}_{i}", "decode_shape": ["B", a.num_kv_heads, "S", a.head_dim],
                            "prefill_shape": ["T", a.num_kv_heads, a.head_dim]})
    return out


def hybrid_io(model, graph: str, all_logits: bool = False, hidden: bool = False) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of a graph: ``{"name", "shape", "dtype"}`` dicts in graph order. ``hidden``: prefill also
    returns ``hidden [T, H]``, every token's final-normed hidden state (MTP exports: the draft head reads it)."""
    V = model.hybrid_config.vocab_size
    act = _dtype_name(model.dtype)
    states = hybrid_state_specs(model)
    if graph == "prefill":
        ins = [{"name": "input_ids", "shape": ["T"], "dtype": "int64"},
               {"name": "cu_seqlens", "shape": ["N+1"], "dtype": "int32"},
               {"name": "positions", "shape": ["T"], "dtype": "int64"}]
        outs = [{"name": "logits", "shape": ["T" if all_logits else "N", V], "dtype": act}]
        if hidden:
            outs.append({"name": "hidden", "shape": ["T", model.hybrid_config.hidden_size], "dtype": act})
        outs += [{"name": s["prefill_output"], "shape": s["prefill_shape"], "dtype": s["dtype"]} for s in states]
        return ins, outs
    if graph == "decode":
        ins = [{"name": "input_ids", "shape": ["B"], "dtype": "int64"},
               {"name": "positions", "shape": ["B"], "dtype": "int64"}]
        ins += [{"name": s["decode_input"], "shape": s["decode_shape"], "dtype": s["dtype"]} for s in states]
        outs = [{"name": "logits", "shape": ["B", V], "dtype": act}]
        outs += [{"name": s["decode_output"], "shape": s["decode_shape"], "dtype": s["dtype"]} for s in states]
        return ins, outs
    raise ValueError(f"a hybrid model exports the graphs prefill and decode, not {graph!r}")


def _flatten(layer_types, states, model_dtype) -> list[Tensor]:
    out: list[Tensor] = []
    for t, (a, b) in zip(layer_types, states):
        if t == "linear_attention":
            out += [a.float(), b.float()]
        else:
            out += [a.to(model_dtype), b.to(model_dtype)]
    return out


class HybridPrefillGraph(nn.Module):
    """``moe_impl``: "grouped" for export; the PyTorch runtime sets "routed". ``attention``: "mask" for export (a
    graph with no host reads); the PyTorch runtime sets "spans" (fused causal attention per sequence)."""

    def __init__(self, model, all_logits: bool = False, hidden: bool = False):
        super().__init__()
        self.net, self.all_logits, self.moe_impl, self.attention = model, all_logits, "grouped", "mask"
        self.hidden = hidden

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, positions: Tensor):
        self.net.set_moe_impl(self.moe_impl)
        normed: list = [] if self.hidden else None
        logits, states = self.net.forward_prefill(input_ids, cu_seqlens, positions=positions,
                                                  last_only=not self.all_logits, attention=self.attention,
                                                  hidden_out=normed)
        return (logits, *(normed or []), *_flatten(self.net.hybrid_config.layer_types, states, self.net.dtype))


class HybridDecodeGraph(nn.Module):
    """``moe_impl``: "gather" for export; the PyTorch runtime sets "routed"."""

    def __init__(self, model):
        super().__init__()
        self.net, self.moe_impl = model, "gather"

    def forward(self, input_ids: Tensor, positions: Tensor, *flat: Tensor):
        self.net.set_moe_impl(self.moe_impl)
        states = list(zip(flat[0::2], flat[1::2]))
        logits, new = self.net.forward_decode(input_ids, positions, states)
        return (logits, *_flatten(self.net.hybrid_config.layer_types, new, self.net.dtype))


def hybrid_example_feed(model, graph: str, *, tokens: int = 11, seqs: int = 3, batch: int = 3, capacity: int = 7,
                        seed: int = 0, zero_states: bool = False) -> dict[str, Tensor]:
    """Random inputs of a graph, in graph order: prefill sequences of >= 1 token each (ragged), decode tokens at
    random positions < capacity with random states and caches. Sizes must be >= 2 when used for export."""
    gen = torch.Generator().manual_seed(seed)
    V = model.hybrid_config.vocab_size
    if graph == "prefill":
        tokens = max(tokens, seqs)
        cuts = torch.randperm(tokens - 1, generator=gen)[:seqs - 1].sort().values + 1   # distinct: no empty sequence
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32)
        lens = (cu[1:] - cu[:-1]).long()
        pos = torch.cat([torch.arange(int(n)) for n in lens]) if tokens else torch.zeros(0, dtype=torch.long)
        return {"input_ids": torch.randint(0, V, (tokens,), generator=gen), "cu_seqlens": cu, "positions": pos}
    ins, _ = hybrid_io(model, graph)
    sizes = {"B": batch, "S": capacity}
    feed: dict[str, Tensor] = {"input_ids": torch.randint(0, V, (batch,), generator=gen),
                               "positions": torch.randint(0, capacity, (batch,), generator=gen)}
    dt = model.dtype
    for t in ins[2:]:
        shape = [sizes[d] if isinstance(d, str) else d for d in t["shape"]]
        scale = 0.0 if zero_states else (0.5 if not t["name"].startswith("rec") else 0.1)
        x = torch.randn(shape, generator=gen) * scale
        if t["name"].startswith("conv"):
            x = x.to(dt).float()               # values the model dtype holds exactly
        elif t["dtype"] != "float32":
            x = x.to(dt)
        feed[t["name"]] = x
    return feed
