"""The routed experts of an MoE layer as one torch op, ``gdn_export::moe`` (one ONNX node when exported).

``moe(x [R, hidden], logits [R, E], gate_up_proj [E, 2I, hidden], down_proj [E, hidden, I], top_k, normalize)
-> [R, hidden]``: router softmax over the E logits in float32, the top-k experts of each row (their probabilities
renormalised to sum 1 when ``normalize``, then cast to the model dtype), and ``sum_k w_k * down_k(silu(gate_k(x)) *
up_k(x))`` with gate rows ``0..I-1`` and up rows ``I..2I-1`` of ``gate_up_proj`` (HF transformers 5 layout). Each
expert runs only on the rows routed to it. The shared expert is not part of it.

The ONNX translation (:mod:`gdn_deploy.export.onnx_moe`) emits onnxruntime's ``com.microsoft::MoE`` for the
onnxruntime graphs; the TensorRT copies replace it by standard ops. The eager implementation below is the
reference both are tested against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .norms import wide

__all__ = ["moe", "moe_route", "moe_ref", "routed_experts"]


def moe_route(logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """logits [R, E] -> (expert ids [R, k] int64, weights [R, k] in the logits' dtype), as HF routes."""
    probs = torch.softmax(wide(logits), dim=-1)
    w, idx = torch.topk(probs, top_k, dim=-1)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return idx, w.to(logits.dtype)


def moe_ref(x: Tensor, logits: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k: int,
            normalize: bool) -> Tensor:
    """The eager math of :func:`moe` (see the module docstring)."""
    idx, w = moe_route(logits, top_k, normalize)
    return routed_experts(x, idx, w, gate_up_proj, down_proj)


def routed_experts(x: Tensor, idx: Tensor, w: Tensor, gate_up_proj: Tensor, down_proj: Tensor) -> Tensor:
    """``sum_k w[:, k] * SwiGLU_{idx[:, k]}(x)``, each expert run only on the rows routed to it."""
    out = torch.zeros_like(x)
    for e in torch.unique(idx).tolist():           # only the experts some row chose
        tok, slot = torch.where(idx == e)
        g, u = F.linear(x[tok], gate_up_proj[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down_proj[e]) * w[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


@torch.library.custom_op("gdn_export::moe", mutates_args=())
def moe(x: Tensor, logits: Tensor, gate_up_proj: Tensor, down_proj: Tensor, top_k: int, normalize: bool) -> Tensor:
    """See the module docstring (one ONNX node when exported)."""
    return moe_ref(x, logits, gate_up_proj, down_proj, top_k, normalize).contiguous()


@moe.register_fake
def _(x, logits, gate_up_proj, down_proj, top_k, normalize):
    return x.new_empty(x.shape)
