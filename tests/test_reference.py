"""The exact reference (gdn_deploy.reference): chunked == recurrent, decode == prefill, pool semantics,
float32 vs float64, and a per-head loop written straight from the spec's recurrence text."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import (call_decode_ref, call_prefill_ref, cast_inputs, make_decode_inputs,
                      make_prefill_inputs, rel_err)
from gdn_deploy.reference import chunked_scan, recurrent_scan
from gdn_deploy.spec import SPEC

EXACT = 1e-10            # chunked vs recurrent, both float64
F32_VS_F64 = SPEC.kernel_tolerance("float32")   # 1e-4

EDGE_LENGTHS = [0, 1, 63, 64, 65, 129]


def both_forms(inp, **attrs):
    o_r, s_r = call_prefill_ref(inp, form="recurrent", **attrs)
    o_c, s_c = call_prefill_ref(inp, form="chunked", **attrs)
    assert o_r.dtype == o_c.dtype == torch.float64 and s_r.dtype == s_c.dtype == torch.float64
    return (o_r, s_r), (o_c, s_c)


def assert_forms_agree(inp, **attrs):
    (o_r, s_r), (o_c, s_c) = both_forms(inp, **attrs)
    assert torch.isfinite(o_r).all() and torch.isfinite(s_r).all()
    assert rel_err(o_c, o_r) < EXACT, rel_err(o_c, o_r)
    assert rel_err(s_c, s_r) < EXACT, rel_err(s_c, s_r)
    return o_r, s_r


# every GVA ratio in both gate modes; each (gate_mode, use_qk_l2norm) pair twice
@pytest.mark.parametrize("ratio,gate_mode,use_qk_l2norm",
                         [(r, gm, (r + gm) % 2) for r in (1, 2, 3, 4) for gm in (0, 1)])
def test_chunked_equals_recurrent_edge_lengths(gen, ratio, gate_mode, use_qk_l2norm):
    Hk = 2
    scale = 0.0 if ratio % 2 else 0.37  # default 1/sqrt(K) and a custom scale
    inp = make_prefill_inputs(gen, EDGE_LENGTHS, Hk=Hk, Hv=Hk * ratio, K=16, V=12, gate_mode=gate_mode,
                              use_qk_l2norm=use_qk_l2norm)
    o, s = assert_forms_agree(inp, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale)
    # the empty sequence (index 0) keeps its initial state and owns no tokens
    assert torch.equal(s[0], inp["initial_state"][0])
    assert o.shape == (sum(EDGE_LENGTHS), Hk * ratio, 12)


def test_chunked_equals_recurrent_ragged(gen):
    lens = torch.randint(0, 150, (20,), generator=gen)
    lens[torch.randperm(20, generator=gen)[:4]] = 0        # at least four empty sequences
    inp = make_prefill_inputs(gen, lens.tolist(), Hk=1, Hv=3, K=8, V=16, use_qk_l2norm=1)
    _, s = assert_forms_agree(inp, use_qk_l2norm=1, scale=0.5)
    for n in torch.nonzero(lens == 0).flatten().tolist():
        assert torch.equal(s[n], inp["initial_state"][n])


def test_all_empty_prefill(gen):
    inp = make_prefill_inputs(gen, [0, 0, 0], Hk=2, Hv=2, K=8, V=8)
    for form in ("recurrent", "chunked"):
        o, s = call_prefill_ref(inp, form=form)
        assert o.shape == (0, 2, 8)
        assert torch.equal(s, inp["initial_state"])


def _adversarial_gates(gen, T, Hv, kind):
    if kind == "tiny_decay":          # exp(g) just below 1
        g = -1e-6 * (1 + torch.rand(T, Hv, generator=gen, dtype=torch.float64))
    elif kind == "huge_decay":        # exp(g) ~ 1e-13: the state is all but reset every token
        g = -30 + torch.rand(T, Hv, generator=gen, dtype=torch.float64)
    elif kind == "no_decay":          # exp(g) exactly 1
        g = torch.zeros(T, Hv, dtype=torch.float64)
    else:                             # token-wise mix of the three
        choice = torch.randint(0, 3, (T, Hv), generator=gen)
        g = torch.stack([torch.zeros(T, Hv, dtype=torch.float64), torch.full((T, Hv), -1e-6, dtype=torch.float64),
                         torch.full((T, Hv), -30.0, dtype=torch.float64)])
        g = g.gather(0, choice[None]).squeeze(0)
    return g


@pytest.mark.parametrize("kind", ["tiny_decay", "huge_decay", "no_decay", "mixed"])
@pytest.mark.parametrize("beta_kind", ["zero", "one", "zero_one_mix"])
def test_chunked_equals_recurrent_adversarial_gates(gen, kind, beta_kind):
    lens = [1, 64, 65, 129]
    inp = make_prefill_inputs(gen, lens, Hk=2, Hv=4, K=16, V=8, use_qk_l2norm=1)
    T = sum(lens)
    inp["g"] = _adversarial_gates(gen, T, 4, kind)
    if beta_kind == "zero":
        inp["beta"] = torch.zeros(T, 4, dtype=torch.float64)
    elif beta_kind == "one":
        inp["beta"] = torch.ones(T, 4, dtype=torch.float64)
    else:
        inp["beta"] = torch.randint(0, 2, (T, 4), generator=gen).double()
    o, s = assert_forms_agree(inp, use_qk_l2norm=1)
    if beta_kind == "zero":
        # no writes: the state only decays, o_t = exp(sum g) q_t^T S0
        cu = inp["cu_seqlens"].tolist()
        for n in range(len(lens)):
            G = inp["g"][cu[n]:cu[n + 1]].sum(0)
            want = inp["initial_state"][n] * G.exp()[:, None, None]
            assert rel_err(s[n], want) < EXACT


@pytest.mark.parametrize("gates", ["strong", "weak"])
@pytest.mark.parametrize("beta_kind", ["uniform_0_2", "two", "olmo_sigmoid"])
def test_chunked_equals_recurrent_beta_up_to_two(gen, gates, beta_kind):
    """The contract's beta range [0, 2] (OLMo-Hybrid's negative eigenvalues): both float64 forms agree, the state
    stays bounded, and beta = 2 with g = 0 reflects the state along a unit key (S <- (I - 2 k k^T) S)."""
    lens = [1, 63, 64, 65, 200]
    g_range = (-3.0, -0.5) if gates == "strong" else (-0.01, 0.0)
    inp = make_prefill_inputs(gen, lens, Hk=2, Hv=4, K=16, V=8, use_qk_l2norm=1, g_range=g_range,
                              beta_range=(0.0, 2.0))
    T = sum(lens)
    if beta_kind == "two":
        inp["beta"] = torch.full((T, 4), 2.0, dtype=torch.float64)
    elif beta_kind == "olmo_sigmoid":
        inp["beta"] = 2.0 * torch.sigmoid(3 * torch.randn(T, 4, generator=gen, dtype=torch.float64))
    assert float(inp["beta"].max()) > 1.5
    o, s = assert_forms_agree(inp, use_qk_l2norm=1)
    assert float(s.abs().max()) < 1e3 and float(o.abs().max()) < 1e3
    # decode == the last token of a prefill, with beta > 1
    cu = inp["cu_seqlens"].tolist()
    n = 4
    last = slice(cu[n + 1] - 1, cu[n + 1])
    pre = {k: (v[cu[n]:cu[n + 1] - 1] if k in ("q", "k", "v", "g", "beta") else v) for k, v in inp.items()}
    pre["cu_seqlens"] = torch.tensor([0, cu[n + 1] - 1 - cu[n]], dtype=torch.int32)
    pre["initial_state"] = inp["initial_state"][n:n + 1]
    _, s_mid = call_prefill_ref(pre, use_qk_l2norm=1)
    dec = dict(q=inp["q"][last], k=inp["k"][last], v=inp["v"][last], g=inp["g"][last], beta=inp["beta"][last],
               state=s_mid)
    o_d, s_d = call_decode_ref(dec, use_qk_l2norm=1)
    assert rel_err(o_d[0], o[last][0]) < EXACT and rel_err(s_d[0], s[n]) < EXACT


def test_beta_two_reflects_the_state(gen):
    K, V = 8, 4
    k = torch.randn(1, 1, K, generator=gen, dtype=torch.float64)
    k = k / k.norm()
    S = torch.randn(1, K, V, generator=gen, dtype=torch.float64)
    q = torch.randn(1, 1, K, generator=gen, dtype=torch.float64)
    v = torch.zeros(1, 1, V, dtype=torch.float64)
    g, beta = torch.zeros(1, 1, dtype=torch.float64), torch.full((1, 1), 2.0, dtype=torch.float64)
    _, S1 = recurrent_scan(q, k, v, g, beta, S)
    kk = k[0, 0]
    want = (torch.eye(K, dtype=torch.float64) - 2 * kk[:, None] * kk[None, :]) @ S[0]
    assert rel_err(S1[0], want) < EXACT
    _, S2 = chunked_scan(q, k, v, g, beta, S)
    assert rel_err(S2[0], want) < EXACT


def test_beta_one_no_decay_overwrites(gen):
    """beta = 1, g = 0, unit keys: after writing v at key k, reading with q = k returns v exactly."""
    K, V = 8, 5
    inp = make_prefill_inputs(gen, [3], Hk=1, Hv=1, K=K, V=V, use_qk_l2norm=0)
    k = inp["k"][0:1]
    inp["k"] = k.expand(3, 1, K).clone()
    inp["q"] = k.expand(3, 1, K).clone()
    inp["g"] = torch.zeros(3, 1, dtype=torch.float64)
    inp["beta"] = torch.ones(3, 1, dtype=torch.float64)
    for form in ("recurrent", "chunked"):
        o, _ = call_prefill_ref(inp, form=form, scale=1.0)
        assert rel_err(o, inp["v"]) < EXACT


def naive_prefill(q, k, v, g, beta, cu, h0, A_log=None, dt_bias=None, *, gate_mode=0, use_qk_l2norm=0,
                  scale=0.0, eps=1e-6):
    """Per (sequence, head, token) loop written straight from gdn_ops.json's "recurrence" text."""
    T, Hk, K = q.shape
    Hv, V = v.shape[1], v.shape[2]
    o = torch.zeros(T, Hv, V, dtype=torch.float64)
    S_out = h0.clone()
    sc = scale if scale else 1 / math.sqrt(K)
    for n in range(len(cu) - 1):
        for h in range(Hv):
            S = h0[n, h].clone()
            hk = h // (Hv // Hk)
            for t in range(cu[n], cu[n + 1]):
                if gate_mode == 1:
                    gt = -math.exp(A_log[h]) * F.softplus(g[t, h] + dt_bias[h])
                    bt = torch.sigmoid(beta[t, h])
                else:
                    gt, bt = g[t, h], beta[t, h]
                qt, kt = q[t, hk], k[t, hk]
                if use_qk_l2norm:
                    qt = qt / torch.sqrt((qt * qt).sum() + eps)
                    kt = kt / torch.sqrt((kt * kt).sum() + eps)
                qt = qt * sc
                S = math.exp(float(gt)) * S
                S = S + torch.outer(kt, bt * (v[t, h] - S.T @ kt))
                o[t, h] = S.T @ qt
            S_out[n, h] = S
    return o, S_out


