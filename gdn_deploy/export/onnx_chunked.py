"""Chunked ONNX function body of ``gdn::GatedDeltaPrefill`` (standard ONNX ops, no Loop per token).

Same math as :func:`gdn_deploy.reference.chunked_scan` and the CUDA kernels: chunks of C = 64
tokens; within a chunk with cumulative log decay G_i (G_C at its end) and entry state S0::

    T      = (I + L)^-1,  L_ij = beta_i exp(G_i - G_j) k_i.k_j  (j < i)
    u      = T diag(beta) v,      w = T diag(beta exp(G)) k
    delta  = u - w S0
    o_i    = exp(G_i) q_i S0 + sum_{j<=i} exp(G_i - G_j) (q_i.k_j) delta_j
    S'     = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j delta_j^T

Layout (details and measurements: docs/onnx_bodies.md):

- **Lanes and steps.** The sequential part is one Scan; each step advances ``L`` lanes by one chunk
  with batched MatMuls over lanes and heads. Sequences are packed next-fit, in cu_seqlens order,
  into lanes of a capacity picked among (longest sequence's chunks) * 2^i to minimise
  steps * (LANE_STEP_OVERHEAD + L): one sequence or equal lengths give one sequence per lane and
  no waste; a long sequence beside short ones shares its lane with them instead of doubling the
  work; next-fit keeps idle lane slots under half. Idle slots hold all-zero chunks (g = 0,
  beta = 0: the identity on the state). Where a lane holds several sequences, a second Scan body
  restarts the lane's state at each sequence's start and saves the final state of each sequence
  that ends before its lane does (an If picks the body).
- **State-free work first:** decays, the triangular inverse T, u, w and the causal decayed q.k
  matrix A for all chunks at once (MatMuls batched over chunks and heads); a step then does
  delta = u - w S0, o = exp(G) (q S0) + A delta, S' = exp(G_C) S0 + k^T (exp(G_C - G) delta): four
  MatMuls on the lanes' chunks, the decays applied to its small operands. Every pass over a
  [chunks, heads, C, C] tensor costs memory bandwidth, so the work before the Scan keeps as few as it can.
- **T without a solver or a 64-step loop:** recursive block inversion of the unit lower triangular
  I + L, ``inv([[A, 0], [C, B]]) = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]`` for blocks of s = 4, ..., 32,
  the blocks C sliced from L; the 4 x 4 diagonal blocks inverted elementwise (their paths sum to
  I - L + L^2 - L^3). Every intermediate is a block of the inverse of a diagonal block of I + L, a
  piece of the exact answer; unlike the nilpotent product (I - L)(I + L^2)(I + L^4)..., no power of
  a 64 x 64 L is formed, so nothing grows combinatorially when keys align (an all-ones L gives
  entries 0 and +-1).
- **Decays in log space**, as differences G_i - G_j clipped to [EXP_FLOOR, 0] (the upper triangle,
  where they are positive, masked after the Exp), G_C - G_j <= 0 and G_i <= 0: no Exp of a positive
  number for any gate strength (g = -40 per token gives G = -2560 in a chunk). Decays below
  e^EXP_FLOOR ~ 2e-9 count as e^EXP_FLOOR in the decay matrix and as 0 in the decay vectors, and
  entries of T whose total decay is below it are exactly 0: products of small decays would
  otherwise reach denormal floats, which slow onnxruntime's Exp ~10x and its MatMul ~150x (x86
  without flush-to-zero).
- **Padding:** g and beta of padding rows are 0, so padding adds nothing to the state; its q, k, v
  rows are copies of a real row (finite; no real row reads a later one); its o rows are not read.
  Empty sequences keep their initial state; T = 0 skips everything (an If).
"""
from __future__ import annotations

from typing import Any

from onnx import TensorProto, helper

from ..spec import SPEC
from .onnx_graph import FLOAT, INT64, GraphBuilder, prepare_inputs, value_info

__all__ = ["chunked_prefill_body", "packing_model", "CHUNK", "LANE_STEP_OVERHEAD"]

CHUNK = SPEC.chunk_size
EXP_FLOOR = -20.0         # decays exp(x) below e^-20 ~ 2e-9 are taken as 0 or e^-20 (no denormals)
_CAPACITY_FACTORS = tuple(2 ** i for i in range(24))   # lane capacities tried: longest sequence * 2^i
LANE_STEP_OVERHEAD = 0.5  # cost of a Scan step without work, in units of one lane's chunk


