"""ONNX function bodies of ``gdn::GatedDeltaVerify`` and ``gdn::GatedDeltaCommit`` (standard ONNX ops only).

Both pad the ragged per-sequence tokens (at most ``max_draft_tokens`` each) to ``[N, Lmax]`` with a Gather and
run one Scan over the Lmax positions with every sequence's state in the carry. Padding positions are made
no-ops of the recurrence instead of branches: exp(g) = 1 and beta = 0 (verify) or k = delta = 0 (commit) leave
the state bit-exact, so no sequence needs its own loop. The packed outputs are gathered back by token.

- Verify: the state is only read; the outputs are o and the factors (L2-normed k at its Hk heads, delta, g).
  Pool mode reads rows ``slots`` (clipped into [0, P-1]); slot -1 (or any value outside [0, P-1]) gives o and
  factors 0.
- Commit: accepted counts are clamped to [0, T_n] (the contract's rule where values are not checked); dense mode
  returns the new states, pool mode scatters the rows of sequences with a slot in [0, P-1] into the pool.
"""
from __future__ import annotations

from typing import Any

from onnx import TensorProto, helper

from ..spec import STATE_POOL
from .onnx_graph import FLOAT, GraphBuilder, prepare_inputs, repeat_heads, value_info

__all__ = ["verify_body", "commit_body"]

I64 = TensorProto.INT64


def _padding(b: GraphBuilder, cu: str, counts: str | None):
    """Index [N, Lmax] of each padded position into the packed rows (T where padding), its validity mask
    (position < count; count = the sequence length or ``counts`` clamped to it), and per-token (seq, pos)."""
    cu64 = b("Cast", cu, to=I64, hint="cu64")
    n1 = b("Shape", cu64)
    starts = b("Slice", cu64, b.ints(0), b("Sub", n1, b.ints(1)), b.ints(0), hint="starts")
    ends = b("Slice", cu64, b.ints(1), n1, b.ints(0), hint="ends")
    lens = b("Sub", ends, starts, hint="lens")
    # at least one scan step (onnxruntime's Scan refuses zero iterations); a padding step is a no-op
    lmax = b("ReduceMax", b("Concat", lens, b.ints(1), axis=0), b.ints(0), keepdims=1, hint="lmax")
    pos = b("Range", b.scalar_i64(0), b("Squeeze", lmax, b.ints(0)), b.scalar_i64(1), hint="pad_pos")
    limit = lens
    if counts is not None:
        limit = b("Max", b("Min", b("Cast", counts, to=I64), lens), b("Mul", lens, b.scalar_i64(0)), hint="acc")
    valid = b("Less", b("Unsqueeze", pos, b.ints(0)), b("Unsqueeze", limit, b.ints(1)), hint="pad_valid")
    idx = b("Add", b("Unsqueeze", starts, b.ints(1)), b("Unsqueeze", pos, b.ints(0)))
    in_seq = b("Less", b("Unsqueeze", pos, b.ints(0)), b("Unsqueeze", lens, b.ints(1)))
    T = b("Squeeze", b("Slice", cu64, b("Sub", n1, b.ints(1)), n1, b.ints(0)), b.ints(0), hint="T")
    idx = b("Where", in_seq, idx, T, hint="pad_idx")            # padding reads row T, the zero row _pad appends
    tok = b("Range", b.scalar_i64(0), T, b.scalar_i64(1), hint="tok")
    seq = b("ReduceSum", b("Cast", b("GreaterOrEqual", b("Unsqueeze", tok, b.ints(1)), b("Unsqueeze", ends, b.ints(0))),
                                to=I64), b.ints(1), keepdims=0, hint="tok_seq")
    tpos = b("Sub", tok, b("Gather", starts, seq, axis=0), hint="tok_pos")
    return idx, valid, seq, tpos, lmax