@pytest.mark.parametrize("gate_mode,use_qk_l2norm,scale", [(0, 0, 0.0), (1, 1, 0.3), (0, 1, 0.0), (1, 0, 2.0)])
def test_reference_matches_spec_text_loop(gen, gate_mode, use_qk_l2norm, scale):
    inp = make_prefill_inputs(gen, [5, 0, 9], Hk=2, Hv=6, K=4, V=3, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm)
    want_o, want_s = naive_prefill(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["cu_seqlens"].tolist(),
                                   inp["initial_state"], inp.get("A_log"), inp.get("dt_bias"), gate_mode=gate_mode,
                                   use_qk_l2norm=use_qk_l2norm, scale=scale)
    for form in ("recurrent", "chunked"):
        o, s = call_prefill_ref(inp, form=form, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale)
        assert rel_err(o, want_o) < EXACT and rel_err(s, want_s) < EXACT


@pytest.mark.parametrize("gate_mode", [0, 1])
def test_prefill_then_decode_equals_longer_prefill(gen, gate_mode):
    """prefill(first P_n tokens) + M decode steps == prefill(P_n + M tokens), per sequence."""
    M, Hk, Hv, K, V = 5, 2, 4, 16, 8
    full_lens = [70, 6, 64]
    inp = make_prefill_inputs(gen, full_lens, Hk=Hk, Hv=Hv, K=K, V=V, gate_mode=gate_mode, use_qk_l2norm=1)
    attrs = dict(gate_mode=gate_mode, use_qk_l2norm=1)
    o_full, s_full = call_prefill_ref(inp, form="chunked", **attrs)
    cu = inp["cu_seqlens"].tolist()
    head = [list(range(cu[n], cu[n + 1] - M)) for n in range(3)]
    tail = [list(range(cu[n + 1] - M, cu[n + 1])) for n in range(3)]
    idx = torch.tensor(sum(head, []))
    part = {n: inp[n][idx] for n in ("q", "k", "v", "g", "beta")}
    part.update(cu_seqlens=torch.tensor([0] + torch.tensor([len(h) for h in head]).cumsum(0).tolist(),
                                        dtype=torch.int32),
                initial_state=inp["initial_state"], A_log=inp.get("A_log"), dt_bias=inp.get("dt_bias"))
    _, state = call_prefill_ref(part, form="chunked", **attrs)
    for step in range(M):
        rows = torch.tensor([tail[n][step] for n in range(3)])
        d = {n: inp[n][rows] for n in ("q", "k", "v", "g", "beta")}
        d.update(state=state, A_log=inp.get("A_log"), dt_bias=inp.get("dt_bias"))
        o_step, state = call_decode_ref(d, **attrs)
        assert rel_err(o_step, o_full[rows]) < EXACT
    assert rel_err(state, s_full) < EXACT