def _vec(b: GraphBuilder, scalar: str) -> str:
    return b("Unsqueeze", scalar, b.ints(0))


def _reshape(b: GraphBuilder, x: str, *parts: str, hint: str = "rs") -> str:
    """Reshape to the concatenation of 1-element int64 vectors / constants (allowzero: 0 means 0)."""
    return b("Reshape", x, b("Concat", *parts, axis=0), allowzero=1, hint=hint)


def _zeros(b: GraphBuilder, shape: str, elem: int = FLOAT, hint: str = "zeros") -> str:
    return b("ConstantOfShape", shape, value=helper.make_tensor("z", elem, [1], [0]), hint=hint)


def _stack2(b: GraphBuilder, x: str, y: str) -> str:
    """[n], [n] -> [n, 2] (ScatterND/GatherND indices)."""
    m1 = b.ints(-1)
    return b("Concat", b("Unsqueeze", x, m1), b("Unsqueeze", y, m1), axis=-1)


def _cumsum_i64(b: GraphBuilder, x: str, axis: int, exclusive: int = 0) -> str:
    """CumSum of small non-negative int64 counts through float32 (exact below 2^24; TensorRT's CumSum is float only)."""
    return b("Cast", b("CumSum", b("Cast", x, to=FLOAT), b.scalar_i64(axis), exclusive=exclusive), to=INT64)


def _decay(b: GraphBuilder, x: str, hint: str = "decay") -> str:
    """exp(x) for log decays x, exactly 0 where x < EXP_FLOOR.

    Float32 exp gives denormals below about -87, and products of a few small decays land there too;
    arguments below about -87 make onnxruntime's Exp ~10x slower and denormal operands its MatMul ~150x
    (x86 without flush-to-zero). A dropped term is below e^EXP_FLOOR ~ 2e-9 of the unit term of its row."""
    floor = b.scalar_f(EXP_FLOOR)
    return b("Where", b("GreaterOrEqual", x, floor), b("Exp", b("Max", x, floor)), b.scalar_f(0.0), hint=hint)


def _decay_matrix(b: GraphBuilder, x: str, hint: str = "decay") -> str:
    """exp(clip(x, EXP_FLOOR, 0)) for a large tensor of log decays x (G_i - G_j): three cheap passes.

    Decays below e^EXP_FLOOR ~ 2e-9 come out as e^EXP_FLOOR, not 0 (an absolute error below float32
    resolution next to the unit diagonal term of each row), so no entry is a denormal float and no
    Exp argument is out of range (onnxruntime's Exp takes ~10x longer on those, see :func:`_decay`);
    entries above the diagonal (x >= 0) come out as 1: users mask them."""
    return b("Exp", b("Clip", x, b.scalar_f(EXP_FLOOR), b.scalar_f(0.0)), hint=hint)


