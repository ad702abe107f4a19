"""Exact PyTorch reference of the gdn op contract (recurrent and chunked forms).

Inputs follow ``gdn_ops.json``: packed token-major ``[T, H, D]`` with ``cu_seqlens``
for prefill, one token per sequence for decode, state ``[N, Hv, K, V]`` float32.
Precomputed gates (gate_mode 0) take g <= 0 and beta in [0, 2] (beta > 1: OLMo-Hybrid's
negative-eigenvalue delta rule); both forms compute the same update for any beta.
Arithmetic runs in float32, or in float64 when any floating input is float64 (or
``compute_dtype=torch.float64`` is given), which makes this the ground truth the
CUDA kernels and the ONNX function bodies are compared with.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .spec import COMMIT, DECODE, GATE_RAW, PREFILL, SPEC, STATE_POOL, VERIFY
from .validate import validate_commit, validate_decode, validate_prefill, validate_verify

__all__ = ["prefill_ref", "decode_ref", "verify_ref", "commit_ref", "recurrent_scan", "chunked_scan",
           "prepare_inputs"]


def _compute_dtype(tensors: list[torch.Tensor | None], compute_dtype: torch.dtype | None) -> torch.dtype:
    if compute_dtype is not None:
        return compute_dtype
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_inputs(q, k, v, g, beta, A_log, dt_bias, attrs: dict[str, Any], cd: torch.dtype):
    """Gates, L2 norm, scale and GVA expansion: returns q, k [rows, Hv, K], v, g, beta in ``cd``."""
    q, k, v = q.to(cd), k.to(cd), v.to(cd)
    if int(attrs["gate_mode"]) == GATE_RAW:
        g = -A_log.to(cd).exp() * F.softplus(g.to(cd) + dt_bias.to(cd))
        beta = torch.sigmoid(beta.to(cd))
    else:
        g, beta = g.to(cd), beta.to(cd)
    if int(attrs["use_qk_l2norm"]):
        q, k = _l2norm(q, float(attrs["l2norm_eps"])), _l2norm(k, float(attrs["l2norm_eps"]))
    scale = float(attrs["scale"]) or q.shape[-1] ** -0.5
    q = q * scale
    rep = v.shape[1] // q.shape[1]
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    return q, k, v, g, beta


def recurrent_scan(q, k, v, g, beta, S):
    """One sequence, token by token. q,k [L,H,K], v [L,H,V], g,beta [L,H], S [H,K,V] -> (o [L,H,V], S)."""
    o = v.new_empty(v.shape)
    for t in range(q.shape[0]):
        S = S * g[t].exp()[:, None, None]
        kv = torch.einsum("hk,hkv->hv", k[t], S)
        delta = (v[t] - kv) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", q[t], S)
    return o, S


def chunked_scan(q, k, v, g, beta, S, chunk: int = SPEC.chunk_size):
    """One sequence in chunks (WY/UT transform). Same arguments and results as :func:`recurrent_scan`.

    Within a chunk with cumulative log decay G_i and entry state S0:
      delta = (I + L)^-1 (beta*v - beta*exp(G)*k S0),  L_ij = beta_i exp(G_i - G_j) k_i.k_j  (j < i)
      o_i   = exp(G_i) q_i S0 + sum_{j<=i} exp(G_i - G_j) (q_i.k_j) delta_j
      S'    = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j delta_j^T
    """
    L, H = q.shape[0], q.shape[1]
    o = v.new_empty(v.shape)
    idx = torch.arange(chunk, device=q.device)
    for s in range(0, L, chunk):
        e = min(s + chunk, L)
        n = e - s
        qc, kc, vc = (x[s:e].transpose(0, 1) for x in (q, k, v))          # [H, n, D]
        gc, bc = g[s:e].transpose(0, 1), beta[s:e].transpose(0, 1)          # [H, n]
        G = gc.cumsum(-1)
        diff = G[:, :, None] - G[:, None, :]                                # G_i - G_j
        lower = (idx[:n, None] >= idx[None, :n])
        decay = torch.where(lower, diff, diff.new_full((), float("-inf"))).exp()
        strict = decay * (~torch.eye(n, dtype=torch.bool, device=q.device))
        Lm = bc[:, :, None] * (kc @ kc.transpose(1, 2)) * strict
        eye = torch.eye(n, dtype=q.dtype, device=q.device).expand(H, n, n)
        rhs = torch.cat([bc[..., None] * vc, bc[..., None] * G.exp()[..., None] * kc], dim=-1)
        sol = torch.linalg.solve_triangular(eye + Lm, rhs, upper=False, unitriangular=True)
        u, w = sol[..., : vc.shape[-1]], sol[..., vc.shape[-1]:]
        delta = u - w @ S                                                   # [H, n, V]
        oc = G.exp()[..., None] * (qc @ S) + ((qc @ kc.transpose(1, 2)) * decay) @ delta
        o[s:e] = oc.transpose(0, 1)
        GC = G[:, -1]
        S = GC.exp()[:, None, None] * S + (kc * (GC[:, None] - G).exp()[..., None]).transpose(1, 2) @ delta
    return o, S


def prefill_ref(q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None, *,
                gate_mode: int | None = None, use_qk_l2norm: int | None = None, scale: float | None = None,
                l2norm_eps: float | None = None, form: str = "recurrent",
                compute_dtype: torch.dtype | None = None, check_values: bool = True):
    """GatedDeltaPrefill. Returns ``(o [T,Hv,V], final_state [N,Hv,K,V])``.

    ``form`` is ``"recurrent"`` (token by token) or ``"chunked"`` (chunk_size tokens, WY/UT).
    ``o`` is in q's dtype and the final state float32, except when computing in float64 (a float64
    input or ``compute_dtype=torch.float64``): then both are float64.
    """
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                A_log=A_log, dt_bias=dt_bias)
    validate_prefill(args, attrs, check_values=check_values, allow_float64=True)
    if form not in ("recurrent", "chunked"):
        raise ValueError(f"form: expected 'recurrent' or 'chunked', got {form!r}")
    cd = _compute_dtype([q, g, initial_state], compute_dtype)
    qq, kk, vv, gg, bb = prepare_inputs(q, k, v, g, beta, A_log, dt_bias, attrs, cd)
    scan = recurrent_scan if form == "recurrent" else chunked_scan
    o = vv.new_zeros(vv.shape)
    final = initial_state.to(cd).clone()
    cu = cu_seqlens.tolist()
    for n in range(len(cu) - 1):
        s, e = cu[n], cu[n + 1]
        if e > s:
            o[s:e], final[n] = scan(qq[s:e], kk[s:e], vv[s:e], gg[s:e], bb[s:e], final[n])
    out_dtype = q.dtype if cd != torch.float64 else torch.float64
    return o.to(out_dtype), final.to(torch.float64 if cd == torch.float64 else torch.float32)


def decode_ref(q, k, v, g, beta, state, slots=None, A_log=None, dt_bias=None, *,
               gate_mode: int | None = None, use_qk_l2norm: int | None = None, scale: float | None = None,
               l2norm_eps: float | None = None, state_mode: int | None = None,
               compute_dtype: torch.dtype | None = None, check_values: bool = True):
    """GatedDeltaDecode (one token per sequence). Returns ``(o [B,Hv,V], new_state)``.

    Dense mode: ``new_state`` is a new ``[B,Hv,K,V]`` tensor. Pool mode: ``state`` is the pool
    ``[P,Hv,K,V]``; a new tensor equal to the pool after the update is returned (the input pool
    is not modified here; the torch op :func:`gdn_deploy.ops.decode_pool_` updates in place).
    Sequences with slot -1 get o = 0 and leave the pool untouched.
    """
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale,
                         l2norm_eps=l2norm_eps, state_mode=state_mode)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, state=state, slots=slots, A_log=A_log, dt_bias=dt_bias)
    validate_decode(args, attrs, check_values=check_values, allow_float64=True)
    cd = _compute_dtype([q, g, state], compute_dtype)
    qq, kk, vv, gg, bb = prepare_inputs(q, k, v, g, beta, A_log, dt_bias, attrs, cd)
    B = q.shape[0]
    new = state.to(cd).clone()
    o = vv.new_zeros(vv.shape)
    rows = slots.tolist() if int(attrs["state_mode"]) == STATE_POOL else list(range(B))
    for b, r in enumerate(rows):
        if r < 0:
            continue
        ob, new[r] = recurrent_scan(qq[b:b + 1], kk[b:b + 1], vv[b:b + 1], gg[b:b + 1], bb[b:b + 1], new[r])
        o[b] = ob[0]
    out_dtype = q.dtype if cd != torch.float64 else torch.float64
    return o.to(out_dtype), new.to(torch.float64 if cd == torch.float64 else torch.float32)


def verify_ref(q, k, v, g, beta, cu_seqlens, state, slots=None, A_log=None, dt_bias=None, *,
               gate_mode: int | None = None, use_qk_l2norm: int | None = None, scale: float | None = None,
               l2norm_eps: float | None = None, state_mode: int | None = None,
               compute_dtype: torch.dtype | None = None, check_values: bool = True):
    """GatedDeltaVerify. Returns ``(o [T,Hv,V], commit_k [T,Hk,K], commit_delta [T,Hv,V], commit_g [T,Hv])``.

    Sequence n runs its tokens ``cu_seqlens[n]:cu_seqlens[n+1]`` token by token from its state row (row n,
    or pool row ``slots[n]``), which is not modified. The factors are what :func:`commit_ref` replays:
    the unscaled (L2-normed) keys, ``delta_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t)`` and the log decay.
    Slot -1: o and the factors are 0. ``o`` is in q's dtype, the factors float32 (both float64 when
    computing in float64).
    """
    attrs = VERIFY.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale,
                         l2norm_eps=l2norm_eps, state_mode=state_mode)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state=state, slots=slots,
                A_log=A_log, dt_bias=dt_bias)
    validate_verify(args, attrs, check_values=check_values, allow_float64=True)
    cd = _compute_dtype([q, g, state], compute_dtype)
    qq, kk, vv, gg, bb = prepare_inputs(q, k, v, g, beta, A_log, dt_bias, attrs, cd)
    k_hat = k.to(cd)
    if int(attrs["use_qk_l2norm"]):
        k_hat = _l2norm(k_hat, float(attrs["l2norm_eps"]))
    o = vv.new_zeros(vv.shape)
    c_k, c_delta, c_g = k_hat.new_zeros(k_hat.shape), vv.new_zeros(vv.shape), gg.new_zeros(gg.shape)
    cu = cu_seqlens.tolist()
    N = len(cu) - 1
    rows = slots.tolist() if int(attrs["state_mode"]) == STATE_POOL else list(range(N))
    for n, r in enumerate(rows):
        s, e = cu[n], cu[n + 1]
        if r < 0 or e <= s:
            continue
        S = state[r].to(cd)
        for t in range(s, e):
            S = S * gg[t].exp()[:, None, None]
            kv = torch.einsum("hk,hkv->hv", kk[t], S)
            delta = (vv[t] - kv) * bb[t][:, None]
            S = S + kk[t][:, :, None] * delta[:, None, :]
            o[t] = torch.einsum("hk,hkv->hv", qq[t], S)
            c_delta[t], c_g[t] = delta, gg[t]
        c_k[s:e] = k_hat[s:e]
    wide = cd == torch.float64
    fac = torch.float64 if wide else torch.float32
    return (o.to(torch.float64 if wide else q.dtype), c_k.to(fac), c_delta.to(fac), c_g.to(fac))


def commit_ref(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None, *,
               state_mode: int | None = None, check_values: bool = True):
    """GatedDeltaCommit: a new tensor equal to ``state`` with the first ``accepted[n]`` verified tokens of each
    sequence replayed into its row (``S <- exp(g_t) S + k_t delta_t^T``, k repeated to the value heads).

    With ``check_values`` a count outside [0, T_n] is refused (ContractError); without, it is clamped to
    [0, T_n], as the kernels and the ONNX body do. Slot -1 leaves the pool untouched. The input is not
    modified (:func:`gdn_deploy.ops.commit_` updates in place). Float64 in -> float64 arithmetic and result.
    """
    attrs = COMMIT.attrs(state_mode=state_mode)
    args = dict(state=state, commit_k=commit_k, commit_delta=commit_delta, commit_g=commit_g,
                cu_seqlens=cu_seqlens, accepted=accepted, slots=slots)
    validate_commit(args, attrs, check_values=check_values, allow_float64=True)
    cd = _compute_dtype([state, commit_k, commit_delta, commit_g], None)
    rep = commit_delta.shape[1] // commit_k.shape[1]
    kk = commit_k.to(cd).repeat_interleave(rep, dim=1) if rep > 1 else commit_k.to(cd)
    dd, gg = commit_delta.to(cd), commit_g.to(cd)
    new = state.to(cd).clone()
    cu = cu_seqlens.tolist()
    acc = accepted.tolist()
    N = len(cu) - 1
    rows = slots.tolist() if int(attrs["state_mode"]) == STATE_POOL else list(range(N))
    for n, r in enumerate(rows):
        s, e = cu[n], cu[n + 1]
        j = min(max(int(acc[n]), 0), e - s)
        if r < 0 or j == 0:
            continue
        S = new[r]
        for t in range(s, s + j):
            S = S * gg[t].exp()[:, None, None] + kk[t][:, :, None] * dd[t][:, None, :]
        new[r] = S
    return new.to(torch.float64 if cd == torch.float64 else torch.float32)
