"""Full-attention layer of the hybrid models: GQA with optional output gate, q/k RMSNorm and partial RoPE.

Parameter names equal the HF modules (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``):

- Qwen3-Next / Qwen3.5 (``output_gate=True``, ``qk_norm="head"``): ``q_proj`` gives ``[query | gate]`` per head
  (2 * head_dim each), q and k are RMS-normed per head (zero-centred weights), RoPE rotates the first
  ``rotary_dim = head_dim * partial_rotary_factor`` dims, and the attention output is multiplied by
  ``sigmoid(gate)`` before ``o_proj``;
- OLMo-Hybrid (``output_gate=False``, ``qk_norm="proj"``): q and k RMS-normed over the whole projection, full
  RoPE (or none, NoPE, when the config has no rope_theta) computed in float32.

Qwen3.5's interleaved multimodal RoPE (``mrope_section``) takes three position streams (t, h, w); for text they
are equal, and then every rotary frequency sees the same position: it is this 1-D RoPE (tests/lm shows it
against HF's rotary module).

Two entry points, ONNX-exportable with the mask form (the spans form below is eager-only: it loops over sequences):

- :meth:`Attention.prefill`: packed tokens ``[T, hidden]`` of N sequences, attention restricted to the same
  sequence and causal; returns the output and the post-RoPE keys / values ``[T, Hkv, D]`` of every token (a
  runtime scatters them into a decode cache). Two forms of "same sequence": a ``[T, T]`` block-diagonal mask
  (``packed_causal_mask``; what the exported graphs hold: O(T^2) scores) or the sequences' spans as Python ints
  (``packed_spans``; eager PyTorch: one causal ``scaled_dot_product_attention`` per sequence, or one batched call
  when all lengths are equal, so the GPU runs its flash kernels and nothing outside a sequence is computed);
- :meth:`Attention.prefill_cached`: packed new tokens of N sequences continuing from KV caches ``[N, Hkv, S, D]``
  (what the exported prefill graphs hold): the tokens are gathered into a per-sequence padded view ``[N, L]``
  (``pad_index``), written into the caches at their positions and attend to their own sequence's cache
  (:func:`gdn_deploy.lm.cache_attention.cache_attention`: one GroupQueryAttention node in onnxruntime graphs);
- :meth:`Attention.decode`: one token per sequence with a KV cache ``[B, Hkv, S, D]`` (S = capacity); the new
  token's key/value are written at its position (``position < S``) and keys at ``j > position`` are masked
  (exported: the same cache_attention node with one new token per sequence).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .cache_attention import cache_attention, cache_attention_ref
from .norms import RMSNorm, wide


def _traced() -> bool:
    """True inside torch.export / dynamo / TorchScript tracing."""
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return bool(torch.compiler.is_compiling() or exporting() or torch.jit.is_tracing())

__all__ = ["AttentionConfig", "Attention", "rope_inv_freq", "rope_cos_sin", "apply_rope", "packed_causal_mask",
           "packed_spans"]

QK_NORMS = ("head", "proj", "none")


@dataclass
class AttentionConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bias: bool = False
    output_gate: bool = True
    qk_norm: str = "head"
    norm_kind: str = "zero_centered"
    rms_norm_eps: float = 1e-6
    rope_theta: Optional[float] = 10000.0     # None: no rotary embedding (NoPE)
    rotary_dim: int = 0                       # rotated dims (even, <= head_dim); 0 with rope_theta set = head_dim
    rope_factor: float = 1.0                  # "linear" RoPE scaling: positions / factor
    rope_fp32: bool = False                   # rotate in float32 and cast back (OLMo-Hybrid)

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"attention {name}: expected a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"attention heads: num_attention_heads={self.num_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"attention qk_norm: expected one of {QK_NORMS}, got {self.qk_norm!r}")
        if self.rope_theta is not None:
            if self.rotary_dim == 0:
                self.rotary_dim = self.head_dim
            if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
                raise ValueError(f"attention rotary_dim: expected an even number in (0, head_dim={self.head_dim}], "
                                 f"got {self.rotary_dim} (head_dim * partial_rotary_factor)")

    def to_dict(self) -> dict:
        return asdict(self)


def rope_inv_freq(theta: float, rotary_dim: int) -> Tensor:
    """HF's default RoPE frequencies, computed the same way (float32)."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, factor: float = 1.0):
    """cos, sin ``[R, rotary_dim]`` (float32) for int positions ``[R]``."""
    pos = positions.to(torch.float32)
    if factor != 1.0:
        pos = pos / factor
    freqs = pos[:, None] * inv_freq.to(device=positions.device, dtype=torch.float32)[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, fp32: bool) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x [R, H, D]`` (HF's rotate_half convention)."""
    rd = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    if fp32:
        rot, rest = wide(x[..., :rd]), x[..., rd:]
        out = (rot * c + _rotate_half(rot) * s).to(x.dtype)
    else:
        rot, rest = x[..., :rd], x[..., rd:]
        c, s = c.to(x.dtype), s.to(x.dtype)
        out = rot * c + _rotate_half(rot) * s
    return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)


