"""The decode engine's default per-layer math on CUDA: :mod:`.engine_layers`' functions with more of the glue on
the Triton kernels of :mod:`..lm.triton_ops` (no ``torch.compile``).

The model's norms already run as one kernel each on CUDA (:class:`..lm.norms.RMSNorm`). Here, in addition: the
residual add and the following RMSNorm in one kernel, the GDN conv window read from and written back to the state
pool in one (so :meth:`.cuda_engine.StaticDecoder._gdn` gets ``conv_new=None`` and skips its index write), SwiGLU's
SiLU x up in one on the packed gate|up GEMM, RoPE of q and of k in one each; A_log / dt_bias converted to float32
once instead of every step. Whatever the kernels do not cover (float64 models, MoE routing, RoPE,
output gates, modules of other types) runs the :mod:`.engine_layers` code unchanged.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..lm import triton_ops as tk
from ..lm.mlp import SwiGLU
from ..lm.norms import RMSNorm
from . import engine_layers as el

__all__ = ["FastLayerFns", "fast_available"]


def fast_available(device) -> Optional[str]:
    """None when the Triton glue kernels can run on ``device``, else why not."""
    if device.type != "cuda":
        return "the Triton glue kernels are for CUDA devices"
    if tk.triton is None:
        return "triton not importable"
    if not tk.ENABLED:
        return "turned off (GDN_TRITON_GLUE=0)"
    return None


def _add_norm(mod, x: Tensor, residual: Tensor):
    """(mod(x + residual), x + residual), the add and an RMSNorm in one kernel where it can."""
    if isinstance(mod, RMSNorm) and mod.weight.dtype == x.dtype == residual.dtype and \
            tk.usable(x, residual, mod.weight):
        return tk.rms_norm(x, mod.weight, mod.variance_epsilon, mod.kind, residual=residual)
    h = residual + x
    return mod(h), h


def _mlp(mlp, x: Tensor, packs: dict) -> Tensor:
    packed = packs.get(id(mlp))
    if isinstance(mlp, SwiGLU) and packed is not None and tk.usable(x, packed):
        return mlp.down_proj(tk.silu_mul(F.linear(x, packed)))
    return el._mlp(mlp, x, packs)


def _finish(layer, h: Tensor, y: Tensor, packs: dict) -> Tensor:
    if layer.post_norm:
        h = h + layer.post_attention_layernorm(y)
        return h + layer.post_feedforward_layernorm(_mlp(layer.mlp, h, packs))
    x, h = _add_norm(layer.post_attention_layernorm, y, h)
    return h + _mlp(layer.mlp, x, packs)


def gdn_in(layer, h: Tensor, conv_pool: Tensor, slots: Tensor, packs: dict):
    """:func:`.engine_layers.gdn_in`; the conv window is updated in the pool here when the kernel runs (then
    the last item is None)."""
    g = layer.linear_attn
    x = layer._mixer_in(h)
    mixed, z, b, a = el._gdn_project(g, x, packs.get(id(g)))
    w = g.conv1d.weight[:, 0, :]
    if w.shape[-1] >= 2 and conv_pool.dtype == mixed.dtype and mixed.stride(-1) == 1 and \
            tk.usable(mixed, conv_pool, w):
        mixed, conv_new = tk.conv_step_(mixed, conv_pool, slots, w, g.conv1d.bias), None
    else:
        mixed, conv_new = g._step_conv(mixed, conv_pool.index_select(0, slots))
        conv_new = conv_new.to(conv_pool.dtype)
    q, k, v = g._split_qkv(mixed)
    if g.config.beta_scale == 1.0:               # raw a, b + float32 A_log, dt_bias: converted once, not per step
        A_log, dt_bias = _wide_cached(g.A_log), _wide_cached(g.dt_bias)
        return q.contiguous(), k.contiguous(), v.contiguous(), a, b, A_log, dt_bias, z, conv_new
    gt = g._gate_args(a, b)
    return (q.contiguous(), k.contiguous(), v.contiguous(), gt["g"], gt["beta"], gt["A_log"], gt["dt_bias"], z,
            conv_new)


_WIDE: dict = {}                                 # id(parameter) -> (weakref to it, (data_ptr, version), float32)


def _wide_cached(p: Tensor) -> Tensor:
    """``wide(p)`` of a parameter, kept while the parameter lives and its storage and version stay the same."""
    if p.dtype in (torch.float32, torch.float64):
        return p
    key, hit = (p.data_ptr(), p._version), _WIDE.get(id(p))
    if hit is not None and hit[0]() is p and hit[1] == key:
        return hit[2]
    w = p.detach().float()

    def drop(ref, k=id(p)):
        if _WIDE.get(k, (None,))[0] is ref:
            del _WIDE[k]
    _WIDE[id(p)] = (weakref.ref(p, drop), key, w)
    return w


def attn_in(layer, h: Tensor, pos: Tensor, inv_freq: Optional[Tensor], kv_dtype, packs: dict):
    """:func:`.engine_layers.attn_in` with RoPE (cos/sin and rotation of q and k) in one kernel each."""
    a = layer.self_attn
    x = layer._mixer_in(h)
    if inv_freq is None or not tk.usable(x, inv_freq):
        return el.attn_in(layer, h, pos, inv_freq, kv_dtype, packs)
    q, k, v, gate = el._qkv(a, x, None, None, packs.get(id(a)))
    fp32, f = a.config.rope_fp32, a.config.rope_factor
    q = tk.rope(q if q.stride(-1) == 1 else q.contiguous(), pos, inv_freq, f, fp32)
    k = tk.rope(k if k.stride(-1) == 1 else k.contiguous(), pos, inv_freq, f, fp32)
    return q, k.to(kv_dtype), v.to(kv_dtype), gate


def gdn_out(layer, h: Tensor, o: Tensor, z: Tensor, packs: dict) -> Tensor:
    return _finish(layer, h, layer.linear_attn._output(o, z), packs)


def attn_out(layer, h: Tensor, o: Tensor, gate: Optional[Tensor], packs: dict) -> Tensor:
    return _finish(layer, h, layer.self_attn._out(o.reshape(o.shape[0], -1), gate), packs)


class FastLayerFns:
    """The functions above under :class:`.engine_layers.LayerFns`' names."""
    fuse = False

    def __init__(self):
        self.gdn_in, self.gdn_out, self.attn_in, self.attn_out = gdn_in, gdn_out, attn_in, attn_out
        self.head, self.embed = el.head, el.embed
