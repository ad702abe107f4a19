"""HybridLM: a causal LM whose layers are GDN blocks or full attention, each with a dense or MoE MLP.

State convention (one per layer kind; the ONNX graphs and the sidecar use the same):

- GDN layer: ``(conv_state [N, conv_dim, W-1], rec_state [N, Hv, K, V] float32)`` in and out of prefill and decode;
- attention layer: prefill starts from an empty cache and returns the post-RoPE keys and values of its packed
  tokens ``(k [T, Hkv, D], v [T, Hkv, D])``; :func:`decode_states_from_prefill` scatters them into a decode cache
  ``(k_cache [N, Hkv, S, D], v_cache [N, Hkv, S, D])`` of capacity S; decode writes the new token at its position
  and returns the caches with the same shapes.

:meth:`HybridLM.forward_prefill` takes packed tokens of N sequences (``cu_seqlens``, int32) and returns logits of every token or of each
sequence's last token; :meth:`HybridLM.forward_decode` takes one token per sequence and each sequence's position (= tokens already in
its cache), so sequences of different lengths share one call. No data-dependent Python control flow on either
path except the MoE's ``"routed"`` mode (the export wrappers pick ``"op"``, ``"grouped"`` / ``"gather"``).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention, packed_causal_mask, packed_spans
from .config import HybridConfig
from .gdn import GDNBlock, GDNConfig
from .mlp import MOE_IMPLS, SparseMoE, SwiGLU
from .norms import RMSNorm

__all__ = ["HybridLM", "GDNLM", "DecoderLayer", "decode_states_from_prefill", "grow_decode_states",
           "positions_from_cu_seqlens", "scatter_packed", "sequence_of_tokens", "padded_view", "empty_states"]

LayerState = tuple[Tensor, Tensor]


def _traced() -> bool:
    """True inside torch.export / dynamo / TorchScript tracing (where host reads of cu_seqlens are not allowed)."""
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return bool(torch.compiler.is_compiling() or exporting() or torch.jit.is_tracing())


def sequence_of_tokens(cu_seqlens: Tensor, T: int) -> Tensor:
    """Index of every packed token's sequence, int64 ``[T]`` (O(T*N) comparisons, no host read)."""
    cu = cu_seqlens.to(torch.long)
    tok = torch.arange(T, device=cu.device)
    return (tok[:, None] >= cu[1:][None, :]).sum(1).clamp(max=max(cu.shape[0] - 2, 0))


def positions_from_cu_seqlens(cu_seqlens: Tensor, T: int) -> Tensor:
    """Position of every packed token inside its sequence, int64 ``[T]``."""
    tok = torch.arange(T, device=cu_seqlens.device)
    return tok - cu_seqlens.to(torch.long)[sequence_of_tokens(cu_seqlens, T)]


