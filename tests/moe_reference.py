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


def route_all_to(expert: int, second: int | None):
    """A ``prepare(moe)`` giving router weights that send every token with positive features to ``expert`` (and
    ``second``) and every other expert NaN weights (a form that computes or reads an unchosen expert into the
    output fails)."""
    def prepare(moe: SparseMoE) -> None:
        with torch.no_grad():
            moe.gate.weight.zero_()
            moe.gate.weight[expert] = 1.0
            if second is not None:
                moe.gate.weight[second] = 0.5
            unused = sorted(set(range(moe.config.num_experts)) - {expert, second})
            moe.experts.gate_up_proj[unused] = float("nan")
            moe.experts.down_proj[unused] = float("nan")
    return prepare


def export_layer(moe: SparseMoE, impl: str, path):
    """``moe`` exported alone with MoE form ``impl`` (input ``x`` [tokens, hidden], output ``y``) to ``path``;
    returns the ModelProto."""
    import onnx
    from torch.export import Dim

    from gdn_deploy.export.onnx_ops import export_program
    moe.impl = impl
    try:
        with torch.no_grad():
            export_program(moe, (torch.randn(11, moe.gate.weight.shape[1]),), str(path), input_names=["x"], output_names=["y"],
                           dynamic_shapes=({0: Dim("tokens", min=1, max=1 << 20)},))
    finally:
        moe.impl = "routed"
    return onnx.load(str(path))
