"""Gated DeltaNet block (Hugging Face Qwen3-Next / Qwen3.5 / OLMo-Hybrid compatible).

:class:`GDNBlock` has the parameter names of the HF modules, so ``block.load_state_dict(hf_module.state_dict())``
works 1:1:

- ``projection_layout="qwen3_next"`` (``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz``, ``in_proj_ba`` (grouped per
  key head), ``conv1d``, ``dt_bias``, ``A_log``, ``norm``, ``out_proj``;
- ``"qwen3_5"`` (``Qwen3_5GatedDeltaNet``, ``Qwen3_5MoeGatedDeltaNet``): ``in_proj_qkv``, ``in_proj_z``,
  ``in_proj_b``, ``in_proj_a`` instead of the two fused projections;
- ``"olmo_hybrid"`` (``OlmoHybridGatedDeltaNet``): ``q_proj``, ``k_proj``, ``v_proj``, ``a_proj``, ``b_proj``,
  ``g_proj`` (the output gate z), ``o_norm``, ``o_proj``, ``conv1d`` (optionally with a bias), gated-norm eps 1e-5
  and ``beta = 2 * sigmoid(b)`` (``linear_allow_neg_eigval``: ``beta_scale=2``).

The recurrent core calls the gdn custom ops (``torch.ops.gdn.prefill`` / ``decode`` / ``decode_pool_``) with
use_qk_l2norm=1 and gate_mode=1 (raw a, b, A_log, dt_bias), or gate_mode=0 with g and beta computed here in plain
torch ops when ``beta_scale != 1`` (beta in [0, 2], the contract's documented range for precomputed gates).
Everything else is plain torch ops without data-dependent Python control flow, so
``torch.onnx.export(dynamo=True)`` traces it with dynamic T, N, B.

Packed varlen layout: prefill takes tokens ``x [T, hidden]`` of N sequences concatenated, with int32
``cu_seqlens [N+1]``. States: conv ``[N, conv_dim, conv_kernel_size-1]`` (the last kernel-1 pre-conv inputs,
the model dtype), recurrent ``[N, Hv, K, V]`` float32.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops  # noqa: F401  (registers torch.ops.gdn.*)
from ..kernels import trusted_values
from . import triton_ops
from .norms import GatedRMSNorm, wide

__all__ = ["GDNConfig", "GDNBlock", "PROJECTION_LAYOUTS", "L2NORM_EPS", "check_state_dict"]

PROJECTION_LAYOUTS = ("qwen3_next", "qwen3_5", "olmo_hybrid")
L2NORM_EPS = 1e-6  # HF's l2norm eps inside the gated delta rule (use_qk_l2norm_in_kernel=True)


@dataclass
class GDNConfig:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int = 4
    rms_norm_eps: float = 1e-6
    projection_layout: str = "qwen3_next"
    conv_bias: bool = False            # OLMo-Hybrid checkpoints may carry a conv bias
    beta_scale: float = 1.0            # 2.0: beta = 2 * sigmoid(b) in [0, 2] (OLMo linear_allow_neg_eigval)
    gated_norm_eps: Optional[float] = None   # eps of the gated output norm; None = rms_norm_eps
    # LM fields (GDNLM only)
    vocab_size: int = 0
    num_layers: int = 1
    intermediate_size: int = 0
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "num_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GDNConfig.{name}: expected a positive int, got {v!r}")
        if isinstance(self.conv_kernel_size, bool) or not isinstance(self.conv_kernel_size, int) \
                or self.conv_kernel_size < 2:
            raise ValueError(f"GDNConfig.conv_kernel_size: expected an int >= 2, got {self.conv_kernel_size!r}")
        for name in ("vocab_size", "intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"GDNConfig.{name}: expected an int >= 0 (0 = no LM), got {v!r}")
        if not isinstance(self.rms_norm_eps, (int, float)) or isinstance(self.rms_norm_eps, bool) \
                or not self.rms_norm_eps > 0:
            raise ValueError(f"GDNConfig.rms_norm_eps: expected a float > 0, got {self.rms_norm_eps!r}")
        self.rms_norm_eps = float(self.rms_norm_eps)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"GDNConfig: num_v_heads={self.num_v_heads} is not a multiple of "
                             f"num_k_heads={self.num_k_heads} (grouped value attention needs Hv % Hk == 0)")
        if self.projection_layout not in PROJECTION_LAYOUTS:
            raise ValueError(f"GDNConfig.projection_layout: expected one of {PROJECTION_LAYOUTS}, "
                             f"got {self.projection_layout!r}")
        for name in ("conv_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GDNConfig.{name}: expected a bool, got {getattr(self, name)!r}")
        if isinstance(self.beta_scale, bool) or not isinstance(self.beta_scale, (int, float)) \
                or not 0.0 < self.beta_scale <= 2.0:
            raise ValueError(f"GDNConfig.beta_scale: expected a float in (0, 2] (beta = beta_scale * sigmoid(b); "
                             f"the op contract takes beta in [0, 2]), got {self.beta_scale!r}")
        self.beta_scale = float(self.beta_scale)
        if self.gated_norm_eps is not None:
            if isinstance(self.gated_norm_eps, bool) or not isinstance(self.gated_norm_eps, (int, float)) \
                    or not self.gated_norm_eps > 0:
                raise ValueError(f"GDNConfig.gated_norm_eps: expected a float > 0 or None, got {self.gated_norm_eps!r}")
            self.gated_norm_eps = float(self.gated_norm_eps)

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def is_lm(self) -> bool:
        return self.vocab_size > 0 and self.intermediate_size > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GDNConfig":
        if not isinstance(d, dict):
            raise ValueError(f"GDNConfig.from_dict: expected a dict, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"GDNConfig.from_dict: unknown key(s) {unknown}; known keys: {names}")
        required = ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"GDNConfig.from_dict: missing required key(s) {missing}")
        return cls(**d)


class GDNBlock(nn.Module):
    """Gated DeltaNet token mixer with HF parameter names; see the module docstring for layouts."""

    def __init__(self, config: GDNConfig):
        super().__init__()
        c = self.config = config
        self.hidden_size, self.num_k_heads, self.num_v_heads = c.hidden_size, c.num_k_heads, c.num_v_heads
        self.head_k_dim, self.head_v_dim = c.head_k_dim, c.head_v_dim
        self.key_dim, self.value_dim = c.num_k_heads * c.head_k_dim, c.num_v_heads * c.head_v_dim
        self.conv_kernel_size, self.conv_dim = c.conv_kernel_size, c.conv_dim
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, c.conv_kernel_size, bias=c.conv_bias,
                                groups=self.conv_dim, padding=c.conv_kernel_size - 1)
        if c.projection_layout == "qwen3_next":
            self.in_proj_qkvz = nn.Linear(c.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(c.hidden_size, 2 * c.num_v_heads, bias=False)
        elif c.projection_layout == "qwen3_5":
            self.in_proj_qkv = nn.Linear(c.hidden_size, 2 * self.key_dim + self.value_dim, bias=False)
            self.in_proj_z = nn.Linear(c.hidden_size, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
            self.in_proj_a = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
        else:
            self.q_proj = nn.Linear(c.hidden_size, self.key_dim, bias=False)
            self.k_proj = nn.Linear(c.hidden_size, self.key_dim, bias=False)
            self.v_proj = nn.Linear(c.hidden_size, self.value_dim, bias=False)
            self.a_proj = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
            self.b_proj = nn.Linear(c.hidden_size, c.num_v_heads, bias=False)
            self.g_proj = nn.Linear(c.hidden_size, self.value_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(c.num_v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(c.num_v_heads).uniform_(0.01, 16)))
        norm = GatedRMSNorm(c.head_v_dim, eps=c.rms_norm_eps if c.gated_norm_eps is None else c.gated_norm_eps)
        proj = nn.Linear(self.value_dim, c.hidden_size, bias=False)
        if c.projection_layout == "olmo_hybrid":
            self.o_norm, self.o_proj = norm, proj
        else:
            self.norm, self.out_proj = norm, proj

    @property
    def output_norm(self) -> GatedRMSNorm:
        """The gated output norm (``norm``, or ``o_norm`` in the OLMo-Hybrid layout)."""
        return self.o_norm if self.config.projection_layout == "olmo_hybrid" else self.norm

    @property
    def output_proj(self) -> nn.Linear:
        """The output projection (``out_proj``, or ``o_proj`` in the OLMo-Hybrid layout)."""
        return self.o_proj if self.config.projection_layout == "olmo_hybrid" else self.out_proj

    # ---- initialisation -------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, out_scale: float = 1.0, dt_min: float = 1e-3, dt_max: float = 0.1,
                         A_min: float = 1.0, A_max: float = 16.0) -> None:
        """Sane init from the current torch RNG: fan-in scaled projections (unit-variance q/k/v/z/a/b
        for unit-RMS input), out_proj scaled by ``out_scale``, Mamba-style dt and A ranges (per-head
        decay exp(-A*dt) spread over short and long memories), identity-ish conv."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, m.in_features ** -0.5)
        self.output_proj.weight.normal_(0.0, out_scale * self.value_dim ** -0.5)
        k = self.conv_kernel_size
        self.conv1d.weight.normal_(0.0, 0.5 / math.sqrt(k))
        self.conv1d.weight[:, 0, -1] += 1.0  # current token passes through
        dt = torch.exp(torch.empty(self.num_v_heads).uniform_(math.log(dt_min), math.log(dt_max)))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log.copy_(torch.log(torch.empty(self.num_v_heads).uniform_(A_min, A_max)))
        self.output_norm.weight.fill_(1.0)
        if self.conv1d.bias is not None:
            self.conv1d.bias.zero_()

    # ---- pieces ---------------------------------------------------------------------------------
    def _project(self, x: Tensor):
        """x [R, hidden] -> mixed_qkv [R, conv_dim] (pre-conv, order q|k|v), z [R, Hv, V], b, a [R, Hv]."""
        R, Hk, Hv, K, V = x.shape[0], self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        if self.config.projection_layout == "qwen3_next":
            rep = Hv // Hk
            qkvz = self.in_proj_qkvz(x).reshape(R, Hk, 2 * K + 2 * rep * V)
            q, k, v, z = torch.split(qkvz, [K, K, rep * V, rep * V], dim=2)
            ba = self.in_proj_ba(x).reshape(R, Hk, 2 * rep)
            b, a = torch.split(ba, [rep, rep], dim=2)
            mixed = torch.cat([q.reshape(R, Hk * K), k.reshape(R, Hk * K), v.reshape(R, Hv * V)], dim=1)
            return mixed, z.reshape(R, Hv, V), b.reshape(R, Hv), a.reshape(R, Hv)
        if self.config.projection_layout == "olmo_hybrid":
            mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=1)
            return mixed, self.g_proj(x).reshape(R, Hv, V), self.b_proj(x), self.a_proj(x)
        return (self.in_proj_qkv(x), self.in_proj_z(x).reshape(R, Hv, V),
                self.in_proj_b(x), self.in_proj_a(x))

    def _split_qkv(self, mixed: Tensor):
        R = mixed.shape[0]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=1)
        return (q.reshape(R, self.num_k_heads, self.head_k_dim), k.reshape(R, self.num_k_heads, self.head_k_dim),
                v.reshape(R, self.num_v_heads, self.head_v_dim))

    def _gate_args(self, a: Tensor, b: Tensor) -> dict:
        """The op's gate inputs: raw a, b + A_log, dt_bias (gate_mode 1), or, with ``beta_scale != 1``,
        g = -exp(A_log) * softplus(a + dt_bias) and beta = beta_scale * sigmoid(b) in float32 (gate_mode 0)."""
        A_log, dt_bias = wide(self.A_log), wide(self.dt_bias)
        if self.config.beta_scale == 1.0:
            return dict(g=a, beta=b, A_log=A_log, dt_bias=dt_bias, gate_mode=1)
        g = -A_log.exp() * F.softplus(wide(a) + dt_bias)
        beta = torch.sigmoid(wide(b)) * self.config.beta_scale
        return dict(g=g, beta=beta, A_log=None, dt_bias=None, gate_mode=0)

    def _output(self, o: Tensor, z: Tensor) -> Tensor:
        o = self.output_norm(o, z)
        return self.output_proj(o.reshape(o.shape[0], self.value_dim))

    def _conv_weight(self) -> Tensor:
        return wide(self.conv1d.weight[:, 0, :])  # [C, W]

    def _varlen_conv(self, mixed: Tensor, cu_seqlens: Tensor, conv_state: Tensor):
        """Causal depthwise conv over packed sequences with per-sequence initial state, then SiLU.

        Gathers each token's W-tap window from table = [conv_state rows (N*(W-1)); x rows (T)] with indices
        computed from cu_seqlens (no data-dependent Python control flow)."""
        T, C, W = mixed.shape[0], mixed.shape[1], self.conv_kernel_size
        N = cu_seqlens.shape[0] - 1
        if T > 0 and W >= 2 and mixed.stride(-1) == 1 and triton_ops.usable(mixed, conv_state, self.conv1d.weight):
            return self._varlen_conv_triton(mixed, cu_seqlens, conv_state)
        dev = mixed.device
        cu = cu_seqlens.to(torch.long)
        starts, ends = cu[:-1], cu[1:]
        state_rows = conv_state.to(mixed.dtype).transpose(1, 2).reshape(N * (W - 1), C)
        table = torch.cat([state_rows, mixed], dim=0)
        base = N * (W - 1)
        tok = torch.arange(T, device=dev)
        seq = (tok[:, None] >= ends[None, :]).sum(1)              # sequence id of each token
        pos = tok - cu[seq]                                       # position inside its sequence
        w = self._conv_weight()
        acc = None if self.conv1d.bias is None else wide(self.conv1d.bias)
        for j in range(W):                                        # static loop over the kernel taps
            rel = pos - (W - 1) + j
            idx = torch.where(rel >= 0, base + tok - (W - 1) + j, seq * (W - 1) + pos + j)
            term = wide(table.index_select(0, idx)) * w[:, j]
            acc = term if acc is None else acc + term
        out = F.silu(acc).to(mixed.dtype)
        # final conv state: the last W-1 inputs of each sequence (from x, or from the initial state)
        lens = ends - starts
        i = torch.arange(W - 1, device=dev)
        rel = lens[:, None] - (W - 1) + i[None, :]                # [N, W-1]
        idx = torch.where(rel >= 0, base + starts[:, None] + rel,
                          torch.arange(N, device=dev)[:, None] * (W - 1) + lens[:, None] + i[None, :])
        new_state = table.index_select(0, idx.reshape(-1)).reshape(N, W - 1, C).transpose(1, 2)
        return out, new_state.contiguous()

    def _varlen_conv_triton(self, mixed: Tensor, cu_seqlens: Tensor, conv_state: Tensor):
        """:meth:`_varlen_conv` on CUDA: the taps in one Triton kernel (no [T, C] gathers per tap); the final
        state gathered from x and the initial state."""
        T, W = mixed.shape[0], self.conv_kernel_size
        out = triton_ops.varlen_conv(mixed, cu_seqlens, conv_state, self.conv1d.weight[:, 0, :], self.conv1d.bias)
        cu = cu_seqlens.to(torch.long)
        lens = cu[1:] - cu[:-1]
        rel = lens[:, None] - (W - 1) + torch.arange(W - 1, device=mixed.device)[None, :]     # [N, W-1]
        from_x = mixed.index_select(0, (cu[:-1, None] + rel).clamp(0, T - 1).reshape(-1))   # [N*(W-1), C]
        init = conv_state.to(mixed.dtype).transpose(1, 2)                                     # [N, W-1, C]
        from_s = init.gather(1, (rel + (W - 1)).clamp(0, W - 2)[:, :, None].expand(-1, -1, init.shape[2]))
        new_state = torch.where((rel >= 0)[:, :, None], from_x.reshape(from_s.shape), from_s)
        return out, new_state.transpose(1, 2).contiguous()

    def _step_conv(self, mixed: Tensor, conv_state: Tensor):
        """One token per sequence: mixed [B, C], conv_state [B, C, W-1] -> (out [B, C], new_state)."""
        window = torch.cat([conv_state.to(mixed.dtype), mixed[:, :, None]], dim=2)     # [B, C, W]
        acc = (wide(window) * self._conv_weight()).sum(-1)
        if self.conv1d.bias is not None:
            acc = acc + wide(self.conv1d.bias)
        out = F.silu(acc).to(mixed.dtype)
        return out, window[:, :, 1:].contiguous()

    def init_states(self, n: int, dtype: Optional[torch.dtype] = None, device=None):
        """Zero (conv_state [n, conv_dim, W-1] in the model dtype, rec_state [n, Hv, K, V] float32)."""
        p = self.output_proj.weight
        conv = torch.zeros(n, self.conv_dim, self.conv_kernel_size - 1, dtype=dtype or p.dtype,
                           device=device or p.device)
        rec = torch.zeros(n, self.num_v_heads, self.head_k_dim, self.head_v_dim, dtype=torch.float32,
                          device=device or p.device)
        return conv, rec

    # ---- public API -----------------------------------------------------------------------------
    def prefill(self, x: Tensor, cu_seqlens: Tensor, conv_state: Optional[Tensor] = None,
                rec_state: Optional[Tensor] = None):
        """x [T, hidden] packed, cu_seqlens [N+1] int32 -> (y [T, hidden], conv_state_out, rec_state_out)."""
        N = cu_seqlens.shape[0] - 1
        if conv_state is None or rec_state is None:
            c0, r0 = self.init_states(N, dtype=x.dtype, device=x.device)
            conv_state = c0 if conv_state is None else conv_state
            rec_state = r0 if rec_state is None else rec_state
        mixed, z, b, a = self._project(x)
        mixed, conv_out = self._varlen_conv(mixed, cu_seqlens, conv_state)
        q, k, v = self._split_qkv(mixed)
        gt = self._gate_args(a, b)
        with trusted_values():                   # our own tensors: no value checks (device syncs) on CUDA
            o, rec_out = torch.ops.gdn.prefill(q, k, v, gt["g"], gt["beta"], cu_seqlens, _state32(rec_state),
                                               gt["A_log"], gt["dt_bias"], gate_mode=gt["gate_mode"],
                                               use_qk_l2norm=1, scale=0.0, l2norm_eps=L2NORM_EPS)
        return self._output(o, z), conv_out, rec_out

    def decode(self, x: Tensor, conv_state: Tensor, rec_state: Tensor):
        """x [B, hidden], one token per sequence -> (y [B, hidden], conv_state_out, rec_state_out)."""
        mixed, z, b, a = self._project(x)
        mixed, conv_out = self._step_conv(mixed, conv_state)
        q, k, v = self._split_qkv(mixed)
        gt = self._gate_args(a, b)
        with trusted_values():
            o, rec_out = torch.ops.gdn.decode(q, k, v, gt["g"], gt["beta"], _state32(rec_state), gt["A_log"],
                                              gt["dt_bias"], gate_mode=gt["gate_mode"], use_qk_l2norm=1, scale=0.0,
                                              l2norm_eps=L2NORM_EPS)
        return self._output(o, z), conv_out, rec_out

    def decode_pool(self, x: Tensor, conv_pool: Tensor, rec_pool: Tensor, slots: Tensor) -> Tensor:
        """x [B, hidden]; pools [P, ...] updated in place at int32 ``slots`` [B] (-1: skipped, y row = 0).

        The conv pool is rewritten as ``where(row used, new row, old row)`` (deterministic, no
        data-dependent shapes); untouched rows keep their exact bits."""
        P = conv_pool.shape[0]
        sl = slots.to(torch.long)
        valid = sl >= 0
        mixed, z, b, a = self._project(x)
        mixed, conv_new = self._step_conv(mixed, conv_pool.index_select(0, sl.clamp(min=0)))
        q, k, v = self._split_qkv(mixed)
        gt = self._gate_args(a, b)
        o = torch.ops.gdn.decode_pool_(q, k, v, gt["g"], gt["beta"], rec_pool, slots, gt["A_log"], gt["dt_bias"],
                                       gate_mode=gt["gate_mode"], use_qk_l2norm=1, scale=0.0,
                                       l2norm_eps=L2NORM_EPS)
        match = (sl[None, :] == torch.arange(P, device=sl.device)[:, None]) & valid[None, :]   # [P, B]
        used = match.any(1)
        src = match.to(torch.int32).argmax(1)
        conv_pool.copy_(torch.where(used[:, None, None], conv_new.to(conv_pool.dtype).index_select(0, src),
                                    conv_pool))
        return self._output(o, z)


def _state32(state: Tensor) -> Tensor:
    """The recurrent state as the ops take it: float32 (float64 kept, for reference runs on the CPU)."""
    return state if state.dtype == torch.float64 else state.float()


def check_state_dict(module: nn.Module, state_dict: dict, what: str) -> None:
    """Raise ValueError naming missing/unexpected keys and shape mismatches of ``state_dict`` against ``module``."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    if missing or unexpected:
        raise ValueError(f"{what}: missing keys {missing}, unexpected keys {unexpected}")
    bad = [f"{k} {tuple(state_dict[k].shape)} (expected {tuple(own[k].shape)})" for k in own
           if tuple(state_dict[k].shape) != tuple(own[k].shape)]
    if bad:
        raise ValueError(f"{what}: shape mismatch: " + "; ".join(bad))
