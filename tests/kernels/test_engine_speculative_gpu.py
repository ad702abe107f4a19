"""Speculative decoding on the graphed engine on the GPU (gdn_deploy.runtime.engine_speculative): the captured
verify + accept + commit step against the same step run eagerly on torch ops alone (Triton glue off), and the
speculative tokens against the plain graphed engine's greedy tokens, fp32, for two families over batch buckets.

Graphed and eager logits differ by fp32 rounding (other GEMM algorithms for the padded bucket, the Triton glue),
so pools are compared within 1e-5 norm-relative; predictions and accept counts are argmaxes of logits that agree
to ~1e-6, equal unless a near-tie sits at 1e-6 (vocabulary 256: not met by these seeds' models).
"""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err

pytest.importorskip("transformers", reason="needs transformers (pip install -e .[test])")
import hf_tiny_models as tiny  # noqa: E402
from speculative_drafters import PartlyRightDrafter  # noqa: E402

from gdn_deploy.lm import triton_ops  # noqa: E402
from gdn_deploy.lm.generate import greedy_generate  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.runtime.cuda_engine import DecodeEngine, engine_generate  # noqa: E402
from gdn_deploy.runtime.decode_attention import decode_attention, triton_available  # noqa: E402
from gdn_deploy.runtime.engine_speculative import engine_speculative_generate, speculator  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5"]


def _model(family, gen, tmp_path):
    tiny.build_saved(family, gen, tmp_path, gpu=True)
    return load_hf_causal_lm(tmp_path).to("cuda")


@pytest.mark.skipif(not triton_available(), reason="triton not importable")
def test_triton_attention_strided_slots_and_lengths(gen):
    """Slots / lengths given as stride-0 views (one slot repeated for L queries, as a batch of 1 verifies) read as
    their values, not as dense memory past the view."""
    P, S, H, Hkv, D, L = 5, 300, 8, 2, 64, 4
    k_pool = torch.randn(P, Hkv, S, D, generator=gen).cuda()
    v_pool = torch.randn(P, Hkv, S, D, generator=gen).cuda()
    q = torch.randn(L, H, D, generator=gen).cuda()
    slots = torch.tensor([3], device="cuda")[:, None].expand(1, L).reshape(-1)
    assert slots.stride(0) == 0
    lens = torch.tensor([100], device="cuda").expand(L) + torch.arange(L, device="cuda")
    for splits in (1, 5):
        got = decode_attention(q, k_pool, v_pool, slots, lens, D ** -0.5, impl="triton", splits=splits)
        want = decode_attention(q.double(), k_pool.double(), v_pool.double(), slots, lens, D ** -0.5, impl="torch")
        assert rel_err(got.double(), want) < 1e-5


@pytest.mark.parametrize("L", [4, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_graphed_speculative_step_equals_eager(kernels, gen, family, L, tmp_path):
    """Batches of 5 (bucket 8), 1 and 3 (bucket 4), slots released and reused; drafts partly right so the rows
    of one step accept different counts."""
    model = _model(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    graphed = DecodeEngine(model, pool_size=8, capacity=200, graphs=True)
    with triton_ops.disabled():
        eager = DecodeEngine(model, pool_size=8, capacity=200, graphs=False)
    sg, se = speculator(graphed, True), speculator(eager, False)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (1, 40, 130, 5, 64)]
    future = greedy_generate(model, prompts, 40)
    drafter = PartlyRightDrafter(future, prompts, V)
    ctx = [list(p) for p in prompts]
    for eng in (graphed, eager):
        _, logits = eng.add(prompts)
    for i, t in enumerate(logits.argmax(-1).tolist()):
        ctx[i].append(t)
    counts_seen = set()
    for batch in ([0, 1, 2, 3, 4], [2], [4, 0, 1], "swap", [3, 0, 4, 2]):
        if batch == "swap":
            new = torch.randint(0, V, (9,), generator=gen).tolist()
            for eng in (graphed, eager):
                eng.release([1, 3])
                slots, logits = eng.add([new])
                assert slots == [3]
            ctx[3], ctx[1] = new + [int(logits[0].argmax())], None
            drafter.full[3] = list(ctx[3])                  # no known future: drafts repeat the last token
            continue
        for _ in range(2):
            drafter.rows = batch
            d = drafter.propose([ctx[i] for i in batch], L - 1, "cpu")
            ids = torch.cat([torch.tensor([ctx[i][-1] for i in batch])[:, None], d], 1).cuda()
            a = sg.step(batch, ids).clone()
            with triton_ops.disabled():
                b = se.step(batch, ids)
            assert torch.equal(a, b), (family, batch)
            for eng, sp in ((graphed, sg), (eager, se)):
                sp.advance(batch, a[:, -1].tolist())
            for r, i in enumerate(batch):
                ctx[i] += a[r, :int(a[r, -1])].tolist()
            counts_seen.update(a[:, -1].tolist())
    assert len(counts_seen) >= 3
    assert torch.equal(graphed.decoder.positions, eager.decoder.positions)
    for (ga, gb), (ea, eb) in zip(graphed.decoder.pools, eager.decoder.pools):
        assert rel_err(ga[:8].float(), ea[:8].float()) < 1e-5 and rel_err(gb[:8].float(), eb[:8].float()) < 1e-5


@pytest.mark.parametrize("K", [3, 7])
@pytest.mark.parametrize("family", FAMILIES)
def test_graphed_speculative_tokens_equal_plain_engine(kernels, gen, family, K, tmp_path):
    """Prompts join at steps 0, 0, 1, 2, 4 into a pool of 4 (batches over buckets 1, 2, 4); partly right drafts
    and an eos inside an accepted run: the tokens of the plain graphed engine."""
    model = _model(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (3, 40, 1, 77, 12)]
    eng = DecodeEngine(model, pool_size=4, capacity=160, graphs=True)
    plain = engine_generate(eng, prompts, 30, arrivals=[0, 0, 1, 2, 4]).tokens
    drafter = PartlyRightDrafter(plain, prompts, V)
    res = engine_speculative_generate(eng, prompts, 30, drafter, K, arrivals=[0, 0, 1, 2, 4])
    assert res.tokens == plain
    assert 0 < res.acceptance_rate < 1 and sorted(eng.free) == [0, 1, 2, 3] and not eng.lengths
    eos = plain[1][10]
    res = engine_speculative_generate(eng, prompts, [30, 30, 20, 30, 5], PartlyRightDrafter(plain, prompts, V, False),
                                      K, eos_token_ids=[eos], arrivals=[0, 0, 1, 2, 4])
    for got, want, n in zip(res.tokens, plain, [30, 30, 20, 30, 5]):
        want = want[:n]
        assert got == (want[:want.index(eos) + 1] if eos in want else want)
