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

from .spec import (COMMIT, DECODE, GATE_RAW, PREFILL, SPEC, STATE_POOL, VERIFY, OpSpec, contract_error)

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
    if "scale" not in op.attributes:   # GatedDeltaCommit: state_mode only
        return
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
        _check_cu_values(cu, T)
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
        if check_values:
            _check_slot_values(sl, P)
    if check_values:
        _check_gate_values(args, attrs)
        if not pool:
            _check_finite("state", st)
    return Dims(B, P, Hk, Hv, K, V)


def _check_cu_values(cu: torch.Tensor, T: int) -> torch.Tensor:
    """cu_seqlens starts at 0, never decreases, ends at T; returns the values (int64, CPU)."""
    c = cu.detach().to("cpu", torch.int64)
    if int(c[0]) != 0:
        raise contract_error("cu_seqlens", why=f"starts at {int(c[0])}, not 0", T=T)
    if c.shape[0] > 1 and bool((c[1:] < c[:-1]).any()):
        raise contract_error("cu_seqlens", why=f"decreases (values {c.tolist()[:16]})", T=T)
    if int(c[-1]) != T:
        raise contract_error("cu_seqlens", why=f"ends at {int(c[-1])}", T=T)
    return c


def _check_slot_values(sl: torch.Tensor, P: int) -> None:
    if not sl.numel():
        return
    s = sl.detach().to("cpu", torch.int64)
    if bool(((s < -1) | (s >= P)).any()):
        raise contract_error("slots", why=f"value out of range (min {int(s.min())}, max {int(s.max())})", P=P)
    used = s[s >= 0]
    if used.numel() != used.unique().numel():
        raise contract_error("slots", why="two sequences share a slot", P=P)


def _check_cu_shape(cu: Any, T: int) -> int:
    """cu_seqlens rank, dtype and length; returns N."""
    _check_rank("cu_seqlens", cu, ("N+1",))
    _check_fixed_dtype("cu_seqlens", cu, torch.int32, False)
    if cu.shape[0] < 1:
        raise contract_error("cu_seqlens", why="empty (needs at least [0])", T=T)
    return cu.shape[0] - 1


def _check_state(name: str, st: Any, rows: int | None, rows_src: str, Hv: int, K: int, V: int,
                 allow64: bool) -> int:
    """A float32 state [S, Hv, K, V] (S = rows when given); returns S."""
    _check_rank(name, st, ("S", "Hv", "K", "V"))
    _check_fixed_dtype(name, st, torch.float32, allow64)
    if rows is not None:
        _check_dim(name, st, 0, "N", rows, rows_src)
    for d, (sym, want, src) in enumerate((("Hv", Hv, "v"), ("K", K, "q"), ("V", V, "v")), start=1):
        _check_dim(name, st, d, sym, want, src)
    return st.shape[0]


def _check_slots_shape(sl: Any, N: int) -> None:
    _check_rank("slots", sl, ("N",))
    _check_fixed_dtype("slots", sl, torch.int32, False)
    _check_dim("slots", sl, 0, "N", N, "cu_seqlens")


def validate_verify(args: dict[str, Any], attrs: dict[str, Any], *, check_values: bool = True,
                    allow_float64: bool = False) -> Dims:
    """Check GatedDeltaVerify inputs against the contract; return the dimensions (N = sequences)."""
    _check_attrs(VERIFY, attrs)
    _collect(VERIFY, args, attrs)
    T, Hk, Hv, K, V = _check_common(VERIFY, args, attrs, allow_float64)
    cu, st = args["cu_seqlens"], args["state"]
    N = _check_cu_shape(cu, T)
    pool = int(attrs["state_mode"]) == STATE_POOL
    P = _check_state("state", st, None if pool else N, "cu_seqlens", Hv, K, V, allow_float64)
    if pool:
        _check_slots_shape(args["slots"], N)
    if check_values:
        _check_draft_lengths(_check_cu_values(cu, T))
        if pool:
            _check_slot_values(args["slots"], P)
        _check_gate_values(args, attrs)
        if not pool:
            _check_finite("state", st)
    return Dims(T, N, Hk, Hv, K, V)


def _check_draft_lengths(c: torch.Tensor) -> None:
    lens = c[1:] - c[:-1]
    if lens.numel() and int(lens.max()) > SPEC.max_draft_tokens:
        n = int(lens.argmax())
        raise contract_error("draft_len", n=n, got=int(lens[n]), max=SPEC.max_draft_tokens)


def validate_commit(args: dict[str, Any], attrs: dict[str, Any], *, check_values: bool = True,
                    allow_float64: bool = False) -> Dims:
    """Check GatedDeltaCommit inputs against the contract; return the dimensions (N = sequences).

    With ``check_values`` an accepted count outside [0, T_n] is refused; without, the op clamps it."""
    _check_attrs(COMMIT, attrs)
    _collect(COMMIT, args, attrs)
    ck, cd, cg = args["commit_k"], args["commit_delta"], args["commit_g"]
    _check_rank("commit_k", ck, ("T", "Hk", "K"))
    _check_rank("commit_delta", cd, ("T", "Hv", "V"))
    _check_rank("commit_g", cg, ("T", "Hv"))
    for n in ("commit_k", "commit_delta", "commit_g"):
        _check_fixed_dtype(n, args[n], torch.float32, allow_float64)
    T, Hk, K = ck.shape
    Hv, V = cd.shape[1], cd.shape[2]
    _check_dim("commit_delta", cd, 0, "T", T, "commit_k")
    _check_dim("commit_g", cg, 0, "T", T, "commit_k")
    _check_dim("commit_g", cg, 1, "Hv", Hv, "commit_delta")
    if Hk == 0 or Hv % Hk != 0:
        raise contract_error("gva", Hv=Hv, Hk=Hk)
    cu, acc = args["cu_seqlens"], args["accepted"]
    N = _check_cu_shape(cu, T)
    pool = int(attrs["state_mode"]) == STATE_POOL
    P = _check_state("state", args["state"], None if pool else N, "cu_seqlens", Hv, K, V, allow_float64)
    _check_rank("accepted", acc, ("N",))
    _check_fixed_dtype("accepted", acc, torch.int32, False)
    _check_dim("accepted", acc, 0, "N", N, "cu_seqlens")
    if pool:
        _check_slots_shape(args["slots"], N)
    if check_values:
        c = _check_cu_values(cu, T)
        a = acc.detach().to("cpu", torch.int64)
        lens = c[1:] - c[:-1]
        bad = ((a < 0) | (a > lens)).nonzero().flatten()
        if bad.numel():
            n = int(bad[0])
            raise contract_error("accepted", why=f"sequence {n} accepts {int(a[n])} of its {int(lens[n])} tokens")
        if pool:
            _check_slot_values(args["slots"], P)
    return Dims(T, N, Hk, Hv, K, V)


def tolerance_for(dtype: torch.dtype) -> float:
    """Kernel-vs-float64 relative error bound from the spec for an I/O dtype."""
    return SPEC.kernel_tolerance(_IO[dtype])