def _diagonal_blocks(b: GraphBuilder, x: str, lead: str, s: int) -> str:
    """[..., P, 2s, 2s] -> its two diagonal s x s blocks each, [..., 2P, s, s] (slices)."""
    top = b("Slice", x, b.ints(0, 0), b.ints(s, s), b.ints(-2, -1))
    bottom = b("Slice", x, b.ints(s, s), b.ints(2 * s, 2 * s), b.ints(-2, -1))
    both = b("Concat", b("Unsqueeze", top, b.ints(-3)), b("Unsqueeze", bottom, b.ints(-3)), axis=-3)
    return _reshape(b, both, lead, b.ints(CHUNK // s, s, s))


def _pairs(b: GraphBuilder, x: str, lead: str, pairs: int, tail: tuple[int, ...]) -> tuple[str, str]:
    """[..., 2 * pairs, *tail] -> the even and the odd entries along that axis, each [..., pairs, *tail]."""
    split = _reshape(b, x, lead, b.ints(pairs, 2, *tail))
    even, odd = b("Split", split, b.ints(1, 1), axis=-1 - len(tail), n_out=2)
    return b("Squeeze", even, b.ints(-1 - len(tail))), b("Squeeze", odd, b.ints(-1 - len(tail)))


def _inverse_4(b: GraphBuilder, diag4: str, lead: str) -> str:
    """(I - N)^-1 = I + N + N^2 + N^3 of the 4 x 4 diagonal blocks N [..., C/4, 4, 4] (strictly lower parts
    read), elementwise: each entry is its sum of path products (a MatMul per 4 x 4 block is far slower)."""
    flat = _reshape(b, diag4, lead, b.ints(CHUNK // 4, 16))
    n = b("Split", flat, b.ints(*[1] * 16), axis=-1, n_out=16)                  # N_ij = n[4 i + j]
    t20 = b("Add", n[8], b("Mul", n[9], n[4]))
    t31 = b("Add", n[13], b("Mul", n[14], n[9]))
    t30 = b("Add", b("Add", n[12], b("Mul", n[13], n[4])), b("Mul", n[14], t20))
    one = b("ConstantOfShape", b("Shape", n[4]), value=helper.make_tensor("one", FLOAT, [1], [1.0]))
    zero = _zeros(b, b("Shape", n[4]))
    rows = [one, zero, zero, zero, n[4], one, zero, zero, t20, n[9], one, zero, t30, t31, n[14], one]
    return _reshape(b, b("Concat", *rows, axis=-1), lead, b.ints(CHUNK // 4, 4, 4))


def _floor_mask(b: GraphBuilder, rows: str, cols: str) -> str:
    """1.0 where the total decay exp(G_i - G_j) >= e^EXP_FLOOR, else 0: rows G_i [..., n], cols G_j [..., m]."""
    total = b("Sub", b("Unsqueeze", rows, b.ints(-1)), b("Unsqueeze", cols, b.ints(-2)))
    return b("Cast", b("GreaterOrEqual", total, b.scalar_f(EXP_FLOOR)), to=FLOAT)


def _triangular_inverse(b: GraphBuilder, Lneg: str, G: str, lead: str) -> str:
    """T = (I - Lneg)^-1 [..., C, C] for strictly lower Lneg [..., C, C] (entries on and above the diagonal
    are not read); G [..., C] the cumulative log decays, ``lead`` the shape of the leading axes.

    Recursive block inversion of the unit lower triangular I - Lneg: top down, slices give the diagonal
    2s-blocks and their off-diagonal blocks C for s = 32, 16, 8, 4; the 4 x 4 diagonal blocks are
    inverted elementwise (:func:`_inverse_4`); bottom up, each diagonal 2s-block's inverse is
    ``[[A^-1, 0], [B^-1 C A^-1, B^-1]]`` from the inverses A^-1, B^-1 of its s-blocks.
    Every intermediate is a block of the exact inverse of a diagonal block. New blocks are zeroed where
    their total decay exp(G_i - G_j) is below e^EXP_FLOOR: they are sums of products of decays along
    paths j -> i, which multiply to that total, tiny (even denormal) floats otherwise. So each nonzero
    entry of a factor of B^-1 C A^-1 carries a decay >= e^EXP_FLOOR, and their products stay normal floats.
    """
    diag, offs = b("Unsqueeze", Lneg, b.ints(-3)), {}                          # [..., 1, C, C]
    s = CHUNK // 2
    while s >= 4:
        offs[s] = b("Slice", diag, b.ints(s, 0), b.ints(2 * s, s), b.ints(-2, -1), hint=f"C{s}")  # [..., P, s, s]
        diag = _diagonal_blocks(b, diag, lead, s)
        s //= 2
    G4 = _reshape(b, G, lead, b.ints(CHUNK // 4, 4))
    inv = b("Mul", _inverse_4(b, diag, lead), _floor_mask(b, G4, G4), hint="inv_4")   # [..., C/4, 4, 4]
    s = 4
    while s < CHUNK:
        pairs = CHUNK // (2 * s)
        a_inv, b_inv = _pairs(b, inv, lead, pairs, (s, s))
        g_even, g_odd = _pairs(b, G, lead, pairs, (s,))                           # [..., P, s]
        off = b("Mul", b("MatMul", b("MatMul", b_inv, offs[s]), a_inv), _floor_mask(b, g_odd, g_even))
        top = b("Concat", a_inv, _zeros(b, b("Shape", a_inv)), axis=-1)
        bottom = b("Concat", off, b_inv, axis=-1, hint=f"bottom{s}")
        inv = b("Concat", top, bottom, axis=-2, hint=f"inv_{2 * s}")                 # [..., pairs, 2s, 2s]
        s *= 2
    return _reshape(b, inv, lead, b.ints(CHUNK, CHUNK), hint="T_inv")


class _Layout:
    """Where every token goes: lanes, steps, slots (all int64, computed from cu_seqlens)."""

    def __init__(self, b: GraphBuilder, cu: str, n_tokens: str):
        zero, one, c = b.scalar_i64(0), b.scalar_i64(1), b.scalar_i64(CHUNK)
        self.starts = b("Slice", cu, b.ints(0), b.ints(-1), b.ints(0), hint="seq_start")
        lens = b("Sub", b("Slice", cu, b.ints(1), b.ints(1 << 62), b.ints(0)), self.starts, hint="seq_len")
        self.nchunks = b("Div", b("Add", lens, b.scalar_i64(CHUNK - 1)), c, hint="seq_chunks")
        self.n_seq = b("Squeeze", b("Shape", self.starts), hint="n_seq")
        self.nonempty = b("Greater", lens, zero, hint="nonempty")
        self.lane, self.lane_start, self.lanes, self.steps = self._pack(b)
        steps1, lanes1 = _vec(b, self.steps), _vec(b, self.lanes)
        self.grid = b("Concat", steps1, lanes1, axis=0, hint="grid")                   # [steps, L]
        self.ne_ids = b("Squeeze", b("NonZero", b("Cast", self.nonempty, to=FLOAT)), b.ints(0), hint="ne_ids")

        # token -> sequence: marks at the start of every non-empty sequence, cumulated
        ne_starts = b("Gather", self.starts, self.ne_ids, axis=0)
        ones_ne = b("ConstantOfShape", b("Shape", self.ne_ids), value=helper.make_tensor("o", FLOAT, [1], [1.0]))
        marks = b("ScatterElements", _zeros(b, _vec(b, n_tokens)), ne_starts, ones_ne, axis=0, hint="seq_marks")
        rank = b("Sub", b("Cast", b("CumSum", marks, b.scalar_i64(0)), to=INT64), one)
        seq = b("Gather", self.ne_ids, rank, axis=0, hint="token_seq")
        tokens = b("Range", zero, n_tokens, one, hint="token_idx")
        pos = b("Sub", tokens, b("Gather", self.starts, seq, axis=0), hint="token_pos")
        step = b("Add", b("Gather", self.lane_start, seq, axis=0), b("Div", pos, c), hint="token_step")
        lane = b("Gather", self.lane, seq, axis=0, hint="token_lane")
        # slot = (step * L + lane) * C + pos % C
        self.token_slot = b("Add", b("Mul", b("Add", b("Mul", step, self.lanes), lane), c), b("Mod", pos, c),
                            hint="token_slot")
        n_slots = _vec(b, b("Mul", b("Mul", self.steps, self.lanes), c))
        self.slot_token = b("ScatterElements", b("Expand", n_tokens, n_slots), self.token_slot, tokens, axis=0,
                            hint="slot_token")                                           # padding -> T (zero row)

        # a lane starts sequence n at step lane_start[n]: reset its state to h0[n] there (0 = no reset)
        ne_at = _stack2(b, b("Gather", self.lane_start, self.ne_ids, axis=0),
                        b("Gather", self.lane, self.ne_ids, axis=0))
        self.reset = b("ScatterND", _zeros(b, self.grid, INT64), ne_at, b("Add", self.ne_ids, one), hint="reset_seq")
        self._finals(b)

    def _pack(self, b: GraphBuilder) -> tuple[str, str, str, str]:
        """Next-fit packing of the sequences, in order, into lanes of a capacity chosen among
        longest * 2^i: returns lane[n], the step lane_start[n] where n starts, the lane count and
        the step count (>= 1: a Scan over 0 steps is an error in onnxruntime). The capacity kept
        minimises steps * (LANE_STEP_OVERHEAD + lanes): lanes = 1 is the plain sequential order."""
        n_caps = len(_CAPACITY_FACTORS)
        longest = b("ReduceMax", b("Concat", b.ints(0), self.nchunks, axis=0), keepdims=0, hint="longest")
        caps = b("Mul", b.const_i64(list(_CAPACITY_FACTORS), [n_caps], hint="cap_factors"), longest, hint="caps")
        lb = b.sub()
        it, cond, lane, fill = lb.name("n"), lb.name("cond"), lb.name("lane"), lb.name("fill")
        c = lb("Gather", self.nchunks, it, axis=0)
        over = lb("Greater", lb("Add", fill, c), caps, hint="lane_full")
        lane2 = lb("Add", lane, lb("Cast", over, to=INT64), hint="lane_next")
        start = lb("Where", over, lb.scalar_i64(0), fill, hint="start_in_lane")
        fill2 = lb("Add", start, c, hint="fill_next")
        outs = [lb("Identity", cond, hint="cond_out"), lane2, fill2,
                lb("Identity", lane2, hint="lane_of_seq"), lb("Identity", start, hint="start_of_seq")]
        body = helper.make_graph(lb.nodes, "gdn_pack_lanes",
                                 [value_info(it, 0, INT64), value_info(cond, 0, TensorProto.BOOL),
                                  value_info(lane, 1, INT64), value_info(fill, 1, INT64)],
                                 [value_info(outs[0], 0, TensorProto.BOOL)]
                                 + [value_info(o, 1, INT64) for o in outs[1:]])
        zeros = _zeros(b, b.ints(n_caps), INT64)
        last_lane, _, lanes_nc, starts_nc = b("Loop", self.n_seq, "", zeros, zeros, n_out=4, body=body)
        per_seq = b("Concat", _vec(b, self.n_seq), b.ints(n_caps), axis=0)
        lanes_nc = b("Reshape", lanes_nc, per_seq, allowzero=1, hint="lane_per_cap")      # [N, caps]
        starts_nc = b("Reshape", starts_nc, per_seq, allowzero=1, hint="start_per_cap")
        ends = b("Add", starts_nc, b("Unsqueeze", self.nchunks, b.ints(1)))
        steps_nc = b("ReduceMax", b("Concat", b("Expand", b.scalar_i64(1), b.ints(1, n_caps)), ends, axis=0),
                     b.ints(0), keepdims=0, hint="steps_per_cap")
        lanes_c = b("Add", last_lane, b.scalar_i64(1), hint="lanes_per_cap")
        cost = b("Mul", b("Cast", steps_nc, to=FLOAT), b("Add", b("Cast", lanes_c, to=FLOAT),
                                                          b.scalar_f(LANE_STEP_OVERHEAD)), hint="pack_cost")
        pick = b("ArgMin", cost, axis=0, keepdims=0, hint="pick")
        return (b("Gather", lanes_nc, pick, axis=1, hint="lane_of_seq"),
                b("Gather", starts_nc, pick, axis=1, hint="lane_start"),
                b("Gather", lanes_c, pick, axis=0, hint="lanes"), b("Gather", steps_nc, pick, axis=0, hint="steps"))

    def _finals(self, b: GraphBuilder) -> None:
        """Which sequences end before their lane does (their final state is saved in the Scan), and where."""
        one = b.scalar_i64(1)
        fill_end = b("Add", self.lane_start, self.nchunks, hint="fill_end")
        next_lane = b("Concat", b("Slice", self.lane, b.ints(1), b.ints(1 << 62), b.ints(0)), _vec(b, self.lanes),
                      axis=0)
        tail = b("Squeeze", b("NonZero", b("Cast", b("Not", b("Equal", next_lane, self.lane)), to=FLOAT)), b.ints(0),
                 hint="lane_tail")                                                        # last sequence of each lane
        lane_fill = b("Gather", b("Gather", fill_end, tail, axis=0), self.lane, axis=0, hint="lane_fill")
        event = b("And", self.nonempty, b("Less", fill_end, lane_fill), hint="ends_inside_lane")
        ev = b("Squeeze", b("NonZero", b("Cast", event, to=FLOAT)), b.ints(0), hint="ev_ids")
        ev_step = b("Sub", b("Gather", fill_end, ev, axis=0), one)
        ev_lane = b("Gather", self.lane, ev, axis=0)
        at = _stack2(b, ev_step, ev_lane)
        ones_ev = b("ConstantOfShape", b("Shape", ev), value=helper.make_tensor("o", INT64, [1], [1]))
        hits = b("ScatterND", _zeros(b, self.grid, INT64), at, ones_ev, hint="ev_grid")  # [steps, L] 0/1
        rank_grid = _cumsum_i64(b, hits, 1, exclusive=1)
        per_step = b("ReduceSum", hits, b.ints(1), keepdims=0)
        self.saved_per_step = b("ReduceMax", b("Concat", b.ints(0), per_step, axis=0), keepdims=0,
                                hint="saved_per_step")
        ev_rank = b("GatherND", rank_grid, at)
        table_shape = b("Concat", _vec(b, self.steps), _vec(b, self.saved_per_step), axis=0)
        self.save_lane = b("ScatterND", _zeros(b, table_shape, INT64), _stack2(b, ev_step, ev_rank), ev_lane,
                           hint="save_lane")                                              # [steps, saved_per_step]
        # final state of sequence n = pool[final_idx[n]], pool = [h0 (N); zero row; lane states (L); saved]
        n_idx = b("Range", b.scalar_i64(0), self.n_seq, one)
        n1 = b("Add", self.n_seq, one)
        idx = b("Where", self.nonempty, b("Add", self.lane, n1), n_idx)
        saved_at = b("Add", b("Add", b("Mul", ev_step, self.saved_per_step), ev_rank), b("Add", n1, self.lanes))
        self.final_idx = b("ScatterElements", idx, ev, saved_at, axis=0, hint="final_idx")


def _scan_body(b: GraphBuilder, h0: str | None):
    """Scan body: one chunk of every lane. State S [L,Hk,r,K,V]; per step q, k [L,Hk,1,C,K], exp(G) and
    exp(G_C - G) [L,Hk,r,C,1], w [L,Hk,r,C,K], A [L,Hk,r,C,C], u [L,Hk,r,C,V], exp(G_C) [L,Hk,r,1,1]. With
    ``h0`` (the initial states plus a zero row, from the outer scope) lanes also restart sequences
    (inputs keep [L,1,1,1,1], h0_row [L]) and save the states of sequences that end there (input
    save_lane [P]; output [P,Hk,r,K,V])."""
    sb = b.sub()
    names = ["S", "q", "eG", "w", "A", "u", "k", "eD", "eGC"] + (["keep", "h0_row", "save_lane"] if h0 else [])
    ins = {n: sb.name(n) for n in names}
    S = ins["S"]
    if h0:
        restart = sb("Gather", h0, sb("Cast", ins["h0_row"], to=INT64), axis=0, hint="h0_rows")
        S = sb("Add", sb("Mul", S, ins["keep"]), restart, hint="S_entry")
    delta = sb("Sub", ins["u"], sb("MatMul", ins["w"], S), hint="delta")                   # [L,Hk,r,C,V]
    o = sb("Add", sb("Mul", sb("MatMul", ins["q"], S), ins["eG"]), sb("MatMul", ins["A"], delta), hint="o_chunk")
    kT = sb("Transpose", ins["k"], perm=[0, 1, 2, 4, 3])
    S1 = sb("Add", sb("Mul", ins["eGC"], S), sb("MatMul", kT, sb("Mul", ins["eD"], delta)), hint="S_exit")
    outs = [value_info(S1, 5), value_info(o, 5)]
    if h0:
        saved = sb("Gather", S1, sb("Cast", ins["save_lane"], to=INT64), axis=0, hint="S_saved")
        outs.append(value_info(saved, 5))
    rank = dict(keep=5, h0_row=1, save_lane=1)
    return helper.make_graph(sb.nodes, "gdn_chunk_step", [value_info(ins[n], rank.get(n, 5)) for n in names], outs)


def _chunks(b: GraphBuilder, q: str, k: str, v: str, g: str, beta: str, cu: str, h0: str) -> tuple[str, str]:
    """The chunked computation for T >= 1 tokens: (o [T, Hv, V], final states [N, Hv, K, V])."""
    n_tokens = b("Squeeze", b("Shape", v, start=0, end=1), hint="n_tokens")
    lay = _Layout(b, cu, n_tokens)
    hk, kd = b("Shape", q, start=1, end=2, hint="Hk"), b("Shape", q, start=2, end=3, hint="K")
    hv, vd = b("Shape", v, start=1, end=2, hint="Hv"), b("Shape", v, start=2, end=3, hint="V")
    rep = b("Div", hv, hk, hint="gva_rep")
    steps1, lanes1, c1, one1 = _vec(b, lay.steps), _vec(b, lay.lanes), b.ints(CHUNK), b.ints(1)

    # gather rows straight into the chunk layout [steps, L, H, C, D] (one Gather per input). Padding
    # reads a zero row for g and beta; for q, k, v any row will do (beta = 0 and g = 0 make padding
    # add nothing, and no real row ever reads a later one)
    slot_token = _reshape(b, lay.slot_token, steps1, lanes1, one1, c1)        # [steps, L, 1, C]
    last = b("Sub", n_tokens, b.scalar_i64(1))

    def rows(h: str, tok: str) -> str:
        heads = _reshape(b, b("Range", b.scalar_i64(0), b("Squeeze", h), b.scalar_i64(1)), one1, one1, h, one1)
        return b("Add", b("Mul", tok, b("Squeeze", h)), heads)                 # [steps, L, H, C]

    def gather(x: str, h: str, tok: str, d: str | None) -> str:
        flat = b("Reshape", x, b("Concat", b.ints(-1), d, axis=0) if d else b.ints(-1))
        return b("Gather", flat, rows(h, tok), axis=0)

    tok_qkv = b("Min", slot_token, last)
    qs = b("Unsqueeze", gather(q, hk, tok_qkv, kd), b.ints(3), hint="q_chunks")   # [steps,L,Hk,1,C,K]
    ks = b("Unsqueeze", gather(k, hk, tok_qkv, kd), b.ints(3), hint="k_chunks")
    vs = _reshape(b, gather(v, hv, tok_qkv, vd), steps1, lanes1, hk, rep, c1, vd, hint="v_chunks")

    def gates(x: str, hint: str) -> str:                                        # [steps,L,Hk,r,C]
        padded = b("Concat", x, _zeros(b, b("Concat", one1, hv, axis=0)), axis=0)
        return _reshape(b, gather(padded, hv, slot_token, None), steps1, lanes1, hk, rep, c1, hint=hint)

    gs, bs = gates(g, "g_chunks"), gates(beta, "beta_chunks")

    # decays, from the cumulative log decay G, only ever as exp(x <= 0)
    G = b("CumSum", gs, b.scalar_i64(-1), hint="G")
    G_end = b("Slice", G, b.ints(CHUNK - 1), b.ints(CHUNK), b.ints(-1), hint="G_C")
    Gi, Gj = b("Unsqueeze", G, b.ints(-1)), b("Unsqueeze", G, b.ints(-2))
    decay = _decay_matrix(b, b("Sub", Gi, Gj))                                # [..,C,C], 1 above the diagonal
    G_end1 = b("Unsqueeze", G_end, b.ints(-1))                                 # [..,1,1]
    eG = _decay(b, Gi, hint="exp_G")                                           # [..,C,1]
    eD = _decay(b, b("Sub", G_end1, Gi), hint="exp_GC_minus_G")                # [..,C,1]
    eGC = _decay(b, G_end1, hint="exp_GC")

    # within-chunk matrices (no state): A, T = (I + L)^-1, u, w
    kT = b("Transpose", ks, perm=[0, 1, 2, 3, 5, 4], hint="kT")                # [..,Hk,1,K,C] (MatMul operand only)
    causal = b("Constant", value=helper.make_tensor("c", FLOAT, [CHUNK, CHUNK], [
        1.0 if i >= j else 0.0 for i in range(CHUNK) for j in range(CHUNK)]), hint="causal")
    A = b("Mul", b("Mul", b("MatMul", qs, kT), causal), decay, hint="A_qk")  # causal exp(G_i-G_j) q_i.k_j
    # -L, L_ij = beta_i exp(G_i - G_j) k_i.k_j (read below the diagonal only)
    Lneg = b("Mul", b("Mul", b("MatMul", ks, kT), decay), b("Unsqueeze", b("Neg", bs), b.ints(-1)), hint="L_neg")
    T = _triangular_inverse(b, Lneg, G, b("Shape", decay, start=0, end=-2))
    T_beta = b("Mul", T, b("Unsqueeze", bs, b.ints(-2)), hint="T_beta")
    u = b("MatMul", T_beta, vs, hint="u")                                      # T diag(beta) v
    w = b("MatMul", b("Mul", T_beta, b("Transpose", eG, perm=[0, 1, 2, 3, 5, 4])), ks, hint="w")

    # the sequential part: one Scan step per chunk position, all lanes at once
    h0z = b("Concat", _reshape(b, h0, b("Shape", h0, start=0, end=1), hk, rep, kd, vd),
            _zeros(b, b("Concat", one1, hk, rep, kd, vd, axis=0)), axis=0, hint="h0_zero_row")
    h0_row = b("Where", b("Greater", lay.reset, b.scalar_i64(0)), b("Sub", lay.reset, b.scalar_i64(1)),
               lay.n_seq, hint="h0_row")                                       # [steps, L]; N = zero row
    S_init = b("Gather", h0z, b("Gather", h0_row, b.scalar_i64(0), axis=0), axis=0, hint="S_init")
    per_step = [qs, eG, w, A, u, ks, eD, eGC]
    lean = b.sub()
    S_a, o_a = lean("Scan", S_init, *per_step, n_out=2, num_scan_inputs=len(per_step), body=_scan_body(b, None))
    no_saved = lean("Unsqueeze", lean("Slice", S_a, b.ints(0), b.ints(0), b.ints(0)), b.ints(0), hint="no_saved")
    restarts = b.sub()
    keep = b("Reshape", b("Cast", b("Equal", lay.reset, b.scalar_i64(0)), to=FLOAT), b.ints(0, 0, 1, 1, 1, 1))
    S_b, o_b, saved_b = restarts("Scan", S_init, *per_step, keep, b("Cast", h0_row, to=FLOAT),
                                 b("Cast", lay.save_lane, to=FLOAT), n_out=3, num_scan_inputs=len(per_step) + 3,
                                 body=_scan_body(b, h0z))
    outs = lambda names: [value_info(n, r) for n, r in zip(names, (5, 6, 6))]  # noqa: E731
    S_lanes, o_rows, saved = b(
        "If", b("Greater", lay.saved_per_step, b.scalar_i64(0)), n_out=3,
        then_branch=helper.make_graph(restarts.nodes, "gdn_lanes_restart", [], outs([S_b, o_b, saved_b])),
        else_branch=helper.make_graph(lean.nodes, "gdn_lanes_one_sequence", [], outs([S_a, o_a, no_saved])))

    # o rows back to tokens: o_rows [steps, L, Hk, r, C, V] read at ((step*L + lane)*Hv + h)*C + i
    slot = b("Unsqueeze", lay.token_slot, b.ints(1))                           # [T, 1]
    heads = b("Unsqueeze", b("Range", b.scalar_i64(0), b("Squeeze", hv), b.scalar_i64(1)), b.ints(0))
    c = b.scalar_i64(CHUNK)
    o_idx = b("Add", b("Mul", b("Add", b("Mul", b("Div", slot, c), b("Squeeze", hv)), heads), c), b("Mod", slot, c))
    o = b("Gather", b("Reshape", o_rows, b("Concat", b.ints(-1), vd, axis=0)), o_idx, axis=0, hint="o_tokens")
    pool = b("Concat", h0z, S_lanes, _reshape(b, saved, b.ints(-1), hk, rep, kd, vd), axis=0, hint="state_pool")
    finals = b("Gather", pool, lay.final_idx, axis=0)
    return o, _reshape(b, finals, _vec(b, lay.n_seq), hv, kd, vd, hint="final_states")


def chunked_prefill_body(b: GraphBuilder, ins: dict[str, str], attrs: dict[str, Any]) -> tuple[str, str]:
    """Nodes of the chunked prefill body into ``b``; returns (o [T, Hv, V] float32, final_state [N, Hv, K, V])."""
    q, k, v, g, beta = prepare_inputs(b, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"],
                                      ins.get("A_log"), ins.get("dt_bias"), attrs)
    cu = b("Cast", ins["cu_seqlens"], to=INT64, hint="cu64")
    h0 = b("Cast", ins["initial_state"], to=FLOAT, hint="h0")
    work = b.sub()
    o_t, s_t = _chunks(work, q, k, v, g, beta, cu, h0)
    none = b.sub()
    o_e, s_e = none("Identity", v, hint="o_no_tokens"), none("Identity", h0, hint="states_kept")
    return b("If", b("Greater", b("Size", v), b.scalar_i64(0)), n_out=2,
             then_branch=helper.make_graph(work.nodes, "gdn_chunked", [], [value_info(o_t, 3), value_info(s_t, 4)]),
             else_branch=helper.make_graph(none.nodes, "gdn_no_tokens", [], [value_info(o_e, 3), value_info(s_e, 4)]))


def packing_model(opset: int = 20):
    """A standalone ONNX model of the lane packing (for inspection and tests): input ``cu_seqlens``
    int32 [N+1]; outputs ``lanes``, ``steps`` (scalars), ``lane_of_seq``, ``lane_start`` [N] and
    ``restarts`` (1 when some lane holds several sequences, the Scan variant that restarts lanes)."""
    b = GraphBuilder()
    cu = b("Cast", "cu_seqlens", to=INT64)
    lay = _Layout(b, cu, b("Gather", cu, b.scalar_i64(-1), axis=0))
    outs = {"lanes": lay.lanes, "steps": lay.steps, "lane_of_seq": lay.lane, "lane_start": lay.lane_start,
            "restarts": b("Cast", b("Greater", lay.saved_per_step, b.scalar_i64(0)), to=INT64)}
    for name, value in outs.items():
        b("Identity", value, outputs=[name])
    graph = helper.make_graph(b.nodes, "gdn_lane_packing",
                              [helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["N1"])],
                              [helper.make_tensor_value_info(n, INT64, None) for n in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
