"""Speculative-decoding graphs of a whole hybrid LM: ``verify``, ``commit`` and, with an MTP head, ``draft``.

They keep the decode graph's state layout and names (:mod:`.hybrid_graphs`); ``L`` = tokens per sequence of one
verify call (1 <= L <= ``max_draft_tokens``), ``H`` = hidden size, ``i`` = the model's layer index::

  verify  in:  input_ids [B, L] int64 (row b: its last accepted token, then its drafts; a row with fewer drafts
               is padded with any ids: every layer is causal, so padding never changes the real tokens' outputs,
               and the commit never lands it), positions [B] int64 (position of each row's first token),
               the decode states (conv_state_i, rec_state_i, key_cache_i, value_cache_i)
          out: logits [B, L, vocab]; hidden [B, L, H] (final-normed, what the MTP head reads; MTP exports only);
               attention layer i: key_cache_out_i, value_cache_out_i (the L keys/values written at their positions:
               the next call overwrites rejected ones before any token attends to them);
               GDN layer i: what its commit needs (float32): conv_inputs_i [B, L, conv_dim] (pre-conv inputs),
               commit_k_i [B, L, Hk, K], commit_delta_i [B, L, Hv, V], commit_g_i [B, L, Hv]
               (GDN states are only read: verify returns none)
  commit  in:  accepted [B] int32 (tokens of each row whose update lands, clamped to [0, L]), per GDN layer:
               conv_state_i, rec_state_i, conv_inputs_i, commit_k_i, commit_delta_i, commit_g_i
          out: conv_state_out_i, rec_state_out_i (GatedDeltaCommit; the conv window shifted by the count)
  draft   in:  input_ids [B, L] int64 (token p), hidden [B, L, H] (the target's normed hidden of token p-1),
               positions [B, L] int64 (p; >= S: a padding entry, writes nothing), last [B] int64 (the entry whose
               outputs are returned, clamped to [0, L-1]), the MTP layer's mtp_key_cache_0, mtp_value_cache_0
               [B, Hkv, S, D]
          out: logits [B, vocab], hidden_out [B, H] (the head's normed output at entry ``last``: the next draft
               step's hidden), mtp_key_cache_out_0, mtp_value_cache_out_0

The commit is a graph of its own (no weights) rather than a part of the next verify call: the runtime runs it after
every verify, so a step may go on with decode.onnx or verify.onnx alike, and the GDN state layout stays decode's.
An MTP export also gives prefill an output ``hidden [T, H]`` (every prompt token's final-normed hidden state): the
MTP head's first call reads it.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from ..lm.mlp import SparseMoE
from ..lm.mtp import lm_head_logits
from ..lm.speculative_steps import conv_commit, uniform_cu_seqlens, verify_step
from .hybrid_graphs import _dtype_name, hybrid_state_specs
from .onnx_moe import onnxruntime_moe_form

__all__ = ["SPECULATIVE_GRAPHS", "HybridVerifyGraph", "HybridCommitGraph", "HybridDraftGraph", "speculative_io",
           "speculative_module", "speculative_example_feed", "commit_names", "mtp_cache_specs"]

SPECULATIVE_GRAPHS = ("verify", "commit", "draft")
_FACTORS = ("conv_inputs", "commit_k", "commit_delta", "commit_g")


def commit_names(layer: int) -> list[str]:
    """Names of the verify outputs (= commit inputs) of GDN layer ``layer``."""
    return [f"{n}_{layer}" for n in _FACTORS]


def _gdn_factor_specs(model, i: int) -> list[dict[str, Any]]:
    g = model.hybrid_config.gdn
    shapes = ([g.conv_dim], [g.num_k_heads, g.head_k_dim], [g.num_v_heads, g.head_v_dim], [g.num_v_heads])
    return [{"name": n, "shape": ["B", "D", *s], "dtype": "float32"} for n, s in zip(commit_names(i), shapes)]


def mtp_cache_specs(model, head) -> list[dict[str, Any]]:
    a = head.layer_config.attention
    shape = ["B", a.num_kv_heads, "S", a.head_dim]
    act = _dtype_name(model.dtype)
    return [{"name": f"mtp_{role}_cache_0", "output": f"mtp_{role}_cache_out_0", "shape": shape, "dtype": act}
            for role in ("key", "value")]


def speculative_io(model, graph: str, head=None) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of verify / commit / draft: ``{"name", "shape", "dtype"}`` dicts in graph order.
    ``head``: the MTP head (verify then also returns ``hidden``; draft needs it)."""
    c = model.hybrid_config
    V, Hd = c.vocab_size, c.hidden_size
    act = _dtype_name(model.dtype)
    states = hybrid_state_specs(model)
    if graph == "verify":
        ins = [{"name": "input_ids", "shape": ["B", "D"], "dtype": "int64"},
               {"name": "positions", "shape": ["B"], "dtype": "int64"}]
        ins += [{"name": s["decode_input"], "shape": s["decode_shape"], "dtype": s["dtype"]} for s in states]
        outs = [{"name": "logits", "shape": ["B", "D", V], "dtype": act}]
        if head is not None:
            outs.append({"name": "hidden", "shape": ["B", "D", Hd], "dtype": act})
        for s in states:
            if s["kind"] == "attention":
                outs.append({"name": s["decode_output"], "shape": s["decode_shape"], "dtype": s["dtype"]})
            elif s["role"] == "recurrent":
                outs += _gdn_factor_specs(model, s["layer"])
        return ins, outs
    if graph == "commit":
        ins = [{"name": "accepted", "shape": ["B"], "dtype": "int32"}]
        outs = []
        gdn = [s for s in states if s["kind"] == "gdn"]
        for conv, rec in zip(gdn[0::2], gdn[1::2]):
            ins += [{"name": s["decode_input"], "shape": s["decode_shape"], "dtype": s["dtype"]} for s in (conv, rec)]
            ins += _gdn_factor_specs(model, conv["layer"])
            outs += [{"name": s["decode_output"], "shape": s["decode_shape"], "dtype": s["dtype"]} for s in (conv, rec)]
        return ins, outs
    if graph == "draft":
        if head is None:
            raise UsageError("draft: the model has no MTP head (no mtp.* weights in its folder); export verify and "
                             "commit only, for prompt-lookup drafts (--speculative ngram)")
        caches = mtp_cache_specs(model, head)
        ins = [{"name": "input_ids", "shape": ["B", "D"], "dtype": "int64"},
               {"name": "hidden", "shape": ["B", "D", Hd], "dtype": act},
               {"name": "positions", "shape": ["B", "D"], "dtype": "int64"},
               {"name": "last", "shape": ["B"], "dtype": "int64"}]
        ins += [{k: t[k] for k in ("name", "shape", "dtype")} for t in caches]
        outs = [{"name": "logits", "shape": ["B", V], "dtype": act},
                {"name": "hidden_out", "shape": ["B", Hd], "dtype": act}]
        outs += [{"name": t["output"], "shape": t["shape"], "dtype": t["dtype"]} for t in caches]
        return ins, outs
    raise ValueError(f"not a speculative graph: {graph!r}")


