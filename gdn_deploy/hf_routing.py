"""Run Hugging Face ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet`` modules on the gdn ops.

The HF layers compute projections, the causal conv and the gates themselves and call a
gated-delta-rule function for the recurrence: ``torch_chunk_gated_delta_rule`` (prefill)
and ``torch_recurrent_gated_delta_rule`` (one token), module-level functions of the
modeling file in transformers >= 5 (FLA kernels or torch fallbacks behind them), or the
instance attributes ``self.chunk_gated_delta_rule`` / ``self.recurrent_gated_delta_rule``
in transformers 4.x. :func:`route_to_gdn_ops` swaps those for adapters that call
``torch.ops.gdn.prefill`` / ``torch.ops.gdn.decode`` (gate_mode 0: HF passes the finished
g and beta; use_qk_l2norm 1; scale 1/sqrt(K)), so the exported graph holds one
``gdn::GatedDeltaPrefill`` / ``GatedDeltaDecode`` node per layer instead of the unrolled
chunk loop. On a GPU the routed calls run our CUDA kernels: a whole HF model generates on them
inside ``with route_to_gdn_ops(layer)`` for each of its GatedDeltaNet layers.
``samples/export_hf_layer.py`` exports such a layer to ONNX as it is.

The wrappers give the layer flat tensor I/O (HF keeps the states in a Cache object):

- prefill: ``hidden_states [B,T,hidden], conv_state [B,conv_dim,kernel-1], rec_state [B,Hv,K,V]``
  -> ``out [B,T,hidden], conv_state_out, rec_state_out``  (T >= 2; B equal-length sequences)
- decode:  the same with ``hidden_states [B,1,hidden]``.

The conv state is in this project's layout (the last ``kernel-1`` inputs of the conv); HF
keeps ``kernel`` columns whose oldest one never reaches an output, so the wrapper pads a
zero column on the way in and drops it on the way out (exact).
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from . import ops  # noqa: F401  (registers torch.ops.gdn.*)

__all__ = ["route_to_gdn_ops", "HFGDNPrefill", "HFGDNDecode", "hf_state_shapes", "hf_example_inputs",
           "is_hf_gdn_module", "HF_GDN_CLASS_NAMES"]

HF_GDN_CLASS_NAMES = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")
_CHUNK_NAMES = ("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule")
_RECURRENT_NAMES = ("torch_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                    "recurrent_gated_delta_rule")
_CONV_NAMES = ("causal_conv1d_fn", "causal_conv1d_update")


def is_hf_gdn_module(module: Any) -> bool:
    return type(module).__name__ in HF_GDN_CLASS_NAMES


def _pack(x: Tensor) -> Tensor:
    """[B, T, H, D] -> [B*T, H, D] (or [B, T, H] -> [B*T, H])."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _one_gate_dtype(g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """g and beta in one dtype (the contract's gate type G), the wider of the two.

    HF computes g in float32 (from ``A_log.float()``) and beta = sigmoid(b) in the model dtype
    (bf16 for real checkpoints); widening beta to float32 is exact."""
    if g.dtype == beta.dtype:
        return g, beta
    wide = torch.promote_types(g.dtype, beta.dtype)
    return g.to(wide), beta.to(wide)


def _chunk_adapter(query, key, value, g, beta, chunk_size: int = 64, initial_state=None,
                   output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                   cu_seqlens=None, **_: Any):
    """Drop-in for HF's chunked gated delta rule, backed by ``torch.ops.gdn.prefill``."""
    B, T, Hv, V = value.shape
    K = key.shape[-1]
    if cu_seqlens is None:
        cu = torch.arange(B + 1, dtype=torch.int32, device=query.device) * T
        n = B
    else:  # HF varlen packing: batch 1, sequences given by offsets
        cu = cu_seqlens.to(torch.int32)
        n = cu.shape[0] - 1
    if initial_state is None:
        initial_state = torch.zeros(n, Hv, K, V, dtype=torch.float32, device=query.device)
    g, beta = _one_gate_dtype(g, beta)
    o, state = torch.ops.gdn.prefill(_pack(query), _pack(key), _pack(value), _pack(g), _pack(beta), cu,
                                     initial_state.to(torch.float32), None, None, gate_mode=0,
                                     use_qk_l2norm=int(bool(use_qk_l2norm_in_kernel)), scale=0.0,
                                     l2norm_eps=1e-6)
    return o.reshape(B, T, Hv, V).to(query.dtype), (state if output_final_state else None)


def _recurrent_adapter(query, key, value, g, beta, initial_state=None, output_final_state: bool = False,
                       use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, **kw: Any):
    """Drop-in for HF's token-by-token gated delta rule, backed by ``torch.ops.gdn.decode``."""
    B, T, Hv, V = value.shape
    if T != 1 or cu_seqlens is not None or initial_state is None:
        return _chunk_adapter(query, key, value, g, beta, initial_state=initial_state,
                              output_final_state=output_final_state,
                              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens)
    g, beta = _one_gate_dtype(g, beta)
    o, state = torch.ops.gdn.decode(query[:, 0], key[:, 0], value[:, 0], g[:, 0], beta[:, 0],
                                    initial_state.to(torch.float32), None, None, gate_mode=0,
                                    use_qk_l2norm=int(bool(use_qk_l2norm_in_kernel)), scale=0.0,
                                    l2norm_eps=1e-6)
    return o[:, None].to(query.dtype), (state if output_final_state else None)


@contextlib.contextmanager
def route_to_gdn_ops(module: nn.Module) -> Iterator[None]:
    """Within the block, ``module`` (an HF GatedDeltaNet) runs its recurrence through the gdn ops.

    Patches the modeling module's gated-delta functions (transformers >= 5) and the
    instance attributes (transformers 4.x), and routes the causal-conv helpers to their
    plain-torch fallbacks (the hub/FLA kernels are CUDA-only and not exportable).
    The patch is process-wide while active (module globals); it is undone on exit.
    """
    mod = sys.modules[type(module).__module__]
    saved_globals: dict[str, Any] = {}
    saved_attrs: dict[str, Any] = {}
    routes = {**{n: _chunk_adapter for n in _CHUNK_NAMES}, **{n: _recurrent_adapter for n in _RECURRENT_NAMES}}
    for name in _CONV_NAMES:  # the decorator keeps the torch fallback as __wrapped__
        fn = getattr(mod, name, None)
        if fn is not None:
            routes[name] = getattr(fn, "__wrapped__", fn)
    found = False
    for name, fn in routes.items():
        if hasattr(mod, name):
            saved_globals[name] = getattr(mod, name)
            setattr(mod, name, fn)
            found = found or name not in _CONV_NAMES
        if name in module.__dict__ or (name not in _CONV_NAMES and hasattr(module, name)):
            saved_attrs[name] = module.__dict__.get(name, None)
            module.__dict__[name] = fn
            found = found or name not in _CONV_NAMES
    try:
        if not found:
            raise TypeError(f"{type(module).__name__}: no gated-delta-rule function to route "
                            f"(looked for {', '.join(_CHUNK_NAMES + _RECURRENT_NAMES)})")
        yield
    finally:
        for name, fn in saved_globals.items():
            setattr(mod, name, fn)
        for name, fn in saved_attrs.items():
            if fn is None:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = fn


class _LayerStateCache:
    """The part of the HF hybrid cache one GatedDeltaNet layer uses, holding given tensors.

    States come in and go out in this project's conv layout ([B, conv_dim, kernel-1]).
    """

    def __init__(self, conv_state: Tensor, rec_state: Tensor, kernel: int):
        pad = torch.zeros_like(conv_state[..., :1])
        self.conv = torch.cat([pad, conv_state], dim=-1)      # HF layout, a fresh tensor (mutated by HF)
        self.rec = rec_state
        self.kernel = kernel

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> Tensor:
        return self.conv

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> Tensor:
        return self.rec

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def update_conv_state(self, conv_states: Tensor, layer_idx: int, state_idx: int = 0, **_: Any) -> Tensor:
        full = torch.cat([self.conv.to(conv_states.dtype), conv_states], dim=-1)
        self.conv = full[..., -self.kernel:]
        return full

    def update_recurrent_state(self, recurrent_states: Tensor, layer_idx: int, state_idx: int = 0, **_: Any) -> Tensor:
        self.rec = recurrent_states
        return recurrent_states

    def states_out(self) -> tuple[Tensor, Tensor]:
        return self.conv[..., 1:].to(torch.float32), self.rec.to(torch.float32)


class _HFGDNWrapper(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        if not is_hf_gdn_module(layer):
            raise TypeError(f"expected one of {', '.join(HF_GDN_CLASS_NAMES)}, got {type(layer).__name__}")
        self.layer = layer

    def forward(self, hidden_states: Tensor, conv_state: Tensor, rec_state: Tensor):
        cache = _LayerStateCache(conv_state, rec_state, self.layer.conv_kernel_size)
        with route_to_gdn_ops(self.layer):
            out = self.layer(hidden_states, cache_params=cache)
        return (out, *cache.states_out())


class HFGDNPrefill(_HFGDNWrapper):
    """Prefill of B equal-length sequences: (hidden_states [B,T,hidden], conv_state, rec_state) -> (out, conv, rec)."""


class HFGDNDecode(_HFGDNWrapper):
    """One token per sequence: (hidden_states [B,1,hidden], conv_state, rec_state) -> (out, conv, rec)."""


def hf_state_shapes(layer: nn.Module) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv_dim, kernel-1) and (Hv, K, V) of an HF GatedDeltaNet layer."""
    return ((layer.conv_dim, layer.conv_kernel_size - 1),
            (layer.num_v_heads, layer.head_k_dim, layer.head_v_dim))


def hf_example_inputs(layer: nn.Module, batch: int, tokens: int, *, seed: int = 0,
                      dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Random (hidden_states, conv_state, rec_state) for a layer (states fp32, moderate magnitudes)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or next(layer.parameters()).dtype
    (cd, kw), (hv, k, v) = hf_state_shapes(layer)
    x = torch.randn(batch, tokens, layer.hidden_size, generator=gen).to(dtype)
    conv = torch.randn(batch, cd, kw, generator=gen) * 0.5
    rec = torch.randn(batch, hv, k, v, generator=gen) * 0.1
    return x, conv, rec
