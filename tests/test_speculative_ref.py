"""GatedDeltaVerify + GatedDeltaCommit (reference): for every accept count 0..T_n, verify then commit lands on
the state the float64 token-by-token recurrence reaches after that prefix, and verify's outputs equal the
recurrence's; dense and pool states, GVA, both gate modes, beta in [0, 2], ragged draft lengths including 0 and 1;
bad counts refused (value checks) or clamped (no value checks)."""
from __future__ import annotations

import pytest
import torch

from conftest import make_prefill_inputs, rel_err
from gdn_deploy.reference import commit_ref, prefill_ref, verify_ref
from gdn_deploy.spec import SPEC, ContractError

F32 = SPEC.kernel_tolerance("float32")
GATE_KEYS = ("A_log", "dt_bias")


def verify_inputs(gen, lens, *, Hk=2, Hv=4, K=16, V=8, gate_mode=0, use_qk_l2norm=1, pool=None, beta_range=(0.0, 2.0)):
    """Inputs of a verify step (float64) built on make_prefill_inputs; ``pool`` P puts the states in a pool."""
    kw = {"beta_range": beta_range} if gate_mode == 0 else {}
    inp = make_prefill_inputs(gen, lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, **kw)
    dense = inp.pop("initial_state")
    if pool is None:
        inp["state"] = dense
        return inp, dense, None
    slots = torch.randperm(pool, generator=gen)[:len(lens)].to(torch.int32)
    p = torch.randn(pool, Hv, K, V, generator=gen, dtype=torch.float64)
    p[slots.long()] = dense
    inp["state"], inp["slots"] = p, slots
    return inp, dense, slots


def run_verify(inp, **attrs):
    return verify_ref(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["cu_seqlens"], inp["state"],
                      inp.get("slots"), inp.get("A_log"), inp.get("dt_bias"), **attrs)


def truth(inp, dense, n, j, **attrs):
    """o of sequence n's tokens and its state after its first j tokens: the float64 token-by-token recurrence."""
    cu = inp["cu_seqlens"].tolist()
    s = cu[n]
    sl = slice(s, s + j)
    one = torch.tensor([0, j], dtype=torch.int32)
    gates = {x: inp[x] for x in GATE_KEYS if x in inp}
    o, S = prefill_ref(inp["q"][sl], inp["k"][sl], inp["v"][sl], inp["g"][sl], inp["beta"][sl], one,
                       dense[n:n + 1], gates.get("A_log"), gates.get("dt_bias"), form="recurrent",
                       compute_dtype=torch.float64, **attrs)
    return o, S[0]


def as32(inp):
    return {n: (t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for n, t in inp.items()}


CASES = [  # (Hk, Hv, gate_mode, use_qk_l2norm, pool)
    (2, 4, 0, 1, None), (2, 4, 1, 1, 6), (1, 3, 0, 0, None), (2, 2, 1, 0, 5), (1, 4, 1, 1, None), (2, 6, 0, 1, 9),
]


@pytest.mark.parametrize("Hk,Hv,gate_mode,use_qk_l2norm,pool", CASES)
def test_commit_every_accept_count_matches_recurrence(gen, Hk, Hv, gate_mode, use_qk_l2norm, pool):
    lens = [1, 4, 0, 16, 3]
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=0.0 if Hv % 3 else 0.4)
    inp, dense, slots = verify_inputs(gen, lens, Hk=Hk, Hv=Hv, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm,
                                      pool=pool)
    sm = dict(state_mode=0 if pool is None else 1)
    x32 = as32(inp)
    o, ck, cd, cg = run_verify(x32, **attrs, **sm)
    assert o.dtype == ck.dtype == cd.dtype == cg.dtype == torch.float32
    assert torch.equal(x32["state"], as32(inp)["state"])         # verify only reads the state
    cu = inp["cu_seqlens"].tolist()
    for n, L in enumerate(lens):
        o_ref, _ = truth(inp, dense, n, L, **attrs)
        if L:
            assert rel_err(o[cu[n]:cu[n + 1]], o_ref) < F32
    for j in range(max(lens) + 1):
        acc = torch.tensor([min(j, L) for L in lens], dtype=torch.int32)
        new = commit_ref(x32["state"], ck, cd, cg, inp["cu_seqlens"], acc, x32.get("slots"), **sm)
        for n, L in enumerate(lens):
            _, S_ref = truth(inp, dense, n, min(j, L), **attrs)
            row = n if slots is None else int(slots[n])
            assert rel_err(new[row], S_ref) < F32, (n, j)
        if slots is not None:   # rows of no sequence keep their bits
            others = sorted(set(range(pool)) - set(slots.tolist()))
            assert torch.equal(new[others], x32["state"][others])


