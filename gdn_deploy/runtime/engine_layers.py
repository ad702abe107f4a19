"""The decode engine's per-layer math, split at the in-place pool updates into pure functions that
``torch.compile`` may fuse.

A decode step of one layer is ``*_in`` (norm, projections, GDN conv window / RoPE: reads the pools, writes nothing)
-> the in-place pool updates and the mixer kernel (done by :class:`.cuda_engine.StaticDecoder`, never compiled)
-> ``*_out`` (output norm / gate, output projection, residuals, post norms, MLP). Every function here only reads
its inputs and returns new tensors, so Inductor can fuse its elementwise chains and norms into a few kernels
without touching the pools (no mutation to functionalise, no pool copy). :class:`LayerFns` holds them plain or
compiled (``dynamic=True``: one compile for batch 1 and one for every other bucket; parameters are graph inputs,
so layers of one shape share the compiled code).

Projections that read the same input run as one GEMM on a packed weight: :func:`pack_linears` concatenates the
weights once and rebinds each ``nn.Linear``'s weight to its rows of the packed tensor (views: no copy kept, the
modules and the model's other paths see the same values).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..lm.attention import apply_rope, rope_cos_sin
from ..lm.mlp import SparseMoE, SwiGLU

__all__ = ["LayerFns", "pack_linears", "pack_model", "compile_available"]


def compile_available(device: torch.device) -> Optional[str]:
    """None when torch.compile can fuse on ``device`` (CUDA with triton), else why not."""
    if device.type != "cuda":
        return "fusion is for CUDA devices"
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"triton not importable ({type(e).__name__})"
    return None


def pack_linears(mods: Sequence[nn.Linear]) -> Optional[Tensor]:
    """One [sum(out), in] weight for bias-free linears of one input size, dtype and device (each module's weight
    becomes a view of its rows), or None when they cannot share one GEMM."""
    ws = [m.weight for m in mods]
    if len(mods) < 2 or any(m.bias is not None for m in mods) or len({(w.shape[1], w.dtype, w.device) for w in ws}) != 1:
        return None
    packed = torch.cat([w.detach() for w in ws], dim=0)
    lo = 0
    for m, w in zip(mods, ws):
        m.weight.data = packed[lo:lo + w.shape[0]]
        lo += w.shape[0]
    return packed


_GDN_PROJ = {"qwen3_next": ("in_proj_qkvz", "in_proj_ba"), "olmo_hybrid": ("q_proj", "k_proj", "v_proj", "g_proj",
                                                                          "b_proj", "a_proj"),
             "default": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}


def _gdn_names(g) -> tuple:
    return _GDN_PROJ.get(g.config.projection_layout, _GDN_PROJ["default"])


def pack_model(model) -> dict:
    """Packed weights per module id: every GDN block's input projections, attention q/k/v, SwiGLU gate/up
    (shared experts included)."""
    packs = {}
    for layer in model.layers:
        if layer.layer_type == "linear_attention":
            g = layer.linear_attn
            w = pack_linears([getattr(g, n) for n in _gdn_names(g)])
        else:
            a = layer.self_attn
            w = pack_linears([a.q_proj, a.k_proj, a.v_proj])
            mod = a
        if w is not None:
            packs[id(g if layer.layer_type == "linear_attention" else mod)] = w
        mlps = [layer.mlp] if isinstance(layer.mlp, SwiGLU) else \
            [layer.mlp.shared_expert] if isinstance(layer.mlp, SparseMoE) and isinstance(
                getattr(layer.mlp, "shared_expert", None), SwiGLU) else []
        for m in mlps:
            w = pack_linears([m.gate_proj, m.up_proj])
            if w is not None:
                packs[id(m)] = w
    return packs


def _linears(x: Tensor, mods, packed: Optional[Tensor], linear=F.linear) -> list[Tensor]:
    if packed is None:
        return [m(x) for m in mods]
    return list(torch.split(linear(x, packed), [m.weight.shape[0] for m in mods], dim=-1))


def _swiglu(m: SwiGLU, x: Tensor, packed: Optional[Tensor]) -> Tensor:
    gate, up = _linears(x, [m.gate_proj, m.up_proj], packed)
    return m.down_proj(F.silu(gate) * up)


def _mlp(mlp, x: Tensor, packs: dict) -> Tensor:
    """The layer's MLP; MoE layers in the capture-safe "gather" form (each token reads its k experts)."""
    if isinstance(mlp, SparseMoE):
        idx, w = mlp.route(x)
        se = mlp.shared_expert
        shared = _swiglu(se, x, packs.get(id(se))) if isinstance(se, SwiGLU) else se(x)
        return mlp.experts.gather(x, idx, w) + torch.sigmoid(mlp.shared_expert_gate(x)) * shared
    if isinstance(mlp, SwiGLU):
        return _swiglu(mlp, x, packs.get(id(mlp)))
    return mlp(x)


def _finish(layer, h: Tensor, y: Tensor, packs: dict) -> Tensor:
    """DecoderLayer._finish with :func:`_mlp`."""
    if layer.post_norm:
        h = h + layer.post_attention_layernorm(y)
        return h + layer.post_feedforward_layernorm(_mlp(layer.mlp, h, packs))
    h = h + y
    return h + _mlp(layer.mlp, layer.post_attention_layernorm(h), packs)