def test_pool_decode_skips_and_updates_only_its_slots(gen):
    P, B = 7, 4
    inp = make_decode_inputs(gen, B, Hk=2, Hv=4, K=16, V=8, pool_size=P)
    inp["slots"] = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    pool_before = inp["state"].clone()
    o, new_pool = call_decode_ref(inp, state_mode=1)
    assert torch.equal(inp["state"], pool_before), "decode_ref must not modify its input pool"
    assert torch.equal(o[1], torch.zeros_like(o[1])), "slot -1 must give o = 0"
    untouched = [r for r in range(P) if r not in (5, 0, 2)]
    assert torch.equal(new_pool[untouched], pool_before[untouched])
    # the used rows equal a dense decode of the same sequences on the gathered states
    live = torch.tensor([0, 2, 3])
    dense = {n: inp[n][live] for n in ("q", "k", "v", "g", "beta")}
    dense["state"] = pool_before[inp["slots"][live].long()]
    o_d, s_d = call_decode_ref(dense)
    assert rel_err(o[live], o_d) < EXACT
    assert rel_err(new_pool[inp["slots"][live].long()], s_d) < EXACT


def test_pool_decode_all_skipped(gen):
    inp = make_decode_inputs(gen, 3, pool_size=3)
    inp["slots"] = torch.full((3,), -1, dtype=torch.int32)
    o, new_pool = call_decode_ref(inp, state_mode=1)
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(new_pool, inp["state"])


