"""Whole hybrid causal LMs (:class:`~gdn_deploy.lm.HybridLM`) as prefill / decode graphs with flat tensor I/O.

One state layout, shared by both graphs (prefill continues from it, decode steps it), listed in the sidecar
(``states``) with names, symbolic shapes, dtypes, layer index and kind (``i`` = the model's layer index)::

  prefill  in:  input_ids [T] int64, cu_seqlens [N+1] int32, positions [T] int64 (past length + index),
                pad_index [N, L] int64 (packed row of sequence n's i-th new token; outside [0, T) = padding),
                then every state of N sequences (below, B = N)
           out: logits [N, vocab] (each sequence's last token; [T, vocab] with all_logits), every state updated
  decode   in:  input_ids [B] int64, positions [B] int64 (tokens already cached = the new token's position),
                every state of B sequences
           out: logits [B, vocab], every state updated
  states:       GDN layer i:       conv_state_i [B, conv_dim, W-1], rec_state_i [B, Hv, K, V] (float32)
                attention layer i: key_cache_i [B, Hkv, S, D], value_cache_i [B, Hkv, S, D] (model dtype,
                                   S = capacity; slot p holds the post-RoPE key/value of position p)
                outputs: conv_state_out_i, rec_state_out_i, key_cache_out_i, value_cache_out_i (same shapes)

Every output shape is a function of input shapes (no data-dependent shapes, as TensorRT needs). Attention
(:mod:`gdn_deploy.export.onnx_cache_attention`, the sidecar's ``attention``): onnxruntime graphs hold one
``com.microsoft::GroupQueryAttention`` per attention layer on the per-sequence padded view (queries ``[N, L, H*D]``
gathered through ``pad_index``), which writes the new rows into the caches and attends within each sequence; the
TensorRT copies hold ``ScatterND`` row writes + the standard ONNX ``Attention``. Nothing is sized by all packed
tokens squared. A fresh prompt passes zero states and positions from 0; a second turn or the next chunk of a long
prompt passes the states a previous call returned, so it costs only its new tokens. Every sequence of a prefill
needs >= 1 token, and past + L <= S for every sequence (the L padded rows are written; slots after a sequence's
end are overwritten before they are read). onnxruntime's CPU GroupQueryAttention runs a prompt that continues from
a past one sequence per call (runtimes split such batches: :func:`gdn_deploy.runtime.generation.prefill`).
MoE layers run onnxruntime's ``com.microsoft::MoE`` where it can (``op``, :mod:`.onnx_moe`), else ``grouped`` in
prefill and ``gather`` in decode, the forms the TensorRT copies hold (see :mod:`gdn_deploy.lm.mlp` for the cost).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .onnx_moe import onnxruntime_moe_form

__all__ = ["HybridPrefillGraph", "HybridDecodeGraph", "hybrid_io", "hybrid_state_specs", "hybrid_example_feed",
           "HYBRID_DIM_DOCS"]

HYBRID_DIM_DOCS = {"S": "KV-cache capacity (slots per sequence; every position < S, past + L <= S in prefill)",
                   "L": "prefill's padded view: the most new tokens of one sequence (pad_index [N, L])"}


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
                out.append(_spec(i, "gdn", role, "float32", name, shape))
        else:
            a = c.attention
            for role in ("key", "value"):
                out.append(_spec(i, "attention", role, act, f"{role}_cache", [a.num_kv_heads, "S", a.head_dim]))
    return out


def _spec(i: int, kind: str, role: str, dtype: str, stem: str, shape: list) -> dict[str, Any]:
    return {"layer": i, "kind": kind, "role": role, "dtype": dtype,
            "decode_input": f"{stem}_{i}", "decode_output": f"{stem}_out_{i}",
            "prefill_input": f"{stem}_{i}", "prefill_output": f"{stem}_out_{i}",
            "decode_shape": ["B", *shape], "prefill_shape": ["N", *shape]}


def hybrid_io(model, graph: str, all_logits: bool = False, hidden: bool = False) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of a graph: ``{"name", "shape", "dtype"}`` dicts in graph order. ``hidden``: prefill also
    returns ``hidden [T, H]``, every token's final-normed hidden state (MTP exports: the draft head reads it)."""
    V = model.hybrid_config.vocab_size
    act = _dtype_name(model.dtype)
    states = hybrid_state_specs(model)
    if graph == "prefill":
        ins = [{"name": "input_ids", "shape": ["T"], "dtype": "int64"},
               {"name": "cu_seqlens", "shape": ["N+1"], "dtype": "int32"},
               {"name": "positions", "shape": ["T"], "dtype": "int64"},
               {"name": "pad_index", "shape": ["N", "L"], "dtype": "int64"}]
        ins += [{"name": s["prefill_input"], "shape": s["prefill_shape"], "dtype": s["dtype"]} for s in states]
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
    """``moe_impl``: "op" for export (:func:`.onnx_moe.onnxruntime_moe_form`; "grouped" without the op); the PyTorch
    runtime sets "routed"."""

    def __init__(self, model, all_logits: bool = False, hidden: bool = False):
        super().__init__()
        self.net, self.all_logits, self.moe_impl = model, all_logits, onnxruntime_moe_form(model.dtype, "grouped")
        self.hidden = hidden

    def forward(self, input_ids: Tensor, cu_seqlens: Tensor, positions: Tensor, pad_index: Tensor, *flat: Tensor):
        self.net.set_moe_impl(self.moe_impl)
        states = list(zip(flat[0::2], flat[1::2]))
        normed: list = [] if self.hidden else None
        logits, new = self.net.forward_prefill(input_ids, cu_seqlens, states, positions=positions,
                                               last_only=not self.all_logits, pad_index=pad_index,
                                               hidden_out=normed)
        return (logits, *(normed or []), *_flatten(self.net.hybrid_config.layer_types, new, self.net.dtype))


