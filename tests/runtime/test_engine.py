"""gdn_deploy.runtime.cuda_engine on CPU (eager, reference ops): the pooled in-place step equals the model's
forward_decode, slots are handed out and reused, batches change between steps, continuous batching gives each
sequence the tokens it gets alone and HF's greedy tokens; decode attention's torch path against float64.
(The captured CUDA graphs: tests/kernels/test_cuda_engine.py.)"""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.errors import UsageError  # noqa: E402
from gdn_deploy.lm.generate import greedy_generate  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.lm.model import decode_states_from_prefill  # noqa: E402
from gdn_deploy.runtime.cuda_engine import DecodeEngine, batch_buckets, engine_generate  # noqa: E402
from gdn_deploy.runtime.decode_attention import decode_attention  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"]


def _load(family, gen, tmp_path, **over):
    hf = tiny.build(family, gen, **over)
    tiny.save(hf, tmp_path)
    return hf, load_hf_causal_lm(tmp_path)


def _prompts(gen, lens, V):
    return [torch.randint(0, V, (L,), generator=gen).tolist() for L in lens]


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError):
        batch_buckets(0)


@pytest.mark.parametrize("L,S", [(1, 1), (63, 64), (64, 64), (65, 130), (5, 300)])
def test_decode_attention_torch_matches_float64(gen, L, S):
    B, H, Hkv, D, P = 3, 6, 2, 16, 5
    k_pool = torch.randn(P, Hkv, S, D, generator=gen)
    v_pool = torch.randn(P, Hkv, S, D, generator=gen)
    q = torch.randn(B, H, D, generator=gen)
    slots = torch.tensor([4, 0, 2])
    lens = torch.tensor([L, max(1, L // 2), 1])
    got = decode_attention(q, k_pool, v_pool, slots, lens, 0.25, impl="torch")
    for b in range(B):
        for h in range(H):
            k = k_pool[slots[b], h // 3, :lens[b]].double()
            v = v_pool[slots[b], h // 3, :lens[b]].double()
            want = torch.softmax(k @ q[b, h].double() * 0.25, 0) @ v
            assert rel_err(got[b, h], want) < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_pool_step_equals_forward_decode(family, gen, tmp_path):
    """Ragged prompts (1, 6, 11 tokens) prefilled into slots 0..2, then steps with the batch in a scrambled
    slot order: logits equal forward_decode's on the same tokens (float32, same ops up to attention's sums and the
    MoE rows' order in the expert GEMMs: norm-relative differences up to 1.2e-5 were seen on a loaded 2-core CPU,
    while a wrong slot or position gives O(1))."""
    _, model = _load(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [1, 6, 11], V)
    eng = DecodeEngine(model, pool_size=4, capacity=32, graphs=False)
    slots, logits = eng.add(prompts)
    assert slots == [0, 1, 2]
    ids = torch.tensor([p for q in prompts for p in q])
    cu = torch.tensor([0, 1, 7, 18], dtype=torch.int32)
    ref_logits, st = model.forward_prefill(ids, cu, last_only=True)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
    states = decode_states_from_prefill(model.hybrid_config, st, cu, 32)
    positions = torch.tensor([1, 6, 11])
    order = [2, 0, 1]                                         # the engine's batch order differs from the reference
    for _ in range(5):
        nxt = torch.randint(0, V, (3,), generator=gen)
        with torch.no_grad():
            ref, states = model.forward_decode(nxt, positions, states)
        got = eng.step([slots[i] for i in order], nxt[order])
        assert rel_err(got, ref[order]) < 1e-4, family
        positions = positions + 1


def test_slots_reused_and_bookkeeping(gen, tmp_path):
    _, model = _load("qwen3_5", gen, tmp_path)
    V = model.hybrid_config.vocab_size
    eng = DecodeEngine(model, pool_size=2, capacity=8, graphs=False)
    a, _ = eng.add([[1, 2]])
    b, _ = eng.add([[3]])
    assert a + b == [0, 1] and eng.free == []
    with pytest.raises(UsageError, match="only 0 free slots"):
        eng.add([[4]])
    eng.release(a)
    with pytest.raises(ValueError, match="holds no live sequence"):
        eng.release(a)
    with pytest.raises(ValueError, match="holds no live sequence"):
        eng.step(a, torch.tensor([1]))
    c, logits_c = eng.add([[5, 6, 7]])                           # reuses slot 0: its old state must not leak
    assert c == a
    fresh = DecodeEngine(model, pool_size=2, capacity=8, graphs=False)
    _, logits_f = fresh.add([[5, 6, 7]])
    torch.testing.assert_close(logits_c, logits_f, rtol=0, atol=0)
    for _ in range(3):
        t = torch.randint(0, V, (1,), generator=gen)
        torch.testing.assert_close(eng.step(c, t), fresh.step([0], t), rtol=0, atol=0)
    eng.release(b)
    with pytest.raises(UsageError, match="1 to 7 prompt tokens"):
        eng.add([[1] * 8])
    for _ in range(2):
        eng.step(c, torch.tensor([1]))
    with pytest.raises(UsageError, match="fill the engine's capacity 8"):
        eng.step(c, torch.tensor([1]))
    with pytest.raises(UsageError, match="Triton glue kernels: .* for CUDA devices"):
        DecodeEngine(model, pool_size=2, capacity=8, graphs=False, kernels=True)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_continuous_batching_equals_alone_and_hf(family, gen, tmp_path):
    """Prompts join at steps 0, 0, 3 and 5 into a pool of 3 slots (the last waits for a free slot); each gets the
    greedy tokens it gets alone, and HF generate's."""
    hf, model = _load(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = _prompts(gen, [1, 6, 11, 4], V)
    eng = DecodeEngine(model, pool_size=3, capacity=32, graphs=False)
    res = engine_generate(eng, prompts, 12, arrivals=[0, 0, 3, 5])
    alone = greedy_generate(model, prompts, 12)
    assert res.tokens == alone
    assert sorted(eng.free) == [0, 1, 2] and not eng.lengths
    hf.generation_config.eos_token_id = None
    for p, got in zip(prompts, res.tokens):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long))[0, len(p):].tolist()
        assert got == want
    eos = alone[1][3]
    res = engine_generate(eng, prompts, 12, eos_token_ids=[eos], arrivals=[0, 0, 3, 5])
    for got, want in zip(res.tokens, alone):
        assert got == (want[:want.index(eos) + 1] if eos in want else want)


def test_engine_seeded_sampling_reproducible(gen, tmp_path):
    from gdn_deploy.runtime.sampling import SamplingConfig
    _, model = _load("qwen3_5", gen, tmp_path)
    prompts = _prompts(gen, [3, 5], model.hybrid_config.vocab_size)
    eng = DecodeEngine(model, pool_size=2, capacity=24, graphs=False)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=11)
    a, b = (engine_generate(eng, prompts, 10, sampling=cfg).tokens for _ in range(2))
    assert a == b and a != greedy_generate(model, prompts, 10)