def test_decode_equals_one_token_prefill(gen):
    inp = make_decode_inputs(gen, 3, Hk=1, Hv=2, K=8, V=8, gate_mode=1, use_qk_l2norm=1)
    o, s = call_decode_ref(inp, gate_mode=1, use_qk_l2norm=1, scale=0.2)
    pre = dict(inp, initial_state=inp["state"], cu_seqlens=torch.arange(4, dtype=torch.int32))
    o2, s2 = call_prefill_ref(pre, gate_mode=1, use_qk_l2norm=1, scale=0.2)
    assert rel_err(o, o2) < EXACT and rel_err(s, s2) < EXACT


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
@pytest.mark.parametrize("gate_mode", [0, 1])
def test_float32_path_close_to_float64(gen, form, gate_mode):
    inp64 = make_prefill_inputs(gen, [1, 64, 100], Hk=2, Hv=4, K=32, V=16, gate_mode=gate_mode, use_qk_l2norm=1)
    inp32 = cast_inputs(inp64, torch.float32)
    o64, s64 = call_prefill_ref(inp64, form="chunked", gate_mode=gate_mode, use_qk_l2norm=1)
    o32, s32 = call_prefill_ref(inp32, form=form, gate_mode=gate_mode, use_qk_l2norm=1)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    assert rel_err(o32, o64) < F32_VS_F64 and rel_err(s32, s64) < F32_VS_F64
    # compute_dtype=float64 on float32 inputs gives the float64 answer (returned in float64)
    o_w, s_w = call_prefill_ref(inp32, form=form, gate_mode=gate_mode, use_qk_l2norm=1, compute_dtype=torch.float64)
    assert o_w.dtype == s_w.dtype == torch.float64
    assert rel_err(o_w, o64) < 1e-6 and rel_err(s_w, s64) < 1e-6