class HybridVerifyGraph(nn.Module):
    """``moe_impl``: as decode ("op", or "gather" without the op); the PyTorch runtime sets "routed"."""

    def __init__(self, model, hidden: bool = False):
        super().__init__()
        self.net, self.hidden, self.moe_impl = model, hidden, onnxruntime_moe_form(model.dtype, "gather")

    def forward(self, input_ids: Tensor, positions: Tensor, *flat: Tensor):
        self.net.set_moe_impl(self.moe_impl)
        B, L = input_ids.shape
        states = list(zip(flat[0::2], flat[1::2]))
        h, new, pending = verify_step(self.net, input_ids, positions, states)
        normed = self.net.norm(h)
        outs = [lm_head_logits(self.net, normed)]
        if self.hidden:
            outs.append(normed)
        for (a, b), pend in zip(new, pending):
            if pend is None:
                outs += [a.to(self.net.dtype), b.to(self.net.dtype)]
            else:
                outs += [x.float().reshape(B, L, *x.shape[1:]) for x in
                         (pend.mixed, pend.commit_k, pend.commit_delta, pend.commit_g)]
        return tuple(outs)


class HybridCommitGraph(nn.Module):
    """Every GDN layer's states after the first ``accepted[b]`` verified tokens (``gdn::commit`` + the conv
    window); no weights."""

    def forward(self, accepted: Tensor, *flat: Tensor):
        B = accepted.shape[0]
        outs = []
        for i in range(0, len(flat), 6):
            conv, rec, mixed, ck, cd, cg = flat[i:i + 6]
            L = mixed.shape[1]
            cu = uniform_cu_seqlens(B, L, accepted.device)
            acc = accepted.to(torch.int32)
            new_rec = torch.ops.gdn.commit(rec.float(), ck.reshape(B * L, *ck.shape[2:]),
                                           cd.reshape(B * L, *cd.shape[2:]), cg.reshape(B * L, *cg.shape[2:]), cu, acc)
            new_conv = conv_commit(conv.float(), mixed.reshape(B * L, -1), cu, acc)
            outs += [new_conv, new_rec]
        return tuple(outs)


