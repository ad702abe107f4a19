"""Validation of the gdn op contract (rules and messages from the spec).

Shape and dtype checks are cheap and always run. Value checks (finite inputs,
``cu_seqlens`` monotone and ending at T, slots in range) read tensor values; on a
GPU that is a device-to-host sync, so callers on a hot path can turn them off
(``check_values=False``), e.g. under CUDA-graph capture.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .spec import (DECODE, GATE_RAW, PREFILL, SPEC, STATE_POOL, OpSpec, contract_error)

_IO = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_REF_EXTRA = {torch.float64: "float64"}  # the reference (only) also takes float64 for exact checks


@dataclass(frozen=True)
class Dims:
    T: int   # tokens (prefill) or B sequences (decode)
    N: int   # sequences (prefill) or state rows S (decode: B or pool size P)
    Hk: int
    Hv: int
    K: int
    V: int


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _check_rank(name: str, t: Any, shape: tuple[str, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise contract_error("rank", name=name, rank=len(shape), expected=list(shape), got=type(t).__name__)
    if t.dim() != len(shape):
        raise contract_error("rank", name=name, rank=len(shape), expected=list(shape), got=list(t.shape))


def _check_dim(name: str, t: torch.Tensor, dim: int, symbol: str, want: int, source: str) -> None:
    if t.shape[dim] != want:
        raise contract_error("dim", name=name, dim=dim, symbol=symbol, got=t.shape[dim], want=want, source=source)


def _check_fixed_dtype(name: str, t: torch.Tensor, want: torch.dtype, allow64: bool) -> None:
    if t.dtype != want and not (allow64 and t.dtype == torch.float64 and want == torch.float32):
        raise contract_error("dtype_fixed", name=name, got=_dtype_name(t), want=str(want).replace("torch.", ""))


def _check_finite(name: str, t: torch.Tensor) -> None:
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise contract_error("nonfinite", name=name)


def _collect(op: OpSpec, args: dict[str, Any], attrs: dict[str, Any]) -> None:
    for spec_t in op.inputs:
        present = spec_t.present(attrs)
        given = args.get(spec_t.name) is not None
        if present and not given:
            raise contract_error("missing", name=spec_t.name, condition=spec_t.present_if or "the op runs (it is not optional)")
        if given and not present:
            raise contract_error("unexpected", name=spec_t.name, condition=spec_t.present_if)


def _check_attrs(op: OpSpec, attrs: dict[str, Any]) -> None:
    for a in ("gate_mode", "use_qk_l2norm", "state_mode"):
        if a in op.attributes and attrs[a] not in (0, 1):   # also rejects 0.5 or "1" (int() would accept them)
            raise contract_error("attribute", name=a, why=f"must be 0 or 1, got {attrs[a]!r}")
    if not (math.isfinite(float(attrs["scale"])) and float(attrs["scale"]) >= 0):
        raise contract_error("attribute", name="scale",
                             why=f"must be finite and >= 0 (0 means 1/sqrt(K)), got {attrs['scale']}")
    if not (math.isfinite(float(attrs["l2norm_eps"])) and float(attrs["l2norm_eps"]) > 0):
        raise contract_error("attribute", name="l2norm_eps", why=f"must be finite and > 0, got {attrs['l2norm_eps']}")


def _check_common(op: OpSpec, a: dict[str, Any], attrs: dict[str, Any], allow64: bool) -> tuple[int, int, int, int, int]:
    """q/k/v/g/beta/A_log/dt_bias shapes and dtypes; returns (rows, Hk, Hv, K, V)."""
    q, k, v, g, beta = (a[n] for n in ("q", "k", "v", "g", "beta"))
    shapes = {t.name: t.shape for t in op.inputs}
    for n in ("q", "k", "v", "g", "beta"):
        _check_rank(n, a[n], shapes[n])
    io_ok = {**_IO, **(_REF_EXTRA if allow64 else {})}
    if q.dtype not in io_ok:
        raise contract_error("dtype_io", name="q", got=_dtype_name(q))
    for n in ("k", "v"):
        if a[n].dtype != q.dtype:
            raise contract_error("dtype_io", name=n, got=_dtype_name(a[n]))
    for n in ("g", "beta"):
        if a[n].dtype not in io_ok:
            raise contract_error("dtype_fixed", name=n, got=_dtype_name(a[n]), want="float32, float16 or bfloat16")
    if beta.dtype != g.dtype:   # one gate type G: the kernels read both with g's type
        raise contract_error("dtype_gate", got=_dtype_name(beta), want=_dtype_name(g))
    rows, Hk, K = q.shape
    Hv, V = v.shape[1], v.shape[2]
    if K < 1:   # an empty head (K = 0) has no 1/sqrt(K) scale
        raise contract_error("dim", name="q", dim=2, symbol="K", got=K, want=">= 1", source="head size")
    _check_dim("k", k, 0, shapes["k"][0], rows, "q")
    _check_dim("k", k, 1, "Hk", Hk, "q")
    _check_dim("k", k, 2, "K", K, "q")
    _check_dim("v", v, 0, shapes["v"][0], rows, "q")
    if Hk == 0 or Hv % Hk != 0:
        raise contract_error("gva", Hv=Hv, Hk=Hk)
    for n in ("g", "beta"):
        _check_dim(n, a[n], 0, shapes[n][0], rows, "q")
        _check_dim(n, a[n], 1, "Hv", Hv, "v")
    if int(attrs["gate_mode"]) == GATE_RAW:
        for n in ("A_log", "dt_bias"):
            _check_rank(n, a[n], ("Hv",))
            _check_fixed_dtype(n, a[n], torch.float32, allow64)
            _check_dim(n, a[n], 0, "Hv", Hv, "v")
    return rows, Hk, Hv, K, V


def _check_gate_values(a: dict[str, Any], attrs: dict[str, Any]) -> None:
    names = ("q", "k", "v", "g", "beta") + (("A_log", "dt_bias") if int(attrs["gate_mode"]) == GATE_RAW else ())
    for n in names:
        _check_finite(n, a[n])
    if int(attrs["gate_mode"]) != GATE_RAW and a["g"].numel() and bool((a["g"] > 0).any()):
        raise contract_error("gate_range", name="g", why="log decay must be <= 0 (exp(g) in (0, 1]); "
                             "pass gate_mode=1 to give raw a/b with A_log and dt_bias instead")


def validate_prefill(args: dict[str, Any], attrs: dict[str, Any], *, check_values: bool = True,
                     allow_float64: bool = False) -> Dims:
    """Check prefill inputs against the contract; return the dimensions."""
    _check_attrs(PREFILL, attrs)
    _collect(PREFILL, args, attrs)
    T, Hk, Hv, K, V = _check_common(PREFILL, args, attrs, allow_float64)
    cu, h0 = args["cu_seqlens"], args["initial_state"]
    _check_rank("cu_seqlens", cu, ("N+1",))
    _check_fixed_dtype("cu_seqlens", cu, torch.int32, False)
    if cu.shape[0] < 1:
        raise contract_error("cu_seqlens", why="empty (needs at least [0])", T=T)
    N = cu.shape[0] - 1
    _check_rank("initial_state", h0, ("N", "Hv", "K", "V"))
    _check_fixed_dtype("initial_state", h0, torch.float32, allow_float64)
    for d, (sym, want, src) in enumerate((("N", N, "cu_seqlens"), ("Hv", Hv, "v"), ("K", K, "q"), ("V", V, "v"))):
        _check_dim("initial_state", h0, d, sym, want, src)
    if check_values:
        c = cu.detach().to("cpu", torch.int64)
        if int(c[0]) != 0:
            raise contract_error("cu_seqlens", why=f"starts at {int(c[0])}, not 0", T=T)
        if N > 0 and bool((c[1:] < c[:-1]).any()):
            raise contract_error("cu_seqlens", why=f"decreases (values {c.tolist()[:16]})", T=T)
        if int(c[-1]) != T:
            raise contract_error("cu_seqlens", why=f"ends at {int(c[-1])}", T=T)
        _check_gate_values(args, attrs)
        _check_finite("initial_state", h0)
    return Dims(T, N, Hk, Hv, K, V)


def validate_decode(args: dict[str, Any], attrs: dict[str, Any], *, check_values: bool = True,
                    allow_float64: bool = False) -> Dims:
    """Check decode inputs against the contract; return the dimensions (N = state rows)."""
    _check_attrs(DECODE, attrs)
    _collect(DECODE, args, attrs)
    B, Hk, Hv, K, V = _check_common(DECODE, args, attrs, allow_float64)
    st = args["state"]
    _check_rank("state", st, ("S", "Hv", "K", "V"))
    _check_fixed_dtype("state", st, torch.float32, allow_float64)
    pool = int(attrs["state_mode"]) == STATE_POOL
    if not pool:
        _check_dim("state", st, 0, "B", B, "q")
    for d, (sym, want, src) in enumerate((("Hv", Hv, "v"), ("K", K, "q"), ("V", V, "v")), start=1):
        _check_dim("state", st, d, sym, want, src)
    P = st.shape[0]
    if pool:
        sl = args["slots"]
        _check_rank("slots", sl, ("B",))
        _check_fixed_dtype("slots", sl, torch.int32, False)
        _check_dim("slots", sl, 0, "B", B, "q")
        if check_values and sl.numel():
            s = sl.detach().to("cpu", torch.int64)
            if bool(((s < -1) | (s >= P)).any()):
                raise contract_error("slots", why=f"value out of range (min {int(s.min())}, max {int(s.max())})", P=P)
            used = s[s >= 0]
            if used.numel() != used.unique().numel():
                raise contract_error("slots", why="two sequences share a slot", P=P)
    if check_values:
        _check_gate_values(args, attrs)
        if not pool:
            _check_finite("state", st)
    return Dims(B, P, Hk, Hv, K, V)


def tolerance_for(dtype: torch.dtype) -> float:
    """Kernel-vs-float64 relative error bound from the spec for an I/O dtype."""
    return SPEC.kernel_tolerance(_IO[dtype])