class HybridDecodeGraph(nn.Module):
    """``moe_impl``: "op" for export ("gather" without the op); the PyTorch runtime sets "routed"."""

    def __init__(self, model):
        super().__init__()
        self.net, self.moe_impl = model, onnxruntime_moe_form(model.dtype, "gather")

    def forward(self, input_ids: Tensor, positions: Tensor, *flat: Tensor):
        self.net.set_moe_impl(self.moe_impl)
        states = list(zip(flat[0::2], flat[1::2]))
        logits, new = self.net.forward_decode(input_ids, positions, states)
        return (logits, *_flatten(self.net.hybrid_config.layer_types, new, self.net.dtype))


def hybrid_example_feed(model, graph: str, *, tokens: int = 11, seqs: int = 3, batch: int = 3, capacity: int = 7,
                        seed: int = 0, zero_states: bool = False) -> dict[str, Tensor]:
    """Random inputs of a graph, in graph order. Prefill: ragged sequences of >= 1 token each with random states,
    capacity ``L + capacity``; one sequence continues from a random past length, several start at position 0
    (onnxruntime's CPU GroupQueryAttention continues one sequence per call; runtimes split such batches). Decode:
    tokens at random positions < capacity. KV caches hold random values at the slots before each sequence's
    position and zeros from it on, as runtimes keep them (a cache starts zero; padding rows write zeros):
    onnxruntime's GroupQueryAttention returns zeros after the written rows where it does not share past and present
    buffers, the other forms keep the input there, so only this invariant makes the outputs comparable.
    ``zero_states``: zero states. Sizes >= 2 when used for export."""
    from ..lm.model import padded_view
    gen = torch.Generator().manual_seed(seed)
    V = model.hybrid_config.vocab_size
    feed: dict[str, Tensor] = {}
    if graph == "prefill":
        tokens = max(tokens, seqs)
        cuts = torch.randperm(tokens - 1, generator=gen)[:seqs - 1].sort().values + 1   # distinct: no empty sequence
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32)
        lens = (cu[1:] - cu[:-1]).long()
        L = int(lens.max())
        capacity = L + capacity
        past = torch.zeros(seqs, dtype=torch.long) if zero_states or seqs > 1 else \
            torch.randint(0, capacity - L + 1, (seqs,), generator=gen)
        pos = torch.cat([int(p) + torch.arange(int(n)) for p, n in zip(past, lens)])
        feed.update({"input_ids": torch.randint(0, V, (tokens,), generator=gen), "cu_seqlens": cu,
                     "positions": pos, "pad_index": padded_view(cu)})
        sizes = {"N": seqs, "S": capacity}
        filled = past
    else:
        feed.update({"input_ids": torch.randint(0, V, (batch,), generator=gen),
                     "positions": torch.randint(0, capacity, (batch,), generator=gen)})
        sizes = {"B": batch, "S": capacity}
        filled = feed["positions"]
    ins, _ = hybrid_io(model, graph)
    dt = model.dtype
    for t in ins[len(feed):]:
        shape = [sizes[d] if isinstance(d, str) else d for d in t["shape"]]
        scale = 0.0 if zero_states else (0.5 if not t["name"].startswith("rec") else 0.1)
        x = torch.randn(shape, generator=gen) * scale
        if t["name"].startswith("conv"):
            x = x.to(dt).float()               # values the model dtype holds exactly
        elif t["dtype"] != "float32":
            x = x.to(dt)
        if "S" in t["shape"]:                  # a KV cache [n, Hkv, S, D]: zeros from each sequence's position on
            keep = torch.arange(shape[2])[None, :] < filled[:, None]
            x = torch.where(keep[:, None, :, None], x, torch.zeros((), dtype=x.dtype))
        feed[t["name"]] = x
    return feed