def _pad(b: GraphBuilder, x: str, idx: str, valid: str, fill: float) -> str:
    """Packed float32 x [T, ...] -> [N, Lmax, ...], ``fill`` at invalid positions."""
    zero_row = b("ConstantOfShape", b("Concat", b.ints(1), b("Shape", x, start=1), axis=0),
                 value=helper.make_tensor("zero", FLOAT, [1], [0.0]))
    g = b("Gather", b("Concat", x, zero_row, axis=0), idx, axis=0)     # [N, Lmax, ...]
    return b("Where", _expand_mask(b, valid, g), g, b.scalar_f(fill))


def _expand_mask(b: GraphBuilder, mask: str, like: str) -> str:
    """mask [N, Lmax] -> broadcastable to like [N, Lmax, ...] (trailing 1s)."""
    extra = b("Sub", b("Size", b("Shape", like)), b.scalar_i64(2))
    ones = b("ConstantOfShape", b("Unsqueeze", extra, b.ints(0)), value=helper.make_tensor("one", I64, [1], [1]))
    return b("Reshape", mask, b("Concat", b("Shape", mask), ones, axis=0))


def _scan_major(b: GraphBuilder, x: str, rank: int) -> str:
    return b("Transpose", x, perm=[1, 0] + list(range(2, rank)))


def _unpad(b: GraphBuilder, y: str, seq: str, tpos: str, lmax: str) -> str:
    """Scan output [Lmax, N, ...] -> packed [T, ...] (token of sequence seq at position tpos)."""
    rank = 4
    yn = b("Transpose", y, perm=[1, 0] + list(range(2, rank)))        # [N, Lmax, Hv, D]
    flat = b("Reshape", yn, b("Concat", b.ints(-1), b("Shape", yn, start=2), axis=0))
    return b("Gather", flat, b("Add", b("Mul", seq, b("Squeeze", lmax, b.ints(0))), tpos), axis=0)


def _rows(b: GraphBuilder, state: str, slots: str):
    """Pool rows of the sequences (slots clipped into [0, P-1]) and whether each slot is in [0, P-1]."""
    s64 = b("Cast", slots, to=I64)
    P = b("Squeeze", b("Shape", state, start=0, end=1), b.ints(0))
    ok = b("And", b("GreaterOrEqual", s64, b.scalar_i64(0)), b("Less", s64, P), hint="slot_ok")
    rows = b("Min", b("Max", s64, b.scalar_i64(0)), b("Sub", P, b.scalar_i64(1)), hint="rows")
    return rows, ok


def _step_graph(b: GraphBuilder, verify: bool):
    """Scan body. Verify: (S, q, k, v, eg, beta) -> (S, o, delta); commit: (S, k, delta, eg) -> S."""
    sb = b.sub()
    m2, m1, m21 = sb.ints(-2), sb.ints(-1), sb.ints(-2, -1)
    S = sb.name("S")
    if verify:
        q, k, v, eg, bt = (sb.name(n) for n in ("q_t", "k_t", "v_t", "eg_t", "b_t"))
        S1 = sb("Mul", S, sb("Unsqueeze", eg, m21))
        kv = sb("MatMul", sb("Unsqueeze", k, m2), S1)                           # [N, Hv, 1, V]
        delta = sb("Mul", sb("Sub", sb("Unsqueeze", v, m2), kv), sb("Unsqueeze", bt, m21), hint="delta")
        S2 = sb("Add", S1, sb("MatMul", sb("Unsqueeze", k, m1), delta))
        o = sb("Squeeze", sb("MatMul", sb("Unsqueeze", q, m2), S2), m2, hint="o_t")
        S_out = sb("Identity", S2, hint="S_carry")
        d_out = sb("Squeeze", delta, m2, hint="delta_t")
        ins = [value_info(S, 4)] + [value_info(x, r) for x, r in ((q, 3), (k, 3), (v, 3), (eg, 2), (bt, 2))]
        return helper.make_graph(sb.nodes, "gdn_verify_step", ins,
                                 [value_info(S_out, 4), value_info(o, 3), value_info(d_out, 3)])
    k, d, eg = (sb.name(n) for n in ("k_t", "d_t", "eg_t"))
    S2 = sb("Add", sb("Mul", S, sb("Unsqueeze", eg, m21)),
            sb("MatMul", sb("Unsqueeze", k, m1), sb("Unsqueeze", d, m2)), hint="S_carry")
    ins = [value_info(S, 4)] + [value_info(x, r) for x, r in ((k, 3), (d, 3), (eg, 2))]
    return helper.make_graph(sb.nodes, "gdn_commit_step", ins, [value_info(S2, 4)])


