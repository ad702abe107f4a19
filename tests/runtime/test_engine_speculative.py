"""Speculative decoding on the decode engine's pools (gdn_deploy.runtime.engine_speculative), its step run eagerly
on the CPU (fp32): the verify + accept + commit step lands every pool where plain decode steps of the accepted
tokens land, and the generation loop gives plain greedy tokens for every family with drafts right, partly right
(accept counts 0..K differing across the batch in one step), from prompt lookup and random, with sequences joining
mid-run, slots reused and eos inside an accepted run. The CUDA-graph form: tests/kernels/test_engine_speculative_gpu.py.
"""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402
from speculative_drafters import PartlyRightDrafter, RandomDrafter  # noqa: E402

from gdn_deploy.errors import UsageError  # noqa: E402
from gdn_deploy.lm.generate import greedy_generate  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.runtime.cuda_engine import DecodeEngine  # noqa: E402
from gdn_deploy.runtime.engine_speculative import (SpeculativeStep, engine_speculative_generate,  # noqa: E402
                                                   speculator)
from gdn_deploy.runtime.speculative import NgramDrafter, OracleDrafter  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"]


def _model(family, gen, tmp_path):
    hf = tiny.build(family, gen, **tiny.EPS_CONDITIONED)
    tiny.save(hf, tmp_path)
    return load_hf_causal_lm(tmp_path)


def _prompts(gen, lens, V):
    return [torch.randint(0, V, (n,), generator=gen).tolist() for n in lens]


def _slot_state(eng, slot):
    """Every pool row of ``slot`` (attention caches up to the slot's position) and its position."""
    d = eng.decoder
    n = int(d.positions[slot])
    out = []
    for layer, (a, b) in zip(d.model.layers, d.pools):
        if layer.layer_type == "linear_attention":
            out += [a[slot].float(), b[slot].float()]
        else:
            out += [a[slot, :, :n].float(), b[slot, :, :n].float()]
    return n, out


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "olmo_hybrid"])
def test_step_commits_like_plain_decode(family, gen, tmp_path):
    """One step, L = 5, rows accepting 4, 0 and 2 drafts (ragged prompts 1, 6, 11, scrambled slot order): the
    predictions are the greedy tokens, the counts m + 1, and every pool row and position equals plain decode steps
    of the m + 1 accepted tokens (fp32: norm-relative 1e-5; a wrong count, window shift or slot gives O(1)).
    A padded row (the scratch slot, GDN slot -1) beside them changes nothing."""
    model = _model(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [1, 6, 11], V)
    greedy = greedy_generate(model, prompts, 8)
    spec_eng = DecodeEngine(model, pool_size=4, capacity=32, graphs=False)
    plain_eng = DecodeEngine(model, pool_size=4, capacity=32, graphs=False)
    slots, _ = spec_eng.add(prompts)
    plain_eng.add(prompts)
    L, order, wrong_at = 5, [2, 0, 1], {2: 4, 0: 0, 1: 2}      # row i: draft index made wrong (4 = none)
    rows = []
    for i in order:
        d = list(greedy[i][1:L])
        if wrong_at[i] < L - 1:
            d[wrong_at[i]] = (d[wrong_at[i]] + 1) % V
        rows.append([greedy[i][0]] + d)
    ids = torch.tensor(rows)
    sl = torch.tensor([slots[i] for i in order])
    step = SpeculativeStep(spec_eng.decoder)
    d = spec_eng.decoder
    padded_ids = torch.cat([ids, torch.randint(0, V, (1, L), generator=gen)])
    padded_slots = torch.cat([sl, torch.tensor([d.scratch])])
    gslots = torch.cat([sl, torch.tensor([-1])]).to(torch.int32)
    with torch.no_grad():
        out = step._step(padded_ids, padded_slots, gslots)[:3]
    counts = out[:, -1].tolist()
    assert counts == [wrong_at[i] + 1 for i in order]
    for r, i in enumerate(order):
        assert out[r, :counts[r]].tolist() == greedy[i][1:1 + counts[r]]
        toks = greedy[i][:counts[r]]
        for t in toks:
            plain_eng.decoder.step_eager(torch.tensor([t]), torch.tensor([slots[i]]))
        n_spec, got = _slot_state(spec_eng, slots[i])
        n_plain, want = _slot_state(plain_eng, slots[i])
        assert n_spec == n_plain == len(prompts[i]) + counts[r]
        for a, b in zip(got, want):
            assert rel_err(a, b) < 1e-5, (family, i)
    assert int(d.positions[d.scratch]) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_equal_greedy_every_drafter(family, gen, tmp_path):
    """Ragged prompts join at steps 0, 0, 1, 3 into a pool of 3 (the last waits for a freed slot, then reuses it),
    per-prompt budgets; drafts right (K = 3), partly right (K = 4: counts 1..5 differ across rows of a step),
    prompt lookup (K = 2) and random (K = 7): always the greedy tokens."""
    model = _model(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [1, 6, 11, 4], V)
    budgets = [10, 7, 10, 6]
    greedy = greedy_generate(model, prompts, 10)
    want = [g[:n] for g, n in zip(greedy, budgets)]
    eng = DecodeEngine(model, pool_size=3, capacity=40, graphs=False)
    arrivals = [0, 0, 1, 3]
    drafters = [(OracleDrafter(greedy, prompts), 3), (PartlyRightDrafter(greedy, prompts, V), 4),
                (NgramDrafter(), 2), (RandomDrafter(V, seed=1), 7)]
    rates = []
    for drafter, K in drafters:
        res = engine_speculative_generate(eng, prompts, budgets, drafter, K, arrivals=arrivals)
        assert res.tokens == want, (family, type(drafter).__name__)
        assert sorted(eng.free) == [0, 1, 2] and not eng.lengths
        rates.append(res.acceptance_rate)
    assert rates[0] > 0.6 and 0 < rates[1] < rates[0] and rates[3] < 0.2