class HybridDraftGraph(nn.Module):
    """One call of the MTP head (its first layer) plus the shared embeddings and lm_head. ``moe_impl``: how an
    MoE MLP of the head runs (as decode: "op", or "gather" without the op)."""

    def __init__(self, model, head):
        super().__init__()
        if len(head.layers) != 1:
            raise UsageError(f"draft: the MTP head has {len(head.layers)} layers; draft.onnx exports a one-layer "
                             "head (the layout of the Qwen3.5 / Qwen3-Next checkpoints)")
        self.embed_tokens, self.lm_head, self.head, self.moe_impl = model.embed_tokens, model.lm_head, head, \
            onnxruntime_moe_form(model.embed_tokens.weight.dtype, "gather")

    def forward(self, input_ids: Tensor, hidden: Tensor, positions: Tensor, last: Tensor, key_cache: Tensor,
                value_cache: Tensor):
        for m in self.head.modules():
            if isinstance(m, SparseMoE):
                m.impl = self.moe_impl
        B, L = input_ids.shape
        emb = self.embed_tokens(input_ids)
        out, caches = self.head.forward_cached(emb, hidden.to(emb.dtype), positions, [(key_cache, value_cache)], 0)
        idx = last.to(torch.long).clamp(min=0, max=L - 1)
        sel = torch.gather(out, 1, idx[:, None, None].expand(B, 1, out.shape[-1]))[:, 0]
        logits = F.linear(sel, self.embed_tokens.weight) if self.lm_head is None else self.lm_head(sel)
        return logits, sel, caches[0][0], caches[0][1]


def speculative_module(model, graph: str, head=None) -> nn.Module:
    if graph == "verify":
        return HybridVerifyGraph(model, hidden=head is not None)
    if graph == "commit":
        return HybridCommitGraph()
    speculative_io(model, graph, head)      # draft without a head: the usual line
    return HybridDraftGraph(model, head)


def speculative_example_feed(model, graph: str, head=None, *, batch: int = 3, capacity: int = 8,
                             tokens: int = 3, seed: int = 0, zero_states: bool = False) -> dict[str, Tensor]:
    """Random inputs (graph order): ``tokens`` = L per row, positions with room for them below ``capacity``
    (draft: one padding entry at position S), accepted counts in [0, L]."""
    gen = torch.Generator().manual_seed(seed)
    V = model.hybrid_config.vocab_size
    L = max(1, tokens)
    sizes = {"B": batch, "D": L, "S": capacity}
    ins, _ = speculative_io(model, graph, head)
    dt = model.dtype
    feed: dict[str, Tensor] = {}
    for t in ins:
        name = t["name"]
        shape = [sizes[d] if isinstance(d, str) else d for d in t["shape"]]
        if name == "input_ids":
            feed[name] = torch.randint(0, V, shape, generator=gen)
        elif name == "positions" and graph == "verify":
            feed[name] = torch.randint(0, max(1, capacity - L + 1), shape, generator=gen)
        elif name == "positions":
            start = torch.randint(0, max(1, capacity - L + 1), (batch, 1), generator=gen)
            pos = start + torch.arange(L)[None, :]
            if L > 1:
                pos[0, -1] = capacity                            # a padding entry: no cache write
            feed[name] = pos
        elif name == "last":
            feed[name] = torch.randint(0, L, shape, generator=gen)
        elif name == "accepted":
            feed[name] = torch.randint(0, L + 1, shape, generator=gen).to(torch.int32)
        else:
            scale = 0.0 if zero_states and ("state" in name or "cache" in name) else (
                0.1 if name.startswith(("rec", "commit_delta")) else 0.5)
            x = torch.randn(shape, generator=gen) * scale
            if name.startswith("commit_g"):
                x = -x.abs()                                     # log-decays are <= 0
            if name.startswith(("conv", "hidden")) or t["dtype"] != "float32":
                x = x.to(dt)                                     # values the model dtype holds exactly
                if t["dtype"] == "float32":
                    x = x.float()
            feed[name] = x
    return feed
