"""The decode engine's default per-layer math on CUDA: :mod:`.engine_layers`' functions with more of the glue on
the Triton kernels of :mod:`..lm.triton_ops` (no ``torch.compile``).

The model's norms already run as one kernel each on CUDA (:class:`..lm.norms.RMSNorm`). Here, in addition: the
residual add and the following RMSNorm in one kernel, the GDN conv window read from and written back to the state
pool in one (so :meth:`.cuda_engine.StaticDecoder._gdn` gets ``conv_new=None`` and skips its index write), SwiGLU's
SiLU x up in one on the packed gate|up GEMM, RoPE of q and of k in one each; A_log / dt_bias converted to float32
once instead of every step. Whatever the kernels do not cover (float64 models, MoE routing, RoPE,
output gates, modules of other types) runs the :mod:`.engine_layers` code unchanged.

Projections (packed GDN / attention inputs, SwiGLU gate|up and down with the residual add, GDN and attention output
projections, the lm_head) of a batch of one run on the small-M GEMV kernel (``gdn::gemv``,
:mod:`..kernels.gemv`), which reads the weights at copy bandwidth where cuBLAS's small-M GEMMs do not; on by
default where the kernel library has it, ``GDN_GEMV=0`` (read when the engine is built) keeps cuBLAS.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import gemv as gv
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


# Rows up to which the engine's projections take the GEMV kernel: measured on an H200 (benchmarks/bench_gemv.py,
# docs/performance.md "Small-M GEMV") it matches or beats cuBLAS at one row on every mid-model shape and loses at 8.
GEMV_MAX_ROWS = 1


def gemv_linear(x: Tensor, w: Tensor, residual: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, w) (+ residual)``, on the small-M GEMV kernel (:func:`..kernels.gemv.gemv`) for at most
    ``GEMV_MAX_ROWS`` rows."""
    if x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and x.shape[-1] > 0:
        return torch.ops.gdn.gemv(x, w, residual)
    y = F.linear(x, w)
    return y if residual is None else y + residual


def _plain_weight(mod) -> Optional[Tensor]:
    """The weight of a bias-free nn.Linear (the modules :func:`gemv_linear` may replace), else None."""
    return mod.weight if isinstance(mod, torch.nn.Linear) and mod.bias is None else None


def _mlp(mlp, x: Tensor, packs: dict, lin=None, residual: Optional[Tensor] = None) -> Tensor:
    """The layer's MLP (+ ``residual``, added inside the down projection when ``lin`` is the GEMV)."""
    packed = packs.get(id(mlp))
    if isinstance(mlp, SwiGLU) and packed is not None and tk.usable(x, packed):
        if lin is not None and _plain_weight(mlp.down_proj) is not None:
            return lin(tk.silu_mul(lin(x, packed)), mlp.down_proj.weight, residual)
        y = mlp.down_proj(tk.silu_mul(F.linear(x, packed)))
    else:
        y = el._mlp(mlp, x, packs)
    return y if residual is None else residual + y


def _out_proj(mod, o: Tensor, lin) -> Tensor:
    w = _plain_weight(mod) if lin is not None else None
    return mod(o) if w is None else lin(o, w)


def _finish(layer, h: Tensor, y: Tensor, packs: dict, lin=None) -> Tensor:
    if layer.post_norm:
        h = h + layer.post_attention_layernorm(y)
        return h + layer.post_feedforward_layernorm(_mlp(layer.mlp, h, packs, lin))
    x, h = _add_norm(layer.post_attention_layernorm, y, h)
    return _mlp(layer.mlp, x, packs, lin, residual=h)


def gdn_in(layer, h: Tensor, conv_pool: Tensor, slots: Tensor, packs: dict, lin=None):
    """:func:`.engine_layers.gdn_in`; the conv window is updated in the pool here when the kernel runs (then
    the last item is None)."""
    g = layer.linear_attn
    x = layer._mixer_in(h)
    mixed, z, b, a = el._gdn_project(g, x, packs.get(id(g)), lin or F.linear)
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


def attn_in(layer, h: Tensor, pos: Tensor, inv_freq: Optional[Tensor], kv_dtype, packs: dict, lin=None):
    """:func:`.engine_layers.attn_in` with RoPE (cos/sin and rotation of q and k) in one kernel each."""
    a = layer.self_attn
    x = layer._mixer_in(h)
    if inv_freq is None or not tk.usable(x, inv_freq):
        return el.attn_in(layer, h, pos, inv_freq, kv_dtype, packs)
    q, k, v, gate = el._qkv(a, x, None, None, packs.get(id(a)), lin or F.linear)
    fp32, f = a.config.rope_fp32, a.config.rope_factor
    q = tk.rope(q if q.stride(-1) == 1 else q.contiguous(), pos, inv_freq, f, fp32)
    k = tk.rope(k if k.stride(-1) == 1 else k.contiguous(), pos, inv_freq, f, fp32)
    return q, k.to(kv_dtype), v.to(kv_dtype), gate


def gdn_out(layer, h: Tensor, o: Tensor, z: Tensor, packs: dict, lin=None) -> Tensor:
    g = layer.linear_attn
    if lin is None:
        return _finish(layer, h, g._output(o, z), packs)
    o = g.output_norm(o, z)
    return _finish(layer, h, _out_proj(g.output_proj, o.reshape(o.shape[0], g.value_dim), lin), packs, lin)


def attn_out(layer, h: Tensor, o: Tensor, gate: Optional[Tensor], packs: dict, lin=None) -> Tensor:
    a, o = layer.self_attn, o.reshape(o.shape[0], -1)
    if lin is None:
        return _finish(layer, h, a._out(o, gate), packs)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return _finish(layer, h, _out_proj(a.o_proj, o, lin), packs, lin)


def head(model, h: Tensor, lin=None) -> Tensor:
    """The final norm and the lm_head (the tied embedding when there is none)."""
    if lin is None:
        return el.head(model, h)
    h = model.norm(h)
    return lin(h, model.embed_tokens.weight) if model.lm_head is None else _out_proj(model.lm_head, h, lin)


class FastLayerFns:
    """The functions above under :class:`.engine_layers.LayerFns`' names; ``gemv`` (default: on where the kernel
    library has it and ``GDN_GEMV`` is not 0) routes the projections through :func:`gemv_linear`."""
    fuse = False

    def __init__(self, gemv: Optional[bool] = None):
        self.gemv = gv.unavailable_reason() is None if gemv is None else bool(gemv)
        lin = gemv_linear if self.gemv else None
        self.gdn_in = lambda *a, **k: gdn_in(*a, lin=lin, **k)
        self.gdn_out = lambda *a, **k: gdn_out(*a, lin=lin, **k)
        self.attn_in = lambda *a, **k: attn_in(*a, lin=lin, **k)
        self.attn_out = lambda *a, **k: attn_out(*a, lin=lin, **k)
        self.head = lambda model, h: head(model, h, lin)
        self.embed = el.embed
