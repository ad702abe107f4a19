"""Random inputs of one prefill case and our launch's parameters, shared by bench_kernels.py (prefill section) and
bench_cp_phases.py, so that both time the same data: packed varlen bf16 q, k (T, Hk, K) and v (T, Hv, V), fp32 gates
g in [-0.51, -0.01] and beta in [0, 1) per (token, value head), cu_seqlens, a 0.1-scaled random initial state;
seeded (the same case gives the same tensors in every run and in both tools).
"""
from __future__ import annotations

import torch


def prefill_case_inputs(seqlens, Hk: int, Hv: int, K: int, V: int, seed: int = 7) -> dict:
    T, N = sum(seqlens), len(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k, v = r(T, Hk, K).bfloat16(), r(T, Hk, K).bfloat16(), r(T, Hv, V).bfloat16()
    g = -torch.rand(T, Hv, device="cuda", generator=gen) * 0.5 - 0.01
    beta = torch.rand(T, Hv, device="cuda", generator=gen)
    cu = torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    h0 = 0.1 * r(N, Hv, K, V)
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu=cu, h0=h0)


def ours_prefill_params(launch, x: dict):
    """Our prefill's launch parameters for inputs x (L2 norm in the op, gates as given, default scale) and the
    output tensors they name: (params, o, final_state)."""
    o, fs = torch.empty_like(x["v"]), torch.empty_like(x["h0"])
    p = launch.prefill_params(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu"], x["h0"], o, fs, gate_mode=0,
                              use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    return p, o, fs
