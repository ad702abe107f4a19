"""RMS norms of the supported families (each computes in float32 and returns the input dtype).

``kind`` says how the weight applies, which matters in half precision (in float32 all agree with the math):

- ``"scale"``:         ``weight * (x / rms(x)).to(dtype)``           (GDNLM, HF Qwen3-Next/Qwen3.5 gated norm)
- ``"scale_fp32"``:    ``(weight * x / rms(x)).to(dtype)``           (HF OLMo-Hybrid ``OlmoHybridRMSNorm``)
- ``"zero_centered"``: ``(x / rms(x) * (1 + weight)).to(dtype)``     (HF Qwen3-Next/Qwen3.5 ``*RMSNorm``, weight
  stored as an offset from 1, initialised to 0)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import triton_ops

__all__ = ["RMSNorm", "GatedRMSNorm", "NORM_KINDS", "wide"]

NORM_KINDS = ("scale", "scale_fp32", "zero_centered")


def wide(x: Tensor) -> Tensor:
    """``x`` in the accumulation dtype: float32, or float64 for a float64 reference run of the model."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension; see the module docstring for ``kind``."""

    def __init__(self, dim: int, eps: float = 1e-6, kind: str = "scale"):
        super().__init__()
        if kind not in NORM_KINDS:
            raise ValueError(f"RMSNorm kind: expected one of {NORM_KINDS}, got {kind!r}")
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(dim) if kind == "zero_centered" else torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        dt = x.dtype
        if self.weight.dtype == dt and triton_ops.usable(x, self.weight):      # one kernel on CUDA, same math
            return triton_ops.rms_norm(x, self.weight, self.variance_epsilon, self.kind)
        h = wide(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.kind == "zero_centered":
            return (h * (1.0 + wide(self.weight))).to(dt)
        if self.kind == "scale_fp32":
            return (self.weight * h).to(dt)
        return self.weight * h.to(dt)


class GatedRMSNorm(nn.Module):
    """Exactly ``Qwen3NextRMSNormGated`` / ``Qwen3_5RMSNormGated`` / ``OlmoHybridRMSNormGated``:
    norm(x) * weight * silu(gate)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dt = x.dtype
        if self.weight.dtype == dt and gate.shape == x.shape and triton_ops.usable(x, gate, self.weight):
            return triton_ops.rms_norm(x, self.weight, self.variance_epsilon, "scale", gate=gate)
        h = wide(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight * h.to(dt)
        h = h * F.silu(wide(gate))
        return h.to(dt)
