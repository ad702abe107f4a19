"""Float64 references shared by the MoE export tests: the routed layer in float64 and the rows whose routing float32
rounding cannot change."""
from __future__ import annotations

import copy

import torch

from gdn_deploy.lm.mlp import SparseMoE


def float64_routed(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """``moe`` applied to ``x`` in float64 with routed compute."""
    m = copy.deepcopy(moe).double()
    m.impl = "routed"
    with torch.no_grad():
        return m(x.double())


def clear_routing(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Rows of x whose k-th and (k+1)-th router probabilities differ by >= 1e-4 relative (float32 rounding cannot
    swap which experts they pick); every row when k is the expert count."""
    with torch.no_grad():
        p = torch.softmax(x.double() @ moe.gate.weight.double().t(), -1)
    k = moe.config.top_k
    if k == moe.config.num_experts:
        return x
    top = torch.topk(p, k + 1, dim=-1).values
    return x[(top[:, k - 1] - top[:, k]) >= 1e-4 * top[:, k - 1]]
