"""The graphed decode engine on the GPU (gdn_deploy.runtime.cuda_engine): the Triton decode attention against the
torch path (float64-checked on CPU in tests/runtime/test_engine.py), the captured step against the eager step for
every family over batch buckets and reused slots, and greedy tokens against HF and the model's own eager path.

The reference eager step runs without the Triton glue kernels (gdn_deploy.lm.triton_ops off: the eager torch
ops) and without packed projections; the graphed step with them (the default) or fused by torch.compile. A batch
padded to its bucket may also make cuBLAS pick another GEMM algorithm, so graphed and eager logits are compared
within 1e-5 norm-relative (fp32), not bitwise.
"""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err

pytest.importorskip("transformers", reason="needs transformers (pip install -e .[test])")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.lm import triton_ops  # noqa: E402
from gdn_deploy.lm.generate import greedy_generate  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.runtime.cuda_engine import DecodeEngine, engine_generate  # noqa: E402
from gdn_deploy.runtime.decode_attention import decode_attention, triton_available  # noqa: E402
from gdn_deploy.runtime.engine_fast import FastLayerFns  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"]
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton not importable")


@needs_triton
@pytest.mark.parametrize("splits", [None, 1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H,Hkv,D", [(8, 2, 256), (4, 4, 64), (6, 2, 24)])
def test_triton_decode_attention_matches_torch(gen, dtype, H, Hkv, D, splits):
    """One program per (row, kv head) (splits=1), the sequence split in chunks (5, and the default: many chunks
    at this small batch); lengths inside one chunk, across chunks, and the whole capacity."""
    P, S, B = 9, 300, 7
    k_pool = torch.randn(P, Hkv, S, D, generator=gen).to("cuda", dtype)
    v_pool = torch.randn(P, Hkv, S, D, generator=gen).to("cuda", dtype)
    q = torch.randn(B, H, D, generator=gen).to("cuda", dtype)
    slots = torch.tensor([8, 0, 3, 5, 1, 2, 7], device="cuda")
    lens = torch.tensor([1, 63, 64, 65, 300, 17, 128], device="cuda")
    got = decode_attention(q, k_pool, v_pool, slots, lens, D ** -0.5, impl="triton", splits=splits)
    assert torch.isfinite(got).all()
    want = decode_attention(q.double(), k_pool.double(), v_pool.double(), slots, lens, D ** -0.5, impl="torch")
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(got.double(), want) < tol


def _models(family, gen, tmp_path):
    hf = tiny.build_saved(family, gen, tmp_path, gpu=True)
    return hf, load_hf_causal_lm(tmp_path).to("cuda")


class _Eager:
    """A DecodeEngine run with the Triton glue off at every call (the reference)."""

    def __init__(self, *a, **kw):
        with triton_ops.disabled():
            self.engine = DecodeEngine(*a, **kw)

    def __getattr__(self, name):
        fn = getattr(self.engine, name)

        def call(*a, **kw):
            with triton_ops.disabled():
                return fn(*a, **kw)
        return call


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_graphed_step_equals_eager(kernels, gen, family, fuse, tmp_path):
    """The graphed step (default: the Triton glue kernels and packed projections; or fused by torch.compile)
    against the eager step on torch ops alone."""
    _, model = _models(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    graphed = DecodeEngine(model, pool_size=8, capacity=160, graphs=True, fuse=fuse)
    assert isinstance(graphed.decoder.fns, FastLayerFns) != fuse
    eager = _Eager(model, pool_size=8, capacity=160, graphs=False)
    assert not isinstance(eager.engine.decoder.fns, FastLayerFns)
    assert sorted(graphed.decoder.graphs) == [1, 2, 4, 8]
    prompts = [torch.randint(0, V, (L,), generator=gen).tolist() for L in (1, 40, 130, 5, 64)]
    for eng in (graphed, eager):
        eng.add(prompts)
    # batches of 5 (bucket 8), 1, 3 (bucket 4), then slots 1 and 3 leave, a new prompt takes slot 3 (reused),
    # and a batch of 4 in scrambled order
    plan = [[0, 1, 2, 3, 4], [2], [4, 0, 1], "swap", [3, 0, 4, 2]]
    for batch in plan:
        if batch == "swap":
            new = torch.randint(0, V, (9,), generator=gen).tolist()
            for eng in (graphed, eager):
                eng.release([1, 3])
                assert eng.add([new])[0] == [3]
            continue
        ids = torch.randint(0, V, (len(batch),), generator=gen).cuda()
        for _ in range(3):
            a = graphed.step(batch, ids).clone()
            b = eager.step(batch, ids)
            assert rel_err(a, b) < 1e-5, (family, batch)
    for (ga, gb), (ea, eb) in zip(graphed.decoder.pools, eager.engine.decoder.pools):
        assert rel_err(ga[:8].float(), ea[:8].float()) < 1e-5 and rel_err(gb[:8].float(), eb[:8].float()) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_graphed_greedy_tokens_equal_eager_and_hf(kernels, gen, family, tmp_path):
    """Continuous batching on graphs (prompts joining at steps 0, 0, 2, 7) gives the tokens of the model's eager
    greedy path and of HF generate (fp32; a near-tie in HF's logits is the only allowed parting point)."""
    hf, model = _models(family, gen, tmp_path)
    V = model.hybrid_config.vocab_size
    prompts = [torch.randint(0, V, (L,), generator=gen).tolist() for L in (1, 40, 130, 7)]
    eng = DecodeEngine(model, pool_size=4, capacity=192, graphs=True)
    res = engine_generate(eng, prompts, 24, arrivals=[0, 0, 2, 7])
    with torch.no_grad():
        ref = greedy_generate(model, prompts, 24)
    hf.generation_config.eos_token_id = None
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=24, output_scores=True,
                              return_dict_in_generate=True, attention_mask=torch.ones(1, len(p), dtype=torch.long))
        want = out.sequences[0, len(p):].tolist()
        for j, (a, b) in enumerate(zip(res.tokens[i], want)):
            if a != b:
                top2 = torch.topk(out.scores[j][0].float(), 2).values
                assert float(top2[0] - top2[1]) < 1e-3, f"{family} prompt {i}: token {j} {a} vs HF {b}"
                break
        assert len(res.tokens[i]) == 24 and res.tokens[i][0] == ref[i][0]