def test_float64_verify_commit_is_exact(gen):
    lens = [5, 2, 16]
    inp, dense, _ = verify_inputs(gen, lens, gate_mode=1)
    o, ck, cd, cg = run_verify(inp, gate_mode=1, use_qk_l2norm=1)
    assert o.dtype == cd.dtype == torch.float64
    acc = torch.tensor([3, 0, 16], dtype=torch.int32)
    new = commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], acc)
    for n, j in enumerate(acc.tolist()):
        _, S_ref = truth(inp, dense, n, j, gate_mode=1, use_qk_l2norm=1)
        assert rel_err(new[n], S_ref) < 1e-12


def test_decode_is_the_one_token_case(gen):
    from gdn_deploy.reference import decode_ref
    inp, _, _ = verify_inputs(gen, [1, 1, 1], gate_mode=1)
    o, ck, cd, cg = run_verify(inp, gate_mode=1, use_qk_l2norm=1)
    o_d, S_d = decode_ref(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["state"], None, inp["A_log"],
                          inp["dt_bias"], gate_mode=1, use_qk_l2norm=1)
    new = commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], torch.ones(3, dtype=torch.int32))
    assert rel_err(o, o_d) < 1e-12 and rel_err(new, S_d) < 1e-12


def test_slot_minus_one_is_skipped(gen):
    inp, _, slots = verify_inputs(gen, [3, 2], pool=4)
    inp["slots"] = torch.tensor([-1, int(slots[1])], dtype=torch.int32)
    o, ck, cd, cg = run_verify(inp, state_mode=1, use_qk_l2norm=1)
    assert torch.count_nonzero(o[:3]) == 0 and torch.count_nonzero(cd[:3]) == 0 and torch.count_nonzero(ck[:3]) == 0
    assert torch.count_nonzero(o[3:]) > 0
    new = commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], torch.tensor([3, 2], dtype=torch.int32),
                     inp["slots"], state_mode=1)
    keep = sorted(set(range(4)) - {int(slots[1])})
    assert torch.equal(new[keep], inp["state"][keep])


@pytest.mark.parametrize("bad", [-1, 4, 1000, -(2 ** 31)])
def test_bad_accept_counts_refused_or_clamped(gen, bad):
    lens = [3, 2]
    inp, _, _ = verify_inputs(gen, lens)
    _, ck, cd, cg = run_verify(inp, use_qk_l2norm=1)
    acc = torch.tensor([bad, 1], dtype=torch.int32)
    with pytest.raises(ContractError, match=r"accepted: sequence 0 accepts"):
        commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], acc)
    clamped = torch.tensor([min(max(bad, 0), lens[0]), 1], dtype=torch.int32)
    got = commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], acc, check_values=False)
    assert torch.equal(got, commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], clamped))


def test_draft_longer_than_the_limit_refused(gen):
    inp, _, _ = verify_inputs(gen, [2, SPEC.max_draft_tokens + 1])
    with pytest.raises(ContractError, match="sequence 1 has 17 tokens"):
        run_verify(inp, use_qk_l2norm=1)


def test_shape_errors(gen):
    inp, _, _ = verify_inputs(gen, [2, 3])
    _, ck, cd, cg = run_verify(inp, use_qk_l2norm=1)
    with pytest.raises(ContractError, match=r"accepted: expected a 1-D"):
        commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ContractError, match=r"accepted: dtype int64"):
        commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ContractError, match=r"commit_g: dimension 0"):
        commit_ref(inp["state"], ck, cd, cg[:-1], inp["cu_seqlens"], torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ContractError, match=r"slots: required when state_mode == 1"):
        commit_ref(inp["state"], ck, cd, cg, inp["cu_seqlens"], torch.zeros(2, dtype=torch.int32), state_mode=1)
    with pytest.raises(ContractError, match=r"state: dimension 0 \(N\)"):
        run_verify({**inp, "state": inp["state"][:1]}, use_qk_l2norm=1)