def _gdn_project(g, x: Tensor, packed: Optional[Tensor], linear=F.linear):
    """GDNBlock._project through the packed weight (``linear(x, w)`` computes it): mixed [R, conv_dim], z [R, Hv, V],
    b, a [R, Hv]."""
    if packed is None:
        return g._project(x)
    R, Hk, Hv, K, V = x.shape[0], g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim
    outs = _linears(x, [getattr(g, n) for n in _gdn_names(g)], packed, linear)
    layout = g.config.projection_layout
    if layout == "qwen3_next":
        rep = Hv // Hk
        q, k, v, z = torch.split(outs[0].reshape(R, Hk, 2 * K + 2 * rep * V), [K, K, rep * V, rep * V], dim=2)
        b, a = torch.split(outs[1].reshape(R, Hk, 2 * rep), [rep, rep], dim=2)
        mixed = torch.cat([q.reshape(R, Hk * K), k.reshape(R, Hk * K), v.reshape(R, Hv * V)], dim=1)
        return mixed, z.reshape(R, Hv, V), b.reshape(R, Hv), a.reshape(R, Hv)
    if layout == "olmo_hybrid":
        return torch.cat(outs[:3], dim=1), outs[3].reshape(R, Hv, V), outs[4], outs[5]
    return outs[0], outs[1].reshape(R, Hv, V), outs[2], outs[3]


def gdn_in(layer, h: Tensor, conv_pool: Tensor, slots: Tensor, packs: dict):
    """Norm, projections, conv window of a GDN layer -> (q, k, v, g, beta, A_log, dt_bias, z, new conv state
    [B, C, W-1]) (A_log, dt_bias: float32, or None when g and beta are formed here: GDNBlock._gate_args)."""
    g = layer.linear_attn
    x = layer._mixer_in(h)
    mixed, z, b, a = _gdn_project(g, x, packs.get(id(g)))
    mixed, conv_new = g._step_conv(mixed, conv_pool.index_select(0, slots))
    q, k, v = g._split_qkv(mixed)
    gt = g._gate_args(a, b)
    return (q.contiguous(), k.contiguous(), v.contiguous(), gt["g"], gt["beta"], gt["A_log"], gt["dt_bias"], z,
            conv_new.to(conv_pool.dtype))


def gdn_out(layer, h: Tensor, o: Tensor, z: Tensor, packs: dict) -> Tensor:
    return _finish(layer, h, layer.linear_attn._output(o, z), packs)


def _qkv(attn, x: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], packed: Optional[Tensor], linear=F.linear):
    """Attention._qkv with RoPE cos/sin given (from device-resident frequencies) and q/k/v from one GEMM
    (``linear(x, w)``)."""
    c, R, H, Hkv, D = attn.config, x.shape[0], attn.num_heads, attn.num_kv_heads, attn.head_dim
    qo, k, v = _linears(x, [attn.q_proj, attn.k_proj, attn.v_proj], packed, linear)
    gate = None
    if c.output_gate:
        qg = qo.reshape(R, H, 2 * D)
        q, gate = qg[..., :D], qg[..., D:].reshape(R, H * D)
    else:
        q = qo
    if c.qk_norm == "proj":
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.reshape(R, H, D), k.reshape(R, Hkv, D)
    if c.qk_norm == "head":
        q, k = attn.q_norm(q), attn.k_norm(k)
    v = v.reshape(R, Hkv, D)
    if cos is not None:
        q, k = apply_rope(q, cos, sin, c.rope_fp32), apply_rope(k, cos, sin, c.rope_fp32)
    return q, k, v, gate


def attn_in(layer, h: Tensor, pos: Tensor, inv_freq: Optional[Tensor], kv_dtype: torch.dtype, packs: dict):
    """Norm, q/k/v (+ norms, RoPE) of an attention layer -> (q [B, H, D], k, v [B, Hkv, D] in the pool dtype,
    output gate or None)."""
    a = layer.self_attn
    x = layer._mixer_in(h)
    cos = sin = None
    if inv_freq is not None:
        cos, sin = rope_cos_sin(pos, inv_freq, a.config.rope_factor)
    q, k, v, gate = _qkv(a, x, cos, sin, packs.get(id(a)))
    return q.contiguous(), k.to(kv_dtype), v.to(kv_dtype), gate


def attn_out(layer, h: Tensor, o: Tensor, gate: Optional[Tensor], packs: dict) -> Tensor:
    return _finish(layer, h, layer.self_attn._out(o.reshape(o.shape[0], -1), gate), packs)


def head(model, h: Tensor) -> Tensor:
    return model._logits(h)


def embed(model, ids: Tensor) -> Tensor:
    return model.embed_tokens(ids)


class LayerFns:
    """The functions above, plain or through ``torch.compile`` (``fuse``)."""

    def __init__(self, fuse: bool, backend: str = "inductor"):
        self.fuse = fuse
        fns = dict(gdn_in=gdn_in, gdn_out=gdn_out, attn_in=attn_in, attn_out=attn_out, head=head, embed=embed)
        if fuse:
            import torch._dynamo
            cfg = torch._dynamo.config               # one entry per layer shape and batch kind: room for big models
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(cfg, name):
                    setattr(cfg, name, max(getattr(cfg, name), 64))
            fns = {k: torch.compile(f, dynamic=True, backend=backend) for k, f in fns.items()}
        for k, f in fns.items():
            setattr(self, k, f)