def test_decode_float32_close_to_float64(gen):
    inp64 = make_decode_inputs(gen, 5, Hk=2, Hv=4, K=32, V=16, use_qk_l2norm=1, pool_size=9)
    inp32 = cast_inputs(inp64, torch.float32)
    o64, s64 = call_decode_ref(inp64, use_qk_l2norm=1, state_mode=1)
    o32, s32 = call_decode_ref(inp32, use_qk_l2norm=1, state_mode=1)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    assert rel_err(o32, o64) < F32_VS_F64 and rel_err(s32, s64) < F32_VS_F64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_keep_dtype_and_float32_state(gen, dtype):
    inp = cast_inputs(make_prefill_inputs(gen, [3, 70], use_qk_l2norm=1), dtype)
    o, s = call_prefill_ref(inp, form="chunked", use_qk_l2norm=1)
    assert o.dtype == dtype and s.dtype == torch.float32
    o64, s64 = call_prefill_ref(cast_inputs(inp, torch.float64, torch.float64), use_qk_l2norm=1)
    assert rel_err(o, o64) < SPEC.kernel_tolerance(str(dtype).replace("torch.", ""))


def test_scan_functions_direct(gen):
    """recurrent_scan / chunked_scan on one sequence longer than two chunks, with chunk sizes 16, 64, 100."""
    L, H, K, V = 140, 3, 8, 4
    q = torch.randn(L, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(L, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(L, H, V, generator=gen, dtype=torch.float64)
    g = -torch.rand(L, H, generator=gen, dtype=torch.float64)
    b = torch.rand(L, H, generator=gen, dtype=torch.float64)
    S0 = torch.randn(H, K, V, generator=gen, dtype=torch.float64)
    o_r, s_r = recurrent_scan(q, k, v, g, b, S0)
    for c in (16, 64, 100):
        o_c, s_c = chunked_scan(q, k, v, g, b, S0, chunk=c)
        assert rel_err(o_c, o_r) < EXACT and rel_err(s_c, s_r) < EXACT
