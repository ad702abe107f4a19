"""What gets exported: an :class:`ExportTarget` (a GDNLM, a whole hybrid LM or one GDNBlock, and where it came from),
cast to a precision."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..errors import LoadError, UsageError
from ..lm.model import HybridLM
from ..model import GDNBlock, GDNLM

__all__ = ["PRECISIONS", "DTYPE_NAMES", "ExportTarget", "target_from_module", "cast_target"]

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.int32: "int32", torch.int64: "int64"}


@dataclass
class ExportTarget:
    """What gets exported: a GDNLM (kind "lm"), a whole hybrid causal LM (kind "hybrid", a
    :class:`~gdn_deploy.lm.HybridLM`: :mod:`.hybrid_graphs`) or one GDNBlock (kind "block"), and where it came
    from. ``all_logits``: the hybrid prefill graph returns every token's logits instead of each sequence's last.
    ``mtp_head``: a hybrid model's MTP head (:mod:`gdn_deploy.lm.mtp`) when the speculative graphs are exported
    with it (draft.onnx; prefill and verify then also return the final-normed hidden states)."""
    module: nn.Module
    kind: str
    source: dict[str, Any] = field(default_factory=dict)
    all_logits: bool = False
    mtp_head: Optional[nn.Module] = None

    @property
    def config(self):
        """GDNConfig ("lm", "block") or HybridConfig ("hybrid")."""
        return self.module.config

    @property
    def blocks(self) -> list[GDNBlock]:
        if self.kind == "hybrid":
            return [l.linear_attn for l in self.module.layers if l.layer_type == "linear_attention"]
        return [l.linear_attn for l in self.module.layers] if self.kind == "lm" else [self.module]

    @property
    def dtype(self) -> torch.dtype:
        if self.kind == "hybrid":
            return self.module.dtype
        return self.blocks[0].output_proj.weight.dtype

    def heads(self) -> dict[str, int]:
        if not self.blocks:
            return {}
        b = self.blocks[0]
        return {"num_k_heads": b.num_k_heads, "num_v_heads": b.num_v_heads, "head_k_dim": b.head_k_dim,
                "head_v_dim": b.head_v_dim, "conv_dim": b.conv_dim, "conv_kernel_size": b.conv_kernel_size,
                "gva_ratio": b.num_v_heads // b.num_k_heads}


def target_from_module(module: nn.Module, source: dict[str, Any] | None = None) -> ExportTarget:
    if isinstance(module, GDNLM):
        return ExportTarget(module.eval(), "lm", dict(source or {}))
    if isinstance(module, HybridLM):
        return ExportTarget(module.eval(), "hybrid", dict(source or {}))
    if isinstance(module, GDNBlock):
        return ExportTarget(module.eval(), "block", dict(source or {}))
    raise LoadError(f"cannot export a {type(module).__name__}: expected a GDNLM, a HybridLM or a GDNBlock")


def cast_target(target: ExportTarget, precision: str) -> ExportTarget:
    """A copy of the target with weights in ``precision`` (A_log/dt_bias are cast back to fp32 in the op call)."""
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    module = copy.deepcopy(target.module).to(PRECISIONS[precision]).eval()
    head = None if target.mtp_head is None else copy.deepcopy(target.mtp_head).to(PRECISIONS[precision]).eval()
    return ExportTarget(module, target.kind, {**target.source, "precision": precision}, target.all_logits, head)