def padded_view(cu_seqlens, device=None) -> Tensor:
    """``pad_index [N, L]`` int64 of packed sequences (host-side, from a list or tensor of offsets): row n holds
    the packed rows of sequence n's tokens, then ``T`` (padding) up to ``L`` = the longest sequence (>= 1)."""
    cu = [int(v) for v in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    T, lens = cu[-1], [b - a for a, b in zip(cu[:-1], cu[1:])]
    L = max([1, *lens])
    rows = [list(range(a, b)) + [T] * (L - (b - a)) for a, b in zip(cu[:-1], cu[1:])]
    return torch.tensor(rows, dtype=torch.long, device=device).reshape(len(rows), L)


class DecoderLayer(nn.Module):
    """Pre-norm layer (``h += mixer(norm(h)); h += mlp(norm(h))``) or, for OLMo-Hybrid's attention layers,
    post-norm (``h += norm(attn(h)); h += norm(mlp(h))``)."""

    def __init__(self, c: HybridConfig, i: int):
        super().__init__()
        self.layer_type = c.layer_types[i]
        self.post_norm = c.post_norm_attention and self.layer_type == "full_attention"
        H, eps, kind = c.hidden_size, c.rms_norm_eps, c.norm_kind
        if not self.post_norm:
            self.input_layernorm = RMSNorm(H, eps, kind)
        if self.layer_type == "linear_attention":
            self.linear_attn = GDNBlock(c.gdn)
        else:
            self.self_attn = Attention(H, c.attention)
        self.post_attention_layernorm = RMSNorm(H, eps, kind)
        self.mlp = SparseMoE(H, c.moe) if c.mlp_types[i] == "moe" else SwiGLU(H, c.intermediate_size)
        if self.post_norm:
            self.post_feedforward_layernorm = RMSNorm(H, eps, kind)

    def _mixer_in(self, h: Tensor) -> Tensor:
        return h if self.post_norm else self.input_layernorm(h)

    def _finish(self, h: Tensor, y: Tensor) -> Tensor:
        if self.post_norm:
            h = h + self.post_attention_layernorm(y)
            return h + self.post_feedforward_layernorm(self.mlp(h))
        h = h + y
        return h + self.mlp(self.post_attention_layernorm(h))

    def prefill(self, h, cu_seqlens, positions, mask, state: Optional[LayerState], padded=None):
        x = self._mixer_in(h)
        if self.layer_type == "linear_attention":
            y, a, b = self.linear_attn.prefill(x, cu_seqlens, *(state if state is not None else (None, None)))
        elif padded is not None:
            if state is None:
                raise ValueError("prefill with pad_index: attention layers need their (key_cache, value_cache)")
            y, a, b = self.self_attn.prefill_cached(x, positions, *padded, *state)
        else:
            if state is not None:
                raise ValueError("attention layers start prefill from an empty KV cache; pass None as their state")
            y, a, b = self.self_attn.prefill(x, positions, mask)
        return self._finish(h, y), (a, b)

    def decode(self, h, positions, state: LayerState):
        x = self._mixer_in(h)
        if self.layer_type == "linear_attention":
            y, a, b = self.linear_attn.decode(x, *state)
        else:
            y, a, b = self.self_attn.decode(x, positions, *state)
        return self._finish(h, y), (a, b)


class HybridLM(nn.Module):
    """embed -> layers (see :class:`DecoderLayer`) -> RMSNorm -> lm_head (``embed_tokens.weight`` when tied).

    Parameter names equal the HF ``*ForCausalLM`` state dict without its ``model.`` prefix."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        c = self.hybrid_config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_kind)
        self.lm_head = None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    @property
    def config(self):
        return self.hybrid_config

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def set_moe_impl(self, impl: str) -> None:
        """``"routed"`` (eager default), ``"gather"``, ``"dense"``, ``"grouped"`` or ``"op"`` for every MoE layer
        (lm.mlp)."""
        if impl not in MOE_IMPLS:
            raise ValueError(f"moe impl: expected one of {MOE_IMPLS}, got {impl!r}")
        for m in self.modules():
            if isinstance(m, SparseMoE):
                m.impl = impl

    def _logits(self, h: Tensor) -> Tensor:
        h = self.norm(h)
        return F.linear(h, self.embed_tokens.weight) if self.lm_head is None else self.lm_head(h)

    def _check_states(self, states, what: str) -> list:
        L = len(self.layers)
        if states is None:
            return [None] * L
        if len(states) != L:
            raise ValueError(f"{what}: expected {L} per-layer states, got {len(states)}")
        return list(states)

    # ---- public API (forward_prefill / forward_decode are the same on every HybridLM, GDNLM included) -----
    def prefill(self, *args, **kwargs):
        """:meth:`forward_prefill` (GDNLM keeps its own older signature under this name)."""
        return self.forward_prefill(*args, **kwargs)

    def decode(self, *args, **kwargs):
        """:meth:`forward_decode` (GDNLM keeps its own older signature under this name)."""
        return self.forward_decode(*args, **kwargs)

    def forward_prefill(self, input_ids: Tensor, cu_seqlens: Tensor, states: Optional[Sequence] = None,
                        positions: Optional[Tensor] = None, last_only: bool = False, attention: str = "auto",
                        pad_index: Optional[Tensor] = None, hidden_out: Optional[list] = None):
        """input_ids [T] packed, cu_seqlens [N+1] int32 -> (logits, states).

        logits: ``[T, vocab]``, or ``[N, vocab]`` at each sequence's last token with ``last_only`` (every
        sequence needs >= 1 token then). ``states``: per layer, a GDN ``(conv, rec)`` to continue from (None:
        zeros) or None for attention layers. ``positions`` [T] (default: 0.. within each sequence) drive RoPE.
        ``attention``: how attention layers keep to each sequence: "mask" (a ``[T, T]`` block-diagonal mask, as
        the exported graphs do), "spans" (one fused causal attention per sequence; reads cu_seqlens on the host)
        or "auto" (spans in eager mode, the mask while traced or exported). ``hidden_out``: a list that receives
        the final-normed hidden states of every token ``[T, hidden]`` (what an MTP head reads).

        With ``pad_index`` [N, L] (:func:`padded_view`) prefill continues from caches (the exported form):
        attention layers' states are ``(key_cache, value_cache)`` [N, Hkv, S, D] (slots < each sequence's past
        length filled, ``past + L <= S``), ``positions`` are past length + index; the new keys/values are written
        at their positions and the caches returned; nothing spans all packed token pairs (``attention`` unused).
        """
        T = input_ids.shape[0]
        st = self._check_states(states, "prefill")
        if positions is None:
            positions = positions_from_cu_seqlens(cu_seqlens, T)
        mask, padded = None, None
        if pad_index is not None:
            seq = sequence_of_tokens(cu_seqlens, T)
            cu = cu_seqlens.to(torch.long)
            padded = (seq, torch.arange(T, device=input_ids.device) - cu[seq], cu[:-1], pad_index)
        elif self.hybrid_config.attention_layers():
            if attention not in ("auto", "mask", "spans"):
                raise ValueError(f"forward_prefill attention: expected auto, mask or spans, got {attention!r}")
            if attention == "auto":
                attention = "mask" if _traced() else "spans"
            mask = packed_causal_mask(cu_seqlens, T) if attention == "mask" else packed_spans(cu_seqlens)
        h = self.embed_tokens(input_ids)
        out = []
        for layer, s in zip(self.layers, st):
            h, ns = layer.prefill(h, cu_seqlens, positions, mask, s, padded)
            out.append(ns)
        if hidden_out is not None:
            hidden_out.append(self.norm(h))
        if last_only:
            h = h.index_select(0, cu_seqlens[1:].to(torch.long) - 1)
        return self._logits(h), out

    def forward_decode(self, input_ids: Tensor, positions: Tensor, states: Sequence):
        """input_ids [B], positions [B] int (tokens already cached per sequence), states (decode layout)
        -> (logits [B, vocab], states)."""
        st = self._check_states(states, "decode")
        h = self.embed_tokens(input_ids)
        out = []
        for layer, s in zip(self.layers, st):
            h, ns = layer.decode(h, positions, s)
            out.append(ns)
        return self._logits(h), out


def scatter_packed(x: Tensor, cu_seqlens: Tensor, capacity: int) -> Tensor:
    """Packed per-token rows ``x [T, H, D]`` of N sequences -> a zero-padded cache ``[N, H, capacity, D]``
    (sequence n's token j at slot j)."""
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    if lens.numel() and int(lens.max()) > capacity:
        raise ValueError(f"KV cache capacity {capacity} is smaller than the longest prompt ({int(lens.max())})")
    T = x.shape[0]
    slot = torch.arange(capacity, device=x.device)
    idx = (cu[:-1, None] + slot[None, :]).clamp(max=max(T - 1, 0))                 # [N, S]
    valid = (slot[None, :] < lens[:, None])[:, :, None, None]
    g = x.index_select(0, idx.reshape(-1)).reshape(idx.shape[0], capacity, *x.shape[1:])
    return torch.where(valid, g, torch.zeros((), dtype=x.dtype, device=x.device)).permute(0, 2, 1, 3).contiguous()


def decode_states_from_prefill(config: HybridConfig, states: Sequence[LayerState], cu_seqlens: Tensor,
                               capacity: int) -> list[LayerState]:
    """Prefill states -> decode states: attention layers' packed ``[T, Hkv, D]`` keys/values scattered into
    zero-padded caches ``[N, Hkv, capacity, D]`` (sequence n's token j at slot j); GDN states pass through."""
    out = []
    for t, (a, b) in zip(config.layer_types, states):
        out.append((a, b) if t == "linear_attention" else
                   (scatter_packed(a, cu_seqlens, capacity), scatter_packed(b, cu_seqlens, capacity)))
    return out


def grow_decode_states(config: HybridConfig, states: Sequence[LayerState], capacity: int) -> list[LayerState]:
    """Decode states with attention caches zero-padded to ``capacity`` slots (>= the current one)."""
    out = []
    for t, (a, b) in zip(config.layer_types, states):
        if t == "full_attention" and a.shape[2] < capacity:
            pad = capacity - a.shape[2]
            a, b = F.pad(a, (0, 0, 0, pad)), F.pad(b, (0, 0, 0, pad))
        out.append((a, b))
    return out


def empty_states(config: HybridConfig, n: int, capacity: int, dtype: torch.dtype, device=None) -> list[LayerState]:
    """Zero states of ``n`` sequences in the layout prefill and decode share: GDN ``(conv [n, conv_dim, W-1],
    rec [n, Hv, K, V])`` float32, attention ``(key_cache, value_cache)`` ``[n, Hkv, capacity, D]`` in ``dtype``."""
    out = []
    for t in config.layer_types:
        if t == "linear_attention":
            g = config.gdn
            out.append((torch.zeros(n, g.conv_dim, g.conv_kernel_size - 1, device=device),
                        torch.zeros(n, g.num_v_heads, g.head_k_dim, g.head_v_dim, device=device)))
        else:
            a = config.attention
            shape = (n, a.num_kv_heads, capacity, a.head_dim)
            out.append((torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)))
    return out