def test_partly_right_counts_differ_within_a_step(gen, tmp_path):
    """The partly-right drafter really gives different counts to the rows of one step (the loop's premise)."""
    model = _model("qwen3_5", gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [3, 5, 7], V)
    greedy = greedy_generate(model, prompts, 12)
    eng = DecodeEngine(model, pool_size=3, capacity=40, graphs=False)
    spec = speculator(eng)
    slots, logits = eng.add(prompts)
    ctx = [p + [int(t)] for p, t in zip(prompts, logits.argmax(-1))]
    drafter, K = PartlyRightDrafter(greedy, prompts, V), 4
    seen = []
    for _ in range(2):
        d = drafter.propose(ctx, K, "cpu")
        ids = torch.cat([torch.tensor([c[-1] for c in ctx])[:, None], d], 1)
        out = spec.step(slots, ids)
        counts = out[:, -1].tolist()
        spec.advance(slots, counts)
        for r in range(3):
            ctx[r] += out[r, :counts[r]].tolist()
        seen.append(counts)
    assert all(len(set(c)) == 3 for c in seen), seen
    for r in range(3):
        assert ctx[r][len(prompts[r]):] == greedy[r][:len(ctx[r]) - len(prompts[r])]


def test_eos_inside_accepted_run_and_capacity(gen, tmp_path):
    model = _model("qwen3_next", gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [2, 9], V)
    greedy = greedy_generate(model, prompts, 12)
    eos = greedy[1][5]                                   # inside the first call's accepted run (tokens 1..8)
    eng = DecodeEngine(model, pool_size=2, capacity=40, graphs=False)
    res = engine_speculative_generate(eng, prompts, 12, OracleDrafter(greedy, prompts), 7, eos_token_ids=[eos])
    for got, g in zip(res.tokens, greedy):
        assert got == (g[:g.index(eos) + 1] if eos in g else g)
    assert res.finished[1] and not eng.lengths
    with pytest.raises(UsageError, match="exceed the engine's capacity 40"):
        engine_speculative_generate(eng, [[1] * 30], 8, NgramDrafter(), 3)
    with pytest.raises(UsageError, match="draft tokens 16"):
        engine_speculative_generate(eng, prompts, 4, NgramDrafter(), 16)
