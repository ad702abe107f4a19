"""Attention.prefill_cached (the exported prefill's attention: packed new tokens continuing from KV caches through
a per-sequence padded view) against a float64 per-sequence softmax over past + new tokens, eager."""
from __future__ import annotations

import pytest
import torch

from conftest import rel_err
from gdn_deploy.lm.attention import Attention, AttentionConfig
from gdn_deploy.lm.model import padded_view, sequence_of_tokens


@pytest.mark.parametrize("past,new", [([0, 0, 0], [5, 1, 9]), ([4, 0, 7], [5, 3, 1]), ([2], [1]),
                                      ([0, 3], [64, 65]), ([63, 1], [1, 63])])
@pytest.mark.parametrize("heads,kv", [(4, 2), (3, 3)])
def test_prefill_cached_matches_float64(past, new, heads, kv, gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    layer = Attention(16, AttentionConfig(num_heads=heads, num_kv_heads=kv, head_dim=8, rotary_dim=4)).double()
    N, D = len(past), 8
    S = max(p + max(new) for p in past) + 2
    full = [torch.randn(p + n, 16, dtype=torch.float64) for p, n in zip(past, new)]   # hidden of every position
    kc = torch.zeros(N, kv, S, D, dtype=torch.float64)
    vc = torch.zeros_like(kc)
    for i, (p, x) in enumerate(zip(past, full)):                  # the past rows a previous call wrote
        if p:
            _, k, v, _ = layer._qkv(x[:p], torch.arange(p))
            kc[i, :, :p], vc[i, :, :p] = k.transpose(0, 1), v.transpose(0, 1)
    x = torch.cat([f[p:] for p, f in zip(past, full)])
    pos = torch.cat([torch.arange(p, p + n) for p, n in zip(past, new)])
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    T = x.shape[0]
    seq = sequence_of_tokens(cu, T)
    local = torch.arange(T) - cu.long()[seq]
    y, kc2, vc2 = layer.prefill_cached(x, pos, seq, local, cu[:-1].long(), padded_view(cu), kc, vc)
    start = 0
    for i, (p, n) in enumerate(zip(past, new)):                  # float64 softmax over the whole sequence
        q, k, v, gate = layer._qkv(full[i], torch.arange(p + n))
        rep = heads // kv
        ks, vs = k.transpose(0, 1).repeat_interleave(rep, 0), v.transpose(0, 1).repeat_interleave(rep, 0)
        s = q.transpose(0, 1) @ ks.transpose(-1, -2) * layer.scaling
        s = s.masked_fill(torch.ones(p + n, p + n, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ vs).transpose(0, 1).reshape(p + n, -1)
        want = layer._out(o, gate)[p:]
        assert rel_err(y[start:start + n], want) < 1e-12
        assert torch.allclose(kc2[i, :, :p + n], k.transpose(0, 1)) and torch.allclose(vc2[i, :, :p + n],
                                                                                          v.transpose(0, 1))
        start += n
