"""The exported graphs as torch modules with flat tensor I/O, their I/O plans and example feeds.

Graphs (``L`` = number of GDN layers, 1 for a block; ``X`` = ``input_ids [T]`` int64 for an LM,
``x [T, hidden]`` for a block; ``Y`` = ``logits [T, vocab]`` / ``y [T, hidden]``):

- ``prefill``:     X, cu_seqlens [N+1] int32, conv_state_i [N,conv_dim,W-1], rec_state_i [N,Hv,K,V]
                   -> Y, conv_state_out_i, rec_state_out_i          (i = 0..L-1, interleaved)
- ``decode``:      X with T -> B (one token per sequence), states [B, ...] -> Y [B, ...], states out
- ``decode_pool``: X [B], slots [B] int32 (-1 = skip), conv_pool_i [P,...], rec_pool_i [P,...]
                   -> Y, conv_pool_out_i, rec_pool_out_i (the pools with the used rows advanced)

States are float32 in every graph (the conv state holds model-dtype values, stored exactly in
fp32); weights and activations are fp32, fp16 or bf16. A whole hybrid LM (kind "hybrid") has its own
prefill / decode graphs and state convention: :mod:`.hybrid_graphs`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..errors import UsageError
from . import metadata as md
from .targets import DTYPE_NAMES, ExportTarget

__all__ = ["GRAPHS", "GraphPlan", "graph_plan", "example_feed"]

GRAPHS = ("prefill", "decode", "decode_pool", "verify", "commit", "draft")   # the last three: hybrid LMs only


class _Flat(nn.Module):
    def __init__(self, target: ExportTarget):
        super().__init__()
        self.net = target.module
        self.kind = target.kind
        self.num_layers = len(target.blocks)

    def _split(self, states: Sequence[Tensor]):
        return list(states[0::2]), list(states[1::2])

    @staticmethod
    def _join(convs, recs) -> list[Tensor]:
        out: list[Tensor] = []
        for c, r in zip(convs, recs):
            out += [c.float(), r.float()]
        return out


class PrefillGraph(_Flat):
    def forward(self, x: Tensor, cu_seqlens: Tensor, *states: Tensor):
        convs, recs = self._split(states)
        if self.kind == "lm":
            y, c, r = self.net.prefill(x, cu_seqlens, convs, recs)
        else:
            y, c, r = self.net.prefill(x, cu_seqlens, convs[0], recs[0])
            c, r = [c], [r]
        return (y, *self._join(c, r))


class DecodeGraph(_Flat):
    def forward(self, x: Tensor, *states: Tensor):
        convs, recs = self._split(states)
        if self.kind == "lm":
            y, c, r = self.net.decode(x, convs, recs)
        else:
            y, c, r = self.net.decode(x, convs[0], recs[0])
            c, r = [c], [r]
        return (y, *self._join(c, r))


class DecodePoolGraph(_Flat):
    def forward(self, x: Tensor, slots: Tensor, *pools: Tensor):
        convs, recs = self._split([p.clone() for p in pools])   # updated in place, returned as outputs
        if self.kind == "lm":
            y = self.net.decode_pool(x, convs, recs, slots)
        else:
            y = self.net.decode_pool(x, convs[0], recs[0], slots)
        return (y, *self._join(convs, recs))


# ---- graph plans: I/O names, symbolic shapes, dtypes -----------------------------------------------
@dataclass
class GraphPlan:
    name: str
    module: nn.Module
    inputs: list[dict[str, Any]]       # {"name", "shape", "dtype"}
    outputs: list[dict[str, Any]]
    fixed_inputs: int | None = None    # named forward() parameters before *states (None: all of them)

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    @property
    def input_names(self) -> list[str]:
        return [t["name"] for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t["name"] for t in self.outputs]


def graph_plan(target: ExportTarget, graph: str) -> GraphPlan:
    if graph not in GRAPHS:
        raise UsageError(f"unknown graph {graph!r}: expected some of {', '.join(GRAPHS)}")
    if target.kind == "hybrid":
        return _hybrid_plan(target, graph)
    if graph in ("verify", "commit", "draft"):
        raise UsageError(f"{graph}: the speculative graphs (verify, commit, draft) are exported for whole hybrid "
                         "language models (a Hugging Face folder); leave it out of --graphs")
    h = target.heads()
    act = DTYPE_NAMES[target.dtype]
    rows = {"prefill": "T", "decode": "B", "decode_pool": "B"}[graph]
    srows = {"prefill": "N", "decode": "B", "decode_pool": "P"}[graph]
    if target.kind == "lm":
        x = {"name": "input_ids", "shape": [rows], "dtype": "int64"}
        y = {"name": "logits", "shape": [rows, target.config.vocab_size], "dtype": act}
    else:
        x = {"name": "x", "shape": [rows, target.config.hidden_size], "dtype": act}
        y = {"name": "y", "shape": [rows, target.config.hidden_size], "dtype": act}
    stem = "pool" if graph == "decode_pool" else "state"
    ins, outs = [x], [y]
    if graph == "prefill":
        ins.append({"name": "cu_seqlens", "shape": ["N+1"], "dtype": "int32"})
    if graph == "decode_pool":
        ins.append({"name": "slots", "shape": ["B"], "dtype": "int32"})
    conv_shape = [srows, h["conv_dim"], h["conv_kernel_size"] - 1]
    rec_shape = [srows, h["num_v_heads"], h["head_k_dim"], h["head_v_dim"]]
    for i in range(len(target.blocks)):
        ins += [{"name": f"conv_{stem}_{i}", "shape": conv_shape, "dtype": "float32"},
                {"name": f"rec_{stem}_{i}", "shape": rec_shape, "dtype": "float32"}]
        outs += [{"name": f"conv_{stem}_out_{i}", "shape": conv_shape, "dtype": "float32"},
                 {"name": f"rec_{stem}_out_{i}", "shape": rec_shape, "dtype": "float32"}]
    cls = {"prefill": PrefillGraph, "decode": DecodeGraph, "decode_pool": DecodePoolGraph}[graph]
    return GraphPlan(graph, cls(target).eval(), ins, outs, fixed_inputs=2 if graph != "decode" else 1)


def _hybrid_plan(target: ExportTarget, graph: str) -> GraphPlan:
    from .hybrid_graphs import HybridDecodeGraph, HybridPrefillGraph, hybrid_io
    if graph == "decode_pool":
        raise UsageError("decode_pool: a whole hybrid model exports prefill and decode (its attention layers keep "
                         "KV caches, which the state pool does not cover); leave decode_pool out of --graphs")
    if graph in ("verify", "commit", "draft"):
        from .speculative_graphs import speculative_io, speculative_module
        ins, outs = speculative_io(target.module, graph, target.mtp_head)
        fixed = {"verify": 2, "commit": 1, "draft": None}[graph]
        return GraphPlan(graph, speculative_module(target.module, graph, target.mtp_head).eval(), ins, outs,
                         fixed_inputs=fixed)
    hidden = target.mtp_head is not None          # the MTP head reads prefill's normed hidden states
    ins, outs = hybrid_io(target.module, graph, all_logits=target.all_logits, hidden=hidden)
    if graph == "prefill":
        return GraphPlan(graph, HybridPrefillGraph(target.module, target.all_logits, hidden=hidden).eval(), ins,
                         outs, fixed_inputs=4)
    return GraphPlan(graph, HybridDecodeGraph(target.module).eval(), ins, outs, fixed_inputs=2)


def _random_cu_seqlens(tokens: int, seqs: int, gen: torch.Generator) -> Tensor:
    cuts = torch.sort(torch.randint(0, tokens + 1, (seqs - 1,), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32)


def example_feed(target: ExportTarget, graph: str, *, tokens: int = 11, seqs: int = 3, batch: int = 3,
                 pool: int = 5, seed: int = 0, zero_states: bool = False,
                 equal_lengths: bool = False) -> dict[str, Tensor]:
    """Random inputs of a graph (ordered as the graph's inputs). Sizes must be >= 2 when used for export.

    ``equal_lengths``: prefill sequences of equal length (``tokens`` rounded down to a multiple of
    ``seqs``), what the interop ``LinearAttention`` export supports."""
    if target.kind == "hybrid":
        from .hybrid_graphs import hybrid_example_feed
        graph_plan(target, graph)                 # refuses decode_pool with the usual line
        if graph in ("verify", "commit", "draft"):
            from .speculative_graphs import speculative_example_feed
            return speculative_example_feed(target.module, graph, target.mtp_head, batch=batch,
                                            tokens=max(2, min(tokens // 2, 16)), capacity=max(pool, 2) + tokens,
                                            seed=seed, zero_states=zero_states)
        return hybrid_example_feed(target.module, graph, tokens=tokens, seqs=seqs, batch=batch,
                                   capacity=max(pool, 2) + 3, seed=seed, zero_states=zero_states)
    if equal_lengths and graph == "prefill":
        tokens = max(seqs, tokens - tokens % seqs)
    plan = graph_plan(target, graph)
    gen = torch.Generator().manual_seed(seed)
    sizes = {"T": tokens, "N": seqs, "B": batch, "P": pool}
    feed: dict[str, Tensor] = {}
    for t in plan.inputs:
        shape = [md.eval_dim(d, sizes) for d in t["shape"]]
        name = t["name"]
        if name == "input_ids":
            feed[name] = torch.randint(0, target.config.vocab_size, shape, generator=gen)
        elif name == "cu_seqlens":
            feed[name] = (torch.arange(seqs + 1, dtype=torch.int32) * (tokens // seqs) if equal_lengths
                          else _random_cu_seqlens(tokens, seqs, gen))
        elif name == "slots":
            perm = torch.randperm(pool, generator=gen)[:batch].to(torch.int32)
            if batch > 1:
                perm[batch // 2] = -1                     # one skipped sequence
            feed[name] = perm
        elif name == "x":
            feed[name] = torch.randn(shape, generator=gen).to(target.dtype)
        else:
            scale = 0.0 if zero_states else (0.5 if name.startswith("conv") else 0.1)
            feed[name] = torch.randn(shape, generator=gen) * scale
            if name.startswith("conv"):   # values the model dtype can hold exactly
                feed[name] = feed[name].to(target.dtype).float()
    return feed