def packed_causal_mask(cu_seqlens: Tensor, T: int) -> Tensor:
    """``[T, T]`` bool: token i may attend to token j (same sequence, j <= i), from int32 cu_seqlens."""
    cu = cu_seqlens.to(torch.long)
    tok = torch.arange(T, device=cu.device)
    seq = (tok[:, None] >= cu[1:][None, :]).sum(1)
    return (seq[:, None] == seq[None, :]) & (tok[None, :] <= tok[:, None])


def packed_spans(cu_seqlens: Tensor) -> tuple:
    """cu_seqlens [N+1] -> the same offsets as a tuple of Python ints (one device-to-host copy; eager use only)."""
    return tuple(int(v) for v in cu_seqlens.tolist())


class Attention(nn.Module):
    def __init__(self, hidden_size: int, c: AttentionConfig):
        super().__init__()
        self.config = c
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, D
        self.scaling = D ** -0.5
        self.q_proj = nn.Linear(hidden_size, H * D * (2 if c.output_gate else 1), bias=c.bias)
        self.k_proj = nn.Linear(hidden_size, Hkv * D, bias=c.bias)
        self.v_proj = nn.Linear(hidden_size, Hkv * D, bias=c.bias)
        self.o_proj = nn.Linear(H * D, hidden_size, bias=c.bias)
        if c.qk_norm == "head":
            self.q_norm = RMSNorm(D, c.rms_norm_eps, c.norm_kind)
            self.k_norm = RMSNorm(D, c.rms_norm_eps, c.norm_kind)
        elif c.qk_norm == "proj":
            self.q_norm = RMSNorm(H * D, c.rms_norm_eps, c.norm_kind)
            self.k_norm = RMSNorm(Hkv * D, c.rms_norm_eps, c.norm_kind)

    # ---- pieces ---------------------------------------------------------------------------------
    def _qkv(self, x: Tensor, positions: Tensor):
        """x [R, hidden] -> q [R, H, D], k, v [R, Hkv, D] (normed, rotated), gate [R, H*D] or None."""
        c, R, H, Hkv, D = self.config, x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        gate = None
        if c.output_gate:
            qg = self.q_proj(x).reshape(R, H, 2 * D)
            q, gate = qg[..., :D], qg[..., D:].reshape(R, H * D)
        else:
            q = self.q_proj(x)
        k = self.k_proj(x)
        if c.qk_norm == "proj":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.reshape(R, H, D), k.reshape(R, Hkv, D)
        if c.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).reshape(R, Hkv, D)
        if c.rope_theta is not None:
            # the frequencies are a float32 constant made here, not a buffer: casting the model to fp16/bf16
            # must not round them
            cos, sin = rope_cos_sin(positions, rope_inv_freq(c.rope_theta, c.rotary_dim), c.rope_factor)
            q, k = apply_rope(q, cos, sin, c.rope_fp32), apply_rope(k, cos, sin, c.rope_fp32)
        return q, k, v, gate

    def _out(self, o: Tensor, gate: Optional[Tensor]) -> Tensor:
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)

    # ---- public API -----------------------------------------------------------------------------
    def prefill(self, x: Tensor, positions: Tensor, mask):
        """x [T, hidden], positions [T] int, mask: ``[T, T]`` bool (``packed_causal_mask``) or the offsets of
        ``packed_spans`` -> (y [T, hidden], k [T, Hkv, D], v [T, Hkv, D])."""
        T, H, Hkv, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v, gate = self._qkv(x, positions)
        if not isinstance(mask, Tensor):
            return self._out(self._attend_spans(q, k, v, mask), gate), k, v
        qh = q.permute(1, 0, 2).reshape(Hkv, H // Hkv, T, D)
        kh, vh = k.permute(1, 0, 2)[:, None], v.permute(1, 0, 2)[:, None]          # [Hkv, 1, T, D]
        scores = torch.matmul(qh, kh.transpose(-1, -2)) * self.scaling              # [Hkv, rep, T, T]
        scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.softmax(wide(scores), dim=-1).to(q.dtype)
        o = torch.matmul(p, vh).reshape(H, T, D).permute(1, 0, 2).reshape(T, H * D)
        return self._out(o, gate), k, v

    def _attend_spans(self, q: Tensor, k: Tensor, v: Tensor, cu: tuple) -> Tensor:
        """Causal attention within each span ``cu[i]:cu[i+1]`` of q [T, H, D], k, v [T, Hkv, D] -> [T, H*D]."""
        T, H, D = q.shape
        if not cu or cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu[:-1], cu[1:])):
            raise ValueError(f"attention prefill: cu_seqlens {list(cu)} do not split the {T} packed tokens")
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = self.num_kv_heads != H
        lens = {b - a for a, b in zip(cu[:-1], cu[1:])}
        if T == 0:
            return q.new_zeros(0, H * D)
        if len(lens) == 1:                                      # equal lengths: one batched call
            N, L = len(cu) - 1, T // (len(cu) - 1)
            o = sdpa(*(t.reshape(N, L, -1, D).transpose(1, 2) for t in (q, k, v)), is_causal=True,
                     scale=self.scaling, enable_gqa=gqa)        # [N, H, L, D]
            return o.transpose(1, 2).reshape(T, H * D)
        parts = []
        for a, b in zip(cu[:-1], cu[1:]):
            if b > a:
                o = sdpa(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), is_causal=True, scale=self.scaling,
                         enable_gqa=gqa)                        # [1, H, L, D]
                parts.append(o[0].transpose(0, 1).reshape(b - a, H * D))
        return torch.cat(parts, 0)

    def _cache_attention(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, past: Tensor):
        """q [N, L, H, D], k, v [N, L, Hkv, D] of positions past[n] + i -> (o [N, L, H*D], caches) (one node when
        traced; the eager reference otherwise)."""
        N, L = q.shape[0], q.shape[1]
        args = (q.reshape(N, L, -1), k.reshape(N, L, -1), v.reshape(N, L, -1), k_cache, v_cache, past.to(torch.long),
                self.num_heads, self.num_kv_heads, self.scaling)
        return cache_attention(*args) if _traced() else cache_attention_ref(*args)

    def prefill_cached(self, x: Tensor, positions: Tensor, seq: Tensor, local: Tensor, first: Tensor,
                       pad_index: Tensor, k_cache: Tensor, v_cache: Tensor):
        """Prefill that continues from KV caches, without any ``[T, T]`` tensor.

        x [T, hidden] packed new tokens; positions [T] (= cache slot: past length + index in the sequence);
        seq [T] / local [T]: each token's sequence and index among its sequence's new tokens; first [N]: packed
        row of each sequence's first new token; pad_index [N, L]: packed row of sequence n's i-th new token
        (anything outside ``[0, T)`` = padding); caches [N, Hkv, S, D] (every ``past + L <= S``).
        -> (y [T, hidden], k_cache, v_cache) with the new keys/values written at their positions."""
        T, H, Hkv, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        N, L = pad_index.shape
        q, k, v, gate = self._qkv(x, positions)
        idx = pad_index.to(torch.long)
        idx = torch.where((idx >= 0) & (idx < T), idx, torch.full_like(idx, T)).reshape(-1)  # T: a zero row

        def padded(t: Tensor) -> Tensor:
            return torch.cat([t, t.new_zeros(1, *t.shape[1:])]).index_select(0, idx).reshape(N, L, *t.shape[1:])

        past = positions.to(torch.long).index_select(0, first.to(torch.long))
        o, k_cache, v_cache = self._cache_attention(padded(q), padded(k), padded(v), k_cache, v_cache, past)
        flat = seq.to(torch.long) * L + local.to(torch.long).clamp(0, max(L - 1, 0))
        o = o.reshape(N * L, H * D).index_select(0, flat)
        return self._out(o, gate), k_cache, v_cache

    def decode(self, x: Tensor, positions: Tensor, k_cache: Tensor, v_cache: Tensor):
        """x [B, hidden], positions [B] int (the new token's position = tokens already cached), caches
        [B, Hkv, S, D] -> (y [B, hidden], k_cache, v_cache) with the new token written at its position."""
        B, H, Hkv, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        S = k_cache.shape[2]
        q, k, v, gate = self._qkv(x, positions)
        if _traced():
            o, k_cache, v_cache = self._cache_attention(q[:, None], k[:, None], v[:, None], k_cache, v_cache,
                                                        positions)
            return self._out(o.reshape(B, H * D), gate), k_cache, v_cache
        slot = torch.arange(S, device=x.device)[None, :]                           # [1, S]
        pos = positions.to(torch.long)[:, None]                                     # [B, 1]
        write = (slot == pos)[:, None, :, None]                                     # [B, 1, S, 1]
        k_cache = torch.where(write, k.to(k_cache.dtype)[:, :, None, :], k_cache)
        v_cache = torch.where(write, v.to(v_cache.dtype)[:, :, None, :], v_cache)
        qh = q.reshape(B, Hkv, H // Hkv, D)
        scores = torch.matmul(qh, k_cache.to(q.dtype).transpose(-1, -2)) * self.scaling   # [B, Hkv, rep, S]
        scores = scores.masked_fill((slot > pos)[:, None, None, :], float("-inf"))
        p = torch.softmax(wide(scores), dim=-1).to(q.dtype)
        o = torch.matmul(p, v_cache.to(q.dtype)).reshape(B, H * D)
        return self._out(o, gate), k_cache, v_cache
