"""GDNConfig, GDNBlock and GDNLM: state hand-over (prefill then decode == one prefill), varlen packing,
state pools, dtypes, the shipped default model."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from gdn_deploy.model import GDNBlock, GDNConfig, GDNLM

LAYOUTS = ("qwen3_next", "qwen3_5")


def small_config(layout="qwen3_next", **kw):
    base = dict(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                projection_layout=layout, vocab_size=50, num_layers=2, intermediate_size=24)
    base.update(kw)
    return GDNConfig(**base)


def make_block(layout, seed, dtype=torch.float32):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        b = GDNBlock(small_config(layout))
        b.reset_parameters()
    return b.to(dtype).eval()


def make_lm(layout, seed, **kw):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = GDNLM(small_config(layout, **kw))
        m.reset_parameters()
    return m.eval()


def cu_of(lens):
    return torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)


def split_tokens(x, lens, k):
    """Per sequence: the first min(k, L) tokens (packed) and the rest (packed)."""
    cu = cu_of(lens).tolist()
    head = [x[cu[i]:cu[i] + min(k, L)] for i, L in enumerate(lens)]
    tail = [x[cu[i] + min(k, L):cu[i + 1]] for i, L in enumerate(lens)]
    return torch.cat(head), torch.cat(tail)


# ---- config --------------------------------------------------------------------------------------
def test_config_round_trip_and_conv_dim():
    c = small_config("qwen3_5")
    assert GDNConfig.from_dict(c.to_dict()) == c
    assert c.conv_dim == 2 * 2 * 16 + 4 * 8


@pytest.mark.parametrize("bad, msg", [
    (dict(num_v_heads=3), "not a multiple"),
    (dict(projection_layout="llama"), "projection_layout"),
    (dict(head_k_dim=0), "head_k_dim"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
    (dict(conv_kernel_size=1), "conv_kernel_size"),
])
def test_config_validation(bad, msg):
    with pytest.raises(ValueError, match=msg):
        small_config(**bad)


def test_config_from_dict_errors():
    d = small_config().to_dict()
    with pytest.raises(ValueError, match="unknown key"):
        GDNConfig.from_dict({**d, "heads": 3})
    d.pop("head_v_dim")
    with pytest.raises(ValueError, match="missing required key.*head_v_dim"):
        GDNConfig.from_dict(d)
    with pytest.raises(ValueError, match="vocab_size > 0"):
        GDNLM(small_config(vocab_size=0))


# ---- block ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_varlen_conv_matches_conv1d_with_initial_state(layout, seed, gen):
    """The gathered packed conv == F.conv1d on [initial conv state | sequence] for each sequence."""
    b = make_block(layout, seed)
    W, C = b.conv_kernel_size, b.conv_dim
    lens = [0, 1, 2, 5, 3]
    x = torch.randn(sum(lens), C, generator=gen)
    c0 = torch.randn(len(lens), C, W - 1, generator=gen)
    out, c1 = b._varlen_conv(x, cu_of(lens), c0)
    cu = cu_of(lens).tolist()
    for i, L in enumerate(lens):
        full = torch.cat([c0[i], x[cu[i]:cu[i + 1]].T], dim=1)            # [C, W-1+L]
        if L:
            ref = F.silu(F.conv1d(full[None], b.conv1d.weight, groups=C))[0].T  # [L, C]
            assert torch.allclose(out[cu[i]:cu[i + 1]], ref, atol=1e-6, rtol=1e-5)
        assert torch.equal(c1[i], full[:, -(W - 1):])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_prefill_then_decode_equals_prefill(layout, seed, gen):
    b = make_block(layout, seed)
    lens, K, M = [0, 1, 5, 9, 2], 4, 3
    full_lens = [L + M for L in lens]
    x = torch.randn(sum(full_lens), 32, generator=gen)
    with torch.no_grad():
        y_full, c_full, r_full = b.prefill(x, cu_of(full_lens))
        # sequence i: its first L tokens by prefill, then M tokens by decode
        cu = cu_of(full_lens).tolist()
        first = torch.cat([x[cu[i]:cu[i] + L] for i, L in enumerate(lens)])
        y1, c, r = b.prefill(first, cu_of(lens))
        ys = []
        for t in range(M):
            xt = torch.stack([x[cu[i] + L + t] for i, L in enumerate(lens)])
            yt, c, r = b.decode(xt, c, r)
            ys.append(yt)
    ref_dec = torch.stack([torch.stack([y_full[cu[i] + L + t] for i, L in enumerate(lens)]) for t in range(M)])
    ref_pre = torch.cat([y_full[cu[i]:cu[i] + L] for i, L in enumerate(lens)])
    assert rel_err(y1, ref_pre) < 1e-5
    assert rel_err(torch.stack(ys), ref_dec) < 1e-5
    assert rel_err(c, c_full) < 1e-6  # conv state = projected inputs (matmul rounding differs by batch shape)
    assert rel_err(r, r_full) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_two_prefills_equal_one(layout, seed, gen):
    """Chained prefill (conv + recurrent state hand-over), split points shorter than the conv window."""
    b = make_block(layout, seed)
    lens = [0, 1, 2, 3, 8, 13]
    x = torch.randn(sum(lens), 32, generator=gen)
    with torch.no_grad():
        y_full, c_full, r_full = b.prefill(x, cu_of(lens))
        head, tail = split_tokens(x, lens, 2)
        k_lens = [min(2, L) for L in lens]
        y1, c, r = b.prefill(head, cu_of(k_lens))
        y2, c, r = b.prefill(tail, cu_of([L - k for L, k in zip(lens, k_lens)]), c, r)
    h_ref, t_ref = split_tokens(y_full, lens, 2)
    assert rel_err(y1, h_ref) < 1e-5 and rel_err(y2, t_ref) < 1e-5
    assert rel_err(c, c_full) < 1e-6 and rel_err(r, r_full) < 1e-5


def test_packed_sequences_are_independent(seed, gen):
    b = make_block("qwen3_next", seed)
    lens = [4, 0, 7]
    x = torch.randn(11, 32, generator=gen)
    c0 = torch.randn(3, b.conv_dim, 3, generator=gen)
    r0 = torch.randn(3, 4, 16, 8, generator=gen)
    with torch.no_grad():
        y, c, r = b.prefill(x, cu_of(lens), c0, r0)
        for i, (s, L) in enumerate(((0, 4), (4, 0), (4, 7))):
            yi, ci, ri = b.prefill(x[s:s + L], cu_of([L]), c0[i:i + 1], r0[i:i + 1])
            assert rel_err(yi, y[s:s + L]) < 1e-6 and torch.equal(ci, c[i:i + 1]) and rel_err(ri, r[i:i + 1]) < 1e-6
    assert torch.equal(c[1], c0[1]) and torch.equal(r[1], r0[1])  # empty sequence: states pass through


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_pool_equals_decode(layout, seed, gen):
    b = make_block(layout, seed)
    P, B = 6, 4
    conv_pool = torch.randn(P, b.conv_dim, 3, generator=gen)
    rec_pool = torch.randn(P, 4, 16, 8, generator=gen)
    slots = torch.tensor([3, -1, 0, 5], dtype=torch.int32)
    x = torch.randn(B, 32, generator=gen)
    cp, rp = conv_pool.clone(), rec_pool.clone()
    with torch.no_grad():
        y = b.decode_pool(x, cp, rp, slots)
        used = [0, 2, 3]
        rows = slots[used].long()
        y_ref, c_ref, r_ref = b.decode(x[used], conv_pool[rows], rec_pool[rows])
    assert rel_err(y[used], y_ref) < 1e-6
    assert torch.equal(y[1], torch.zeros(32))
    assert rel_err(cp[rows], c_ref) < 1e-6 and rel_err(rp[rows], r_ref) < 1e-6
    untouched = [1, 2, 4]
    assert torch.equal(cp[untouched], conv_pool[untouched]) and torch.equal(rp[untouched], rec_pool[untouched])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_block_half_precision(dtype, seed, gen):
    """Same weights in half precision vs fp32 (smoke bounds). The gated RMSNorm of a head output that nearly
    cancels amplifies rounding, so single tokens can be far off: the typical token is checked tightly, the
    whole loosely (over 600 random cases: median <= 1.1e-2, whole <= 7.3e-2, state <= 1.2e-2)."""
    b32 = make_block("qwen3_next", seed)
    b = make_block("qwen3_next", seed, dtype)
    lens = [40, 0, 24]
    x = torch.randn(64, 32, generator=gen)
    with torch.no_grad():
        y32, c32, r32 = b32.prefill(x, cu_of(lens))
        y, c, r = b.prefill(x.to(dtype), cu_of(lens))
        yd, cd, rd = b.decode(torch.randn(3, 32, generator=gen).to(dtype), c, r)
    assert y.dtype == dtype and c.dtype == dtype and r.dtype == torch.float32
    assert yd.dtype == dtype and cd.dtype == dtype and rd.dtype == torch.float32
    per_token = (y.float() - y32).norm(dim=1) / y32.norm(dim=1)
    assert float(per_token.median()) < 2.5e-2 and rel_err(y, y32) < 0.25 and rel_err(r, r32) < 3e-2


# ---- LM ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lm_prefill_then_decode_equals_prefill(layout, seed, gen):
    m = make_lm(layout, seed)
    lens, M = [0, 1, 6, 3], 3
    full = [L + M for L in lens]
    ids = torch.randint(0, 50, (sum(full),), generator=gen)
    cu = cu_of(full).tolist()
    with torch.no_grad():
        lg_full, c_full, r_full = m.prefill(ids, cu_of(full))
        first = torch.cat([ids[cu[i]:cu[i] + L] for i, L in enumerate(lens)])
        lg1, c, r = m.prefill(first, cu_of(lens))
        outs = []
        for t in range(M):
            lg, c, r = m.decode(torch.stack([ids[cu[i] + L + t] for i, L in enumerate(lens)]), c, r)
            outs.append(lg)
    ref = torch.stack([torch.stack([lg_full[cu[i] + L + t] for i, L in enumerate(lens)]) for t in range(M)])
    assert lg_full.shape == (sum(full), 50)
    assert rel_err(torch.stack(outs), ref) < 1e-5
    assert len(c) == len(r) == 2
    for a, b_ in zip(r, r_full):
        assert rel_err(a, b_) < 1e-5


def test_lm_untied_head_and_decode_pool(seed, gen):
    m = make_lm("qwen3_5", seed, tie_word_embeddings=False)
    assert m.lm_head is not None and "lm_head.weight" in m.state_dict()
    cs, rs = m.init_states(5)
    slots = torch.tensor([4, 1], dtype=torch.int32)
    ids = torch.randint(0, 50, (2,), generator=gen)
    with torch.no_grad():
        lg_pool = m.decode_pool(ids, cs, rs, slots)
        lg, c, r = m.decode(ids, *m.init_states(2))
    assert rel_err(lg_pool, lg) < 1e-6
    for pool, new in zip(cs, c):
        assert rel_err(pool[slots.long()], new) < 1e-6 and not pool[[0, 2, 3]].any()


# ---- shipped default model -----------------------------------------------------------------------
def test_default_model_file_matches_regeneration():
    from gdn_deploy.checkpoint import load_checkpoint
    from gdn_deploy.models import default_model_path
    from gdn_deploy.models.make_default import build_default_model
    path = default_model_path()
    assert path.is_file() and path.stat().st_size < 1_000_000
    shipped = load_checkpoint(path)
    fresh = build_default_model()
    assert shipped.config == fresh.config
    c = shipped.config
    assert (c.vocab_size, c.hidden_size, c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim, c.num_layers) \
        == (256, 128, 1, 2, 64, 64, 2)
    a, b = shipped.state_dict(), fresh.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k


def test_default_model_activations_stay_sane_over_1000_tokens(gen):
    from gdn_deploy.models import load_default_model
    m = load_default_model()
    ids = torch.randint(0, 256, (1000,), generator=gen)
    with torch.no_grad():
        lg, _, rs = m.prefill(ids, cu_of([1000]))
    assert torch.isfinite(lg).all()
    stds = [float(lg[i:i + 100].std()) for i in range(0, 1000, 100)]
    assert all(0.3 < s < 3.0 for s in stds), stds          # neither vanishing nor exploding
    assert max(stds) / min(stds) < 1.5, stds                  # no drift along the sequence
    assert all(torch.isfinite(r).all() and float(r.norm()) < 1e3 for r in rs)