def verify_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> list[str]:
    """o, commit_k, commit_delta, commit_g (o in float32; the caller casts it like q)."""
    q, k_hat, v, g, beta = prepare_inputs(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                          ins.get("A_log"), ins.get("dt_bias"), attrs)
    qe, ke = repeat_heads(b, q, v), repeat_heads(b, k_hat, v)
    idx, valid, seq, tpos, lmax = _padding(b, ins["cu_seqlens"], None)
    state = b("Cast", ins["state"], to=FLOAT, hint="state_f")
    if int(attrs["state_mode"]) == STATE_POOL:
        rows, ok = _rows(b, state, ins["slots"])
        S0 = b("Gather", state, rows, axis=0, hint="S0")
    else:
        S0, ok = state, None
    pads = [_pad(b, qe, idx, valid, 0.0), _pad(b, ke, idx, valid, 0.0), _pad(b, v, idx, valid, 0.0),
            _pad(b, b("Exp", g), idx, valid, 1.0), _pad(b, beta, idx, valid, 0.0)]
    xs = [_scan_major(b, x, r) for x, r in zip(pads, (4, 4, 4, 3, 3))]
    _, o_s, d_s = b("Scan", S0, *xs, n_out=3, num_scan_inputs=5, body=_step_graph(b, True))
    o, delta = _unpad(b, o_s, seq, tpos, lmax), _unpad(b, d_s, seq, tpos, lmax)
    ck, cg = k_hat, g
    if ok is not None:   # sequences without a pool row: outputs and factors 0
        keep = b("Gather", ok, seq, axis=0, hint="tok_ok")
        k3, k2 = b("Unsqueeze", keep, b.ints(1, 2)), b("Unsqueeze", keep, b.ints(1))
        zero = b.scalar_f(0.0)
        o, delta, ck = (b("Where", k3, x, zero) for x in (o, delta, ck))
        cg = b("Where", k2, cg, zero)
    return [o, ck, delta, cg]


def commit_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> list[str]:
    """new_state (the pool with the committed rows scattered in, in pool mode)."""
    state = b("Cast", ins["state"], to=FLOAT, hint="state_f")
    d = ins["commit_delta"]
    ke = repeat_heads(b, ins["commit_k"], d)
    idx, valid, _, _, _ = _padding(b, ins["cu_seqlens"], ins["accepted"])
    pool = int(attrs["state_mode"]) == STATE_POOL
    if pool:
        rows, ok = _rows(b, state, ins["slots"])
        S0 = b("Gather", state, rows, axis=0, hint="S0")
    else:
        S0 = state
    pads = [_pad(b, ke, idx, valid, 0.0), _pad(b, d, idx, valid, 0.0), _pad(b, b("Exp", ins["commit_g"]), idx, valid, 1.0)]
    xs = [_scan_major(b, x, r) for x, r in zip(pads, (4, 4, 3))]
    S_fin = b("Scan", S0, *xs, num_scan_inputs=3, body=_step_graph(b, False), hint="S_commit")
    if not pool:
        return [S_fin]
    pos = b("Squeeze", b("NonZero", ok), b.ints(0), hint="ok_pos")
    new_rows = b("Gather", S_fin, pos, axis=0)
    where = b("Unsqueeze", b("Gather", rows, pos, axis=0), b.ints(1))
    return [b("ScatterND", state, where, new_rows, hint="pool_new")]