class GDNLM(HybridLM):
    """The bundled pure-GDN LM: a HybridLM whose layers are all GDN blocks with dense SwiGLU MLPs.

    Kept API: ``config`` is the :class:`GDNConfig` (the ``gdn-deploy/1`` checkpoint format stores it);
    ``prefill``/``decode`` take and return per-layer conv and recurrent state lists; ``decode_pool`` updates
    per-layer state pools in place. With ``tie_word_embeddings`` there is no ``lm_head`` parameter."""

    def __init__(self, config: GDNConfig):
        if not config.is_lm:
            raise ValueError(f"GDNLM needs vocab_size > 0 and intermediate_size > 0, got vocab_size="
                             f"{config.vocab_size}, intermediate_size={config.intermediate_size}")
        super().__init__(HybridConfig.from_gdn_config(config))
        self.gdn_config = config

    @property
    def config(self) -> GDNConfig:
        return self.gdn_config

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Sane init from the current torch RNG (seed it for reproducibility): embeddings of std
        1/sqrt(hidden) (O(1) tied logits), fan-in scaled projections, residual branches scaled by
        1/sqrt(2*num_layers): every block contributes O(1) to the residual stream, which does not grow
        with depth or sequence length."""
        h, inter = self.config.hidden_size, self.config.intermediate_size
        self.embed_tokens.weight.normal_(0.0, h ** -0.5)
        branch = 1.0 / math.sqrt(2.0 * self.config.num_layers)
        for layer in self.layers:
            layer.linear_attn.reset_parameters(out_scale=branch)
            layer.mlp.gate_proj.weight.normal_(0.0, h ** -0.5)
            layer.mlp.up_proj.weight.normal_(0.0, h ** -0.5)
            layer.mlp.down_proj.weight.normal_(0.0, branch * inter ** -0.5)
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        if self.lm_head is not None:
            self.lm_head.weight.normal_(0.0, 1.0 / math.sqrt(h))

    def init_states(self, n: int, dtype: Optional[torch.dtype] = None, device=None):
        """Zero per-layer states: (conv_states list, rec_states list)."""
        pairs = [layer.linear_attn.init_states(n, dtype, device) for layer in self.layers]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _pairs(self, conv_states, rec_states):
        L = len(self.layers)
        cs = [None] * L if conv_states is None else list(conv_states)
        rs = [None] * L if rec_states is None else list(rec_states)
        if len(cs) != L or len(rs) != L:
            raise ValueError(f"expected {L} per-layer states, got {len(cs)} conv and {len(rs)} recurrent")
        return cs, rs

    def prefill(self, input_ids: Tensor, cu_seqlens: Tensor, conv_states=None, rec_states=None):
        """input_ids [T] int64 packed -> (logits [T, vocab], conv_states, rec_states)."""
        cs, rs = self._pairs(conv_states, rec_states)
        h = self.embed_tokens(input_ids)
        conv_out, rec_out = [], []
        for layer, c, r in zip(self.layers, cs, rs):
            y, c, r = layer.linear_attn.prefill(layer.input_layernorm(h), cu_seqlens, c, r)
            h = layer._finish(h, y)
            conv_out.append(c)
            rec_out.append(r)
        return self._logits(h), conv_out, rec_out

    def decode(self, input_ids: Tensor, conv_states, rec_states):
        """input_ids [B] int64, one token per sequence -> (logits [B, vocab], conv_states, rec_states)."""
        cs, rs = self._pairs(conv_states, rec_states)
        if any(c is None for c in cs) or any(r is None for r in rs):
            raise ValueError("decode needs every layer's conv and recurrent state")
        h = self.embed_tokens(input_ids)
        conv_out, rec_out = [], []
        for layer, c, r in zip(self.layers, cs, rs):
            y, c, r = layer.linear_attn.decode(layer.input_layernorm(h), c, r)
            h = layer._finish(h, y)
            conv_out.append(c)
            rec_out.append(r)
        return self._logits(h), conv_out, rec_out

    def decode_pool(self, input_ids: Tensor, conv_pools, rec_pools, slots: Tensor) -> Tensor:
        """Like :meth:`decode` with per-layer state pools updated in place at ``slots`` -> logits [B, vocab]."""
        cs, rs = self._pairs(conv_pools, rec_pools)
        h = self.embed_tokens(input_ids)
        for layer, c, r in zip(self.layers, cs, rs):
            h = layer._finish(h, layer.linear_attn.decode_pool(layer.input_layernorm(h), c, r, slots))
        return self._logits(h)
