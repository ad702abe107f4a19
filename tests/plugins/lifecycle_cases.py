"""Cases for ``gdn_plugin_lifecycle`` (plugins_cpp/lifecycle): inputs in their runtime dtypes and the float64
reference outputs, written as ``case.txt`` + raw binary files, so the one PyTorch float64 reference serves torch,
onnxruntime and the plugins alike.

The reference sees exactly the values the plugin sees (the low-precision inputs upcast to float64). Outputs the
harness writes back (``got_<phase>_<name>.bin``) are read with :func:`read_output`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from conftest import call_decode_ref, call_prefill_ref, make_decode_inputs, make_prefill_inputs
from gdn_deploy.reference import commit_ref, verify_ref
from gdn_deploy.spec import COMMIT, DECODE, PREFILL, SPEC, VERIFY

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}
STATE_TOL_DECODE = 1e-4   # the decode state is float32 arithmetic from the same inputs whatever the I/O dtype
FACTOR_TOL = 1e-4         # verify's commit factors: float32 arithmetic from the same inputs, like the state
PHASES = ("build", "runtime", "graph")

# Symbolic shapes of each tensor; symbols are the dynamic dims (T, N, B, P), the rest are the case's head sizes.
_SHAPES = {"q": "X,Hk,K", "k": "X,Hk,K", "v": "X,Hv,V", "g": "X,Hv", "beta": "X,Hv", "cu_seqlens": "N+1",
           "initial_state": "N,Hv,K,V", "final_state": "N,Hv,K,V", "A_log": "Hv", "dt_bias": "Hv", "o": "X,Hv,V",
           "slots": "X", "state": "S,Hv,K,V", "new_state": "S,Hv,K,V", "commit_k": "X,Hk,K",
           "commit_delta": "X,Hv,V", "commit_g": "X,Hv", "accepted": "N"}


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: str            # e.g. "T,2,64" or "N+1"
    value: torch.Tensor   # inputs: the runtime values; outputs: the float64 reference


@dataclass
class Case:
    name: str
    op: str
    fields: dict[str, int | float]          # node attributes that differ from the spec defaults
    dims: dict[str, tuple[int, int, int]]    # symbol -> (value, profile min, profile max)
    inputs: list[Tensor]
    outputs: list[Tensor]
    tolerance: dict[str, float]
    alias: bool = False
    notes: list[str] = field(default_factory=list)


def _shape(name: str, X: str, S: str, heads: dict[str, int]) -> str:
    toks = []
    spec = "N" if name == "slots" and X == "T" else _SHAPES[name]   # verify / commit: one slot per sequence
    for t in spec.split(","):
        t = {"X": X, "S": S}.get(t, t)
        toks.append(str(heads[t]) if t in heads else t)
    return ",".join(toks)


def _non_default(op, attrs: dict) -> dict[str, int | float]:
    full = op.attrs(**attrs)
    defaults = op.attrs()
    return {k: v for k, v in full.items() if k in attrs and v != defaults[k]}


def _runtime_inputs(inp: dict, io: str, gate: str) -> dict[str, torch.Tensor]:
    out = {}
    for n, t in inp.items():
        if n in ("q", "k", "v"):
            out[n] = t.to(DTYPES[io])
        elif n in ("g", "beta"):
            out[n] = t.to(DTYPES[gate])        # g and beta share the gate dtype G
        elif n in ("cu_seqlens", "slots", "accepted"):
            out[n] = t.to(torch.int32)
        else:
            out[n] = t.to(torch.float32)
    return out


def _as_f64(feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: (t.double() if t.is_floating_point() else t) for n, t in feed.items()}


def _dtype_name(t: torch.Tensor) -> str:
    return next(k for k, v in DTYPES.items() if v == t.dtype)


def prefill_case(gen, name: str, seqlens: list[int], *, Hk: int, Hv: int, K: int, V: int, io: str, gate: str,
                 gate_mode: int = 0, use_qk_l2norm: int = 0, **attrs) -> Case:
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm)
    full = dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, **attrs)
    feed = _runtime_inputs(inp, io, gate)
    o, final = call_prefill_ref(_as_f64(feed), **full)
    T, N = sum(seqlens), len(seqlens)
    heads = {"Hk": Hk, "Hv": Hv, "K": K, "V": V}
    names = PREFILL.input_names(PREFILL.attrs(**full))
    tol = SPEC.kernel_tolerance(io)
    return Case(name, PREFILL.name, _non_default(PREFILL, full),
                {"T": (T, 1, max(T, 256)), "N": (N, 1, max(N, 8))},
                [Tensor(n, _dtype_name(feed[n]), _shape(n, "T", "N", heads), feed[n]) for n in names],
                [Tensor("o", io, _shape("o", "T", "N", heads), o),
                 Tensor("final_state", "float32", _shape("final_state", "T", "N", heads), final)],
                {"o": tol, "final_state": tol})


def decode_case(gen, name: str, B: int, *, Hk: int, Hv: int, K: int, V: int, io: str, gate: str,
                gate_mode: int = 0, use_qk_l2norm: int = 0, pool: int | None = None, skip: tuple[int, ...] = (),
                alias: bool = False, **attrs) -> Case:
    inp = make_decode_inputs(gen, B, Hk, Hv, K, V, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, pool_size=pool)
    for b in skip:
        inp["slots"][b] = -1
    state_mode = 1 if pool is not None else 0
    full = dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, state_mode=state_mode, **attrs)
    feed = _runtime_inputs(inp, io, gate)
    o, new = call_decode_ref(_as_f64(feed), **full)
    heads = {"Hk": Hk, "Hv": Hv, "K": K, "V": V}
    S = "P" if pool is not None else "B"
    dims = {"B": (B, 1, max(B, 16))}
    if pool is not None:
        dims["P"] = (pool, 1, max(pool, 32))
    names = DECODE.input_names(DECODE.attrs(**full))
    return Case(name, DECODE.name, _non_default(DECODE, full), dims,
                [Tensor(n, _dtype_name(feed[n]), _shape(n, "B", S, heads), feed[n]) for n in names],
                [Tensor("o", io, _shape("o", "B", S, heads), o),
                 Tensor("new_state", "float32", _shape("new_state", "B", S, heads), new)],
                {"o": SPEC.kernel_tolerance(io), "new_state": STATE_TOL_DECODE}, alias=alias)


def _speculative_inputs(gen, lens, *, Hk, Hv, K, V, gate_mode, use_qk_l2norm, pool, skip):
    """Verify inputs (float64) for sequences of ``lens`` drafted tokens: a dense state, or a pool of ``pool`` rows
    with the sequences in random distinct slots (``skip``: those get slot -1)."""
    d = make_prefill_inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm,
                            **({"beta_range": (0.0, 2.0)} if gate_mode == 0 else {}))
    dense = d.pop("initial_state")
    if pool is None:
        d["state"] = dense
    else:
        slots = torch.randperm(pool, generator=gen)[:len(lens)].to(torch.int32)
        state = 0.5 * torch.randn(pool, Hv, K, V, generator=gen, dtype=torch.float64)
        state[slots.long()] = dense
        for n in skip:
            slots[n] = -1
        d["state"], d["slots"] = state, slots
    return d


def _spec_dims(lens, pool) -> dict[str, tuple[int, int, int]]:
    T, N = sum(lens), len(lens)
    dims = {"T": (T, 1, max(T, 64)), "N": (N, 1, max(N, 16))}
    if pool is not None:
        dims["P"] = (pool, 1, max(pool, 32))
    return dims


def verify_case(gen, name: str, lens: list[int], *, Hk: int, Hv: int, K: int, V: int, io: str, gate: str,
                gate_mode: int = 0, use_qk_l2norm: int = 0, pool: int | None = None, skip: tuple[int, ...] = (),
                **attrs) -> Case:
    """GatedDeltaVerify: ragged drafts (``lens`` tokens per sequence, 0 allowed) from a dense state or a pool."""
    inp = _speculative_inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm,
                              pool=pool, skip=skip)
    full = dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, state_mode=int(pool is not None), **attrs)
    feed = _runtime_inputs(inp, io, gate)
    names = VERIFY.input_names(VERIFY.attrs(**full))
    o, ck, cd, cg = verify_ref(*(_as_f64(feed).get(n) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state",
                                                                 "slots", "A_log", "dt_bias")), **full)
    heads = {"Hk": Hk, "Hv": Hv, "K": K, "V": V}
    S = "P" if pool is not None else "N"
    return Case(name, VERIFY.name, _non_default(VERIFY, full), _spec_dims(lens, pool),
                [Tensor(n, _dtype_name(feed[n]), _shape(n, "T", S, heads), feed[n]) for n in names],
                [Tensor("o", io, _shape("o", "T", S, heads), o),
                 *(Tensor(n, "float32", _shape(n, "T", S, heads), t)
                   for n, t in (("commit_k", ck), ("commit_delta", cd), ("commit_g", cg)))],
                {"o": SPEC.kernel_tolerance(io), "commit_k": FACTOR_TOL, "commit_delta": FACTOR_TOL,
                 "commit_g": FACTOR_TOL})


def commit_case(gen, name: str, lens: list[int], accepted: list[int], *, Hk: int, Hv: int, K: int, V: int,
                pool: int | None = None, skip: tuple[int, ...] = (), alias: bool = False) -> Case:
    """GatedDeltaCommit of float32 factors (what a float32 verify returns) with ``accepted`` counts per sequence;
    counts outside [0, T_n] are clamped (the kernels do not check values), and so is the reference."""
    inp = _speculative_inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=0, use_qk_l2norm=1, pool=pool, skip=skip)
    sm = int(pool is not None)
    _, ck, cd, cg = verify_ref(*(inp.get(n) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "slots",
                                                       "A_log", "dt_bias")), use_qk_l2norm=1, state_mode=sm)
    feed = {"state": inp["state"].float(), "commit_k": ck.float(), "commit_delta": cd.float(),
            "commit_g": cg.float(), "cu_seqlens": inp["cu_seqlens"].to(torch.int32),
            "accepted": torch.tensor(accepted, dtype=torch.int32)}
    if pool is not None:
        feed["slots"] = inp["slots"].to(torch.int32)
    f64 = _as_f64(feed)
    new = commit_ref(f64["state"], f64["commit_k"], f64["commit_delta"], f64["commit_g"], f64["cu_seqlens"],
                     f64["accepted"], f64.get("slots"), state_mode=sm, check_values=False)
    heads = {"Hk": Hk, "Hv": Hv, "K": K, "V": V}
    S = "P" if pool is not None else "N"
    names = COMMIT.input_names(COMMIT.attrs(state_mode=sm))
    return Case(name, COMMIT.name, _non_default(COMMIT, {"state_mode": sm}), _spec_dims(lens, pool),
                [Tensor(n, _dtype_name(feed[n]), _shape(n, "T", S, heads), feed[n]) for n in names],
                [Tensor("new_state", "float32", _shape("new_state", "T", S, heads), new)],
                {"new_state": STATE_TOL_DECODE}, alias=alias)


def default_cases(gen) -> list[Case]:
    """Prefill: ragged with empty sequences and lengths around the 64-token chunk, GVA, raw gates, fp32 / bf16 /
    fp16 I/O with matching or float32 gates, a long sequence on few heads (context parallel). Decode: dense, and a pool with slot -1 updated in place (aliased
    output) or copied (no aliasing). Verify: ragged drafts (0, 1 and 16 tokens), dense and pool with slot -1, raw
    gates, three I/O dtypes. Commit: accept counts 0..T_n, garbage counts (clamped), pool aliased / copied."""
    return [
        prefill_case(gen, "prefill_fp32_ragged_gva", [70, 0, 33, 1, 0, 64], Hk=2, Hv=4, K=64, V=64,
                     io="float32", gate="float32", use_qk_l2norm=1, l2norm_eps=1e-5),
        prefill_case(gen, "prefill_bf16_raw_gates", [0, 65, 63, 1], Hk=2, Hv=4, K=128, V=128,
                     io="bfloat16", gate="bfloat16", gate_mode=1, use_qk_l2norm=1, scale=0.3),
        prefill_case(gen, "prefill_fp16_fp32_gates", [5, 130], Hk=2, Hv=2, K=64, V=128,
                     io="float16", gate="float32"),
        # one long sequence on few heads: the automatic choice is the context-parallel scan (8 segments of 16
        # chunks on a 132-SM H100), its workspace sized from the profile's largest shapes
        prefill_case(gen, "prefill_bf16_context_parallel", [8200], Hk=1, Hv=2, K=128, V=128,
                     io="bfloat16", gate="float32", use_qk_l2norm=1),
        decode_case(gen, "decode_dense_fp32", 5, Hk=2, Hv=4, K=128, V=128, io="float32", gate="float32",
                    use_qk_l2norm=1),
        decode_case(gen, "decode_pool_bf16_aliased", 4, Hk=2, Hv=4, K=64, V=64, io="bfloat16", gate="bfloat16",
                    gate_mode=1, use_qk_l2norm=1, pool=9, skip=(1,), alias=True),
        decode_case(gen, "decode_pool_bf16_copied", 4, Hk=2, Hv=4, K=64, V=64, io="bfloat16", gate="float32",
                    gate_mode=1, use_qk_l2norm=1, pool=9, skip=(0, 3), alias=False),
        verify_case(gen, "verify_dense_fp32_ragged", [1, 4, 0, 16, 3], Hk=2, Hv=4, K=128, V=128, io="float32",
                    gate="float32", use_qk_l2norm=1),
        verify_case(gen, "verify_pool_bf16_raw_gates", [2, 8, 1], Hk=1, Hv=2, K=64, V=128, io="bfloat16",
                    gate="bfloat16", gate_mode=1, use_qk_l2norm=1, pool=7, skip=(1,), scale=0.3),
        verify_case(gen, "verify_dense_fp16_fp32_gates", [5, 1], Hk=2, Hv=2, K=128, V=64, io="float16",
                    gate="float32"),
        commit_case(gen, "commit_dense_every_count", [4, 4, 4, 0, 16], [0, 2, 4, 0, 16], Hk=2, Hv=4, K=128,
                    V=128),
        commit_case(gen, "commit_pool_aliased_clamped", [3, 5, 2, 4], [3, 99, -2, 1], Hk=1, Hv=2, K=64, V=128,
                    pool=9, skip=(3,), alias=True),
        commit_case(gen, "commit_pool_copied", [6, 2], [5, 2], Hk=2, Hv=4, K=64, V=64, pool=5, alias=False),
    ]


def _write(path: Path, t: torch.Tensor) -> None:
    path.write_bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def write_case(root: Path, case: Case) -> Path:
    d = root / case.name
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"op {case.op}"]
    for k, v in case.fields.items():
        lines.append(f"field {k} {'float' if isinstance(v, float) else 'int'} {v!r}")
    if case.alias:
        lines.append("alias 1")
    for sym, (value, lo, hi) in case.dims.items():
        lines.append(f"dim {sym} {value} {lo} {hi}")
    for t in case.inputs:
        _write(d / f"{t.name}.bin", t.value)
        lines.append(f"input {t.name} {t.dtype} {t.shape} {t.name}.bin")
    for t in case.outputs:
        _write(d / f"{t.name}.f64", t.value.double())
        lines.append(f"output {t.name} {t.dtype} {t.shape} {t.name}.f64")
    for n, tol in case.tolerance.items():
        lines.append(f"tolerance {n} {tol!r}")
    (d / "case.txt").write_text("\n".join(lines) + "\n")
    return d


def read_output(case_dir: Path, phase: str, t: Tensor) -> torch.Tensor:
    """What the harness wrote for output ``t`` in ``phase``, shaped like the reference."""
    raw = bytearray((case_dir / f"got_{phase}_{t.name}.bin").read_bytes())
    return torch.frombuffer(raw, dtype=DTYPES[t.dtype]).reshape(t.value.shape)
