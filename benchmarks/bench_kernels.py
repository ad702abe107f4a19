"""Benchmark the gdn CUDA kernels side by side with FLA (fla-core) and plain PyTorch, in one run.

  python benchmarks/bench_kernels.py [--out DIR] [--sections ceilings,decode,verify,prefill] [--quick]

Measures the two ceilings first (device-to-device copy bandwidth counting bytes read + written;
bf16 matmul TFLOP/s on random data), then:
- decode (one token per sequence, bf16 I/O, fp32 gates and state, in-kernel L2 norm): ours (automatic
  V-tile and each forced tile; dense and pool-in-place), FLA fused_recurrent_gated_delta_rule, plain
  torch recurrence; timed as CUDA-graph replays over enough rotating buffer sets to defeat L2.
  Reports us/call, GB/s, fraction of copy bandwidth, speedup vs FLA.
- verify (speculative decoding, Qwen3-Next shapes, T = 1, 2, 4, 8 draft tokens per sequence at B = 1, 8, 64, pool
  slots): gdn::verify and the commit of all T tokens, as fractions of copy bandwidth over their byte floors
  (verify: state read once + token I/O + factors; commit: state read + written + factors), beside decode at T = 1.
- prefill (packed varlen): ours (when the prefill kernel is built), FLA chunk_gated_delta_rule with
  cu_seqlens; reports ms, fraction of the bandwidth floor and of matmul throughput, speedup vs FLA.
  Every case also times ours_prev (the scan the automatic choice picked before the context-parallel scan: the
  A/B, same run); shard shapes (few heads per GPU after tensor parallelism, K = V = 64 / 256, varlen) and
  single-sequence cases also ours_cpauto (scan cp, pass 1 on mma.sync, automatic G: the automatic choice before
  cp_wg) and ours_cpG / ours_cpwgG (forced to G segments per sequence, --cp-segments; pass 1 on mma.sync / on
  wgmma).
  ms is GPU time: per call, the union of the device intervals recorded by the torch profiler (kernels
  that overlap count once; host launch latency and GPU idle gaps excluded), median of 7 calls; FLA's
  Python launches ~1.1-1.3 ms of host work per call, more than its GPU time below 1x16K, so timing
  with host sync would credit us with FLA's host overhead. Also reported: ms_sync (CUDA events around
  each call on an idle GPU, host launch latency included; the earlier method) and, for ours, ms_graph
  (one CUDA-graph replay), which should agree with ms.
- FlashInfer (optional peer, SM90 only, --no-flashinfer to skip): flashinfer.gdn_prefill.chunk_gated_delta_rule
  (CuTe-DSL Hopper kernel) on the same prefill inputs (alpha = exp(g), [N, H, V, K] states), timed like FLA after one
  compiling call; rows get speedup_vs_flashinfer. Absent or failing: one log line, the run goes on.
Every case also compares our output with FLA's and FlashInfer's (rel err) to show the same function is timed.
Results: CSV + JSON in --out (default $OUT if set, else results/).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn_deploy import ops  # noqa: E402,F401  (registers torch.ops.gdn.*)
from prefill_inputs import ours_prefill_params, prefill_case_inputs  # noqa: E402  (benchmarks/prefill_inputs.py)

ROWS: list[dict] = []


def log(*a):
    print(*a, flush=True)


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    d = float(b.norm())
    return float((a - b).norm()) / d if d else float((a - b).norm())


def time_events(fn, reps=10, warmup=2) -> float:
    """Median milliseconds of fn() over reps, with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def time_queued(fn, reps=20, warmup=3) -> float:
    """Median milliseconds of fn() from CUDA events recorded around each call with no host sync between the
    calls: while the host enqueues faster than the GPU runs, each pair measures GPU time alone (no launch
    latency on an idle GPU). Not for functions whose host work exceeds their GPU time (FLA below 1x16K)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def time_graph(calls, reps=20) -> float:
    """Capture all `calls` (one per rotating buffer set) in one CUDA graph; median ms per call."""
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return time_events(g.replay, reps=reps, warmup=3) / len(calls)


def gpu_busy_ms(fn, reps=7) -> float | None:
    """Median GPU time of one call of fn: the union of the device intervals (kernels, memsets, copies) that
    the torch profiler (CUPTI) records for the call, so host launch latency and gaps while the GPU waits
    on the host are excluded and kernels that overlap count once. Each call is profiled on its own after a
    synchronize. None when the profiler is unavailable."""
    try:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(reps):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            iv = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
            total, cur = 0, None
            for a, b in iv:
                if cur is None or a > cur[1]:
                    total += 0 if cur is None else cur[1] - cur[0]
                    cur = [a, b]
                else:
                    cur[1] = max(cur[1], b)
            total += 0 if cur is None else cur[1] - cur[0]
            if total > 0:
                per_call.append(total / 1e3)
        return statistics.median(per_call) if per_call else None
    except Exception as e:  # noqa: BLE001
        log(f"  gpu_busy_ms failed: {type(e).__name__}: {e}")
        return None


def time_graph_one(fn, reps=20) -> float | None:
    """Median ms of one CUDA-graph replay of fn (captured after a warm-up on a side stream); None when fn
    cannot be captured (e.g. it synchronises with the host)."""
    try:
        return time_graph([fn], reps=reps)
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        log(f"  graph capture failed: {type(e).__name__}: {str(e)[:120]}")
        return None


def kernel_us(calls, pattern: str) -> float | None:
    """Median device duration (us) of the kernels whose name contains `pattern`, one eager pass over
    `calls` under the torch profiler (CUPTI): kernel time alone, without launch gaps."""
    try:
        from torch.profiler import ProfilerActivity, profile
        for c in calls[:2]:
            c()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for c in calls:
                c()
            torch.cuda.synchronize()
        d = [e.time_range.elapsed_us() for e in prof.events() if pattern in e.name]
        return statistics.median(d) if d else None
    except Exception as e:  # noqa: BLE001
        log(f"  kernel_us({pattern}) failed: {type(e).__name__}: {e}")
        return None


# ------------------------------------------------------------------------------------------------ ceilings
def ceilings(quick: bool) -> dict:
    n = (1 << 28) if not quick else (1 << 26)  # float32 elements: 1 GiB (256 MiB quick)
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = time_events(lambda: dst.copy_(src), reps=10)
    copy_bw = 2 * n * 4 / (ms * 1e-3)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    ms_mm = time_events(lambda: a @ b, reps=10, warmup=3)
    tflops = 2 * m ** 3 / (ms_mm * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    res = dict(copy_GBps=copy_bw / 1e9, matmul_bf16_TFLOPs=tflops)
    log(f"[ceilings] copy {copy_bw / 1e9:.0f} GB/s (read+write), bf16 matmul {tflops:.0f} TFLOP/s")
    ROWS.append(dict(section="ceilings", case="copy+matmul", impl="torch", ms=ms, **res))
    return res


# ------------------------------------------------------------------------------------------------ decode
def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        log(f"[fla] unavailable: {type(e).__name__}: {e}")
        return None, None


def _flashinfer():
    """FlashInfer's chunked GDN prefill (SM90 CuTe-DSL kernel) when importable on an SM90 GPU, else None."""
    try:
        if torch.cuda.get_device_capability()[0] != 9:
            log(f"[flashinfer] skipped: GPU is SM{''.join(map(str, torch.cuda.get_device_capability()))}, not SM90")
            return None
        import flashinfer
        from flashinfer import gdn_kernels
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
        if gdn_kernels.chunk_gated_delta_rule_sm90 is None:  # flashinfer hides the reason: import it again to see it
            import flashinfer.gdn_kernels.delta_rule_dsl  # noqa: F401
            raise RuntimeError("flashinfer's SM90 prefill kernel did not import")
        log(f"[flashinfer] {flashinfer.__version__} from {os.path.dirname(flashinfer.__file__)}")
        return chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        log(f"[flashinfer] unavailable: {type(e).__name__}: {e}")
        return None


def _l2n(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def torch_decode(q, k, v, g, beta, state, out_state):
    """The recurrence in plain torch (fp32 math, L2 norm, scale 1/sqrt(K), GVA), graph-capturable."""
    rep = v.shape[1] // q.shape[1]
    qf = (_l2n(q.float()) * q.shape[-1] ** -0.5).repeat_interleave(rep, 1)
    kf = _l2n(k.float()).repeat_interleave(rep, 1)
    S = state * g.float().exp()[..., None, None]
    delta = (v.float() - torch.einsum("bhk,bhkv->bhv", kf, S)) * beta.float()[..., None]
    S = S + kf[..., None] * delta[..., None, :]
    out_state.copy_(S)
    return torch.einsum("bhk,bhkv->bhv", qf, S).to(v.dtype)


def decode_inputs(B, Hk, Hv, K, V, pool=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    d = dict(q=r(B, Hk, K).bfloat16(), k=r(B, Hk, K).bfloat16(), v=r(B, Hv, V).bfloat16(),
             g=-torch.rand(B, Hv, device="cuda", generator=gen) * 0.5 - 0.01,
             beta=torch.rand(B, Hv, device="cuda", generator=gen))
    P = 2 * B if pool else B
    d["state"] = 0.1 * r(P, Hv, K, V)
    if pool:
        d["slots"] = torch.randperm(P, device="cuda", generator=gen)[:B].to(torch.int32)
    return d


def decode_bytes(B, Hk, Hv, K, V):
    return B * (2 * Hv * K * V * 4 + 2 * Hk * K * 2 + 2 * Hv * V * 2 + 2 * Hv * 4)


def bench_decode(ceil: dict, quick: bool, kernels, fla_rec):
    shapes = [("qwen3next", 16, 32, 128, 128), ("h16_d64", 16, 16, 64, 64), ("h16_d256", 16, 16, 256, 256)]
    batches = [1, 8, 64, 256] if not quick else [1, 64]
    attrs = dict(gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    for name, Hk, Hv, K, V in shapes:
        for B in batches:
            nbytes = decode_bytes(B, Hk, Hv, K, V)
            nsets = max(2, min(64, math.ceil(256e6 / nbytes)))
            sets = [decode_inputs(B, Hk, Hv, K, V, seed=i) for i in range(nsets)]
            outs = [dict(o=torch.empty_like(s["v"]), s=torch.empty_like(s["state"])) for s in sets]
            case = f"{name} B={B}"
            res, kern = {}, {}

            if kernels is not None:
                L = kernels.launch

                def ours(s, o, bv=0):
                    p = L.decode_params(s["q"], s["k"], s["v"], s["g"], s["beta"], s["state"], o["s"], o["o"],
                                        state_mode=0, **attrs)
                    return lambda: L.launch_decode(kernels.LIB, p, s["q"].device, bv)

                for tag, bv in (("ours", 0), ("ours_bv8", 8), ("ours_bv16", 16), ("ours_bv32", 32), ("ours_bv64", 64)):
                    res[tag] = time_graph([ours(s, o, bv) for s, o in zip(sets, outs)])
                    kern[tag] = kernel_us([ours(s, o, bv) for s, o in zip(sets, outs)], "gdnDecodeKernel")
                ours(sets[0], outs[0])()
                o_ours, s_ours = outs[0]["o"].clone(), outs[0]["s"].clone()
                # float64 reference on the first set (small batches only: the reference loops over B)
                if B <= 8:
                    from gdn_deploy.reference import decode_ref
                    s0 = sets[0]
                    ro, rs = decode_ref(*(s0[n].double() for n in ("q", "k", "v", "g", "beta", "state")),
                                        state_mode=0, **attrs)
                    log(f"  [{case}] ours vs fp64 ref: o {rel_err(o_ours, ro):.2e} state {rel_err(s_ours, rs):.2e}")
                # pool in place (half the pool rows used; a new pool per set)
                psets = [decode_inputs(B, Hk, Hv, K, V, pool=True, seed=100 + i) for i in range(nsets)]
                pouts = [torch.empty_like(s["v"]) for s in psets]

                def ours_pool(s, o):
                    p = L.decode_params(s["q"], s["k"], s["v"], s["g"], s["beta"], s["state"], s["state"], o,
                                        s["slots"], state_mode=1, **attrs)
                    return lambda: L.launch_decode(kernels.LIB, p, s["q"].device, 0)

                res["ours_pool"] = time_graph([ours_pool(s, o) for s, o in zip(psets, pouts)])
                del psets, pouts

            if fla_rec is not None:
                def fla(s, o):
                    def run():
                        oo, ss = fla_rec(s["q"][:, None], s["k"][:, None], s["v"][:, None], s["g"][:, None],
                                         beta=s["beta"][:, None], initial_state=s["state"], output_final_state=True,
                                         use_qk_l2norm_in_kernel=True)
                        o["o"].copy_(oo[:, 0])
                        o["s"].copy_(ss)
                    return run
                try:
                    fla(sets[0], outs[0])()
                    if kernels is not None:
                        log(f"  [{case}] ours vs FLA: o {rel_err(o_ours, outs[0]['o']):.2e} "
                            f"state {rel_err(s_ours, outs[0]['s']):.2e}")
                    # FLA allocates its outputs; time the call alone (the copies above are for the check)
                    def fla_only(s):
                        return lambda: fla_rec(s["q"][:, None], s["k"][:, None], s["v"][:, None], s["g"][:, None],
                                               beta=s["beta"][:, None], initial_state=s["state"],
                                               output_final_state=True, use_qk_l2norm_in_kernel=True)
                    res["fla"] = time_graph([fla_only(s) for s in sets])
                    kern["fla"] = kernel_us([fla_only(s) for s in sets], "fused_recurrent_gated_delta_rule")
                except Exception as e:  # noqa: BLE001
                    log(f"  [{case}] FLA failed: {type(e).__name__}: {e}")

            res["torch"] = time_graph([(lambda s=s, o=o: torch_decode(s["q"], s["k"], s["v"], s["g"], s["beta"],
                                                                       s["state"], o["s"])) for s, o in
                                       zip(sets[:4], outs[:4])], reps=5)
            for impl, ms in res.items():
                gbps = nbytes / (ms * 1e-3) / 1e9
                row = dict(section="decode", case=case, impl=impl, ms=ms, us=ms * 1e3, GBps=gbps,
                           frac_copy_bw=gbps / ceil["copy_GBps"], bytes=nbytes, rotating_sets=nsets)
                if "fla" in res:
                    row["speedup_vs_fla"] = res["fla"] / ms
                if kern.get(impl) is not None:
                    row["kernel_us"] = kern[impl]
                ROWS.append(row)
            log(f"[decode {case}] kernel-only us: " + " ".join(f"{i}={v:.2f}" for i, v in kern.items() if v))
            log(f"[decode {case}] " + "  ".join(
                f"{i}={ms * 1e3:.2f}us({nbytes / (ms * 1e-3) / 1e9 / ceil['copy_GBps']:.2f}bw)" for i, ms in res.items()))
            del sets, outs
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ verify
def verify_bytes(B, T, Hk, Hv, K, V):
    """Bytes a verify of T tokens per sequence must move: the state read once, bf16 q/k/v/o, fp32 gates and the
    fp32 commit factors (k [Hk,K], delta [Hv,V], g [Hv]) written."""
    per_tok = 2 * Hk * K * 2 + 2 * Hv * V * 2 + 2 * Hv * 4 + (Hk * K + Hv * V + Hv) * 4
    return B * (Hv * K * V * 4 + T * per_tok)


def bench_verify(ceil: dict, quick: bool, kernels):
    """gdn::verify (T draft tokens per sequence, pool slots) and the commit of all T, beside decode (T = 1)."""
    if kernels is None:
        return
    from gdn_deploy.kernels import speculative as sp
    Hk, Hv, K, V = 16, 32, 128, 128
    attrs = dict(gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    for B in ([1, 8, 64] if not quick else [1, 64]):
        for T in (1, 2, 4, 8):
            nbytes = verify_bytes(B, T, Hk, Hv, K, V)
            nsets = max(2, min(64, math.ceil(256e6 / (B * Hv * K * V * 4))))
            sets = []
            for i in range(nsets):
                d = decode_inputs(B * T, Hk, Hv, K, V, seed=200 + i)
                d["state"] = d["state"][:B].contiguous()
                d["cu"] = torch.arange(0, B * T + 1, T, dtype=torch.int32, device="cuda")
                d["slots"] = torch.arange(B, dtype=torch.int32, device="cuda")
                d["o"] = torch.empty_like(d["v"])
                d["ck"] = torch.empty(d["k"].shape, device="cuda")
                d["cd"] = torch.empty(d["v"].shape, device="cuda")
                d["cg"] = torch.empty(d["g"].shape, device="cuda")
                d["acc"] = torch.full((B,), T, dtype=torch.int32, device="cuda")
                sets.append(d)

            def verify(d):
                p = sp.verify_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu"], d["state"], d["slots"],
                                     None, None, d["o"], d["ck"], d["cd"], d["cg"], state_mode=1, **attrs)
                return lambda: sp.launch_verify(kernels.LIB, p, d["q"].device)

            def commit(d):
                p = sp.commit_params(d["state"], d["ck"], d["cd"], d["cg"], d["cu"], d["acc"], d["slots"],
                                     state_mode=1)
                return lambda: sp.launch_commit(kernels.LIB, p, d["q"].device)

            res = {"verify": time_graph([verify(d) for d in sets]), "commit": time_graph([commit(d) for d in sets])}
            floors = {"verify": nbytes, "commit": B * (2 * Hv * K * V * 4 + T * (Hk * K + Hv * V + Hv) * 4)}
            if T == 1:
                L = kernels.launch

                def dec(d):
                    p = L.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["state"], d["o"],
                                        d["slots"], state_mode=1, **attrs)
                    return lambda: L.launch_decode(kernels.LIB, p, d["q"].device, 0)

                res["decode"] = time_graph([dec(d) for d in sets])
                floors["decode"] = decode_bytes(B, Hk, Hv, K, V)
            case = f"qwen3next B={B} T={T}"
            for impl, ms in res.items():
                gbps = floors[impl] / (ms * 1e-3) / 1e9
                ROWS.append(dict(section="verify", case=case, impl=impl, ms=ms, us=ms * 1e3, GBps=gbps,
                                 frac_copy_bw=gbps / ceil["copy_GBps"], bytes=floors[impl], rotating_sets=nsets))
            log(f"[verify {case}] " + "  ".join(
                f"{i}={ms * 1e3:.2f}us({floors[i] / (ms * 1e-3) / 1e9 / ceil['copy_GBps']:.2f}bw)"
                for i, ms in res.items()))
            del sets
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ prefill
def prefill_flops(T, Hv, K, V, C=64):
    return 2.0 * T * Hv * (2 * C * K + C * (K + V) + C * V + 3 * K * V)


def prefill_bytes(T, N, Hk, Hv, K, V):
    return T * (2 * Hk * K * 2 + 2 * Hv * V * 2 + 2 * Hv * 4) + 2 * N * Hv * K * V * 4


SHARD_CASES = [  # (name, seqlens, (Hk, Hv, K, V))
    ("shard Hk2Hv8 1x64K", [65536], (2, 8, 128, 128)), ("shard Hk2Hv8 1x8K", [8192], (2, 8, 128, 128)),
    ("shard Hk4Hv8 1x64K", [65536], (4, 8, 128, 128)), ("shard Hk4Hv8 1x8K", [8192], (4, 8, 128, 128)),
    ("shard Hk4Hv16 1x64K", [65536], (4, 16, 128, 128)), ("shard Hk4Hv16 1x8K", [8192], (4, 16, 128, 128)),
    ("shard Hk4Hv16 1x4K", [4096], (4, 16, 128, 128)), ("shard Hk2Hv8 2x4K", [4096] * 2, (2, 8, 128, 128)),
    ("shard Hk2Hv8 8x4K", [4096] * 8, (2, 8, 128, 128)), ("shard Hk2Hv8 1x4K", [4096], (2, 8, 128, 128)),
    ("shard d64 Hk4Hv8 1x64K", [65536], (4, 8, 64, 64)), ("shard d64 Hk4Hv8 1x8K", [8192], (4, 8, 64, 64)),
    ("shard d64 Hk4Hv8 1x4K", [4096], (4, 8, 64, 64)),
    ("shard d256 Hk2Hv4 1x64K", [65536], (2, 4, 256, 256)), ("shard d256 Hk2Hv4 1x8K", [8192], (2, 4, 256, 256)),
    ("shard Hk2Hv8 16x1K", [1024] * 16, (2, 8, 128, 128)),
    ("shard Hk2Hv8 ragged", [1, 63, 64, 65, 1000, 3000, 17, 2048, 129, 4096], (2, 8, 128, 128)),
]


def _prev_scan(kernels, N, Hv, K, V) -> str:
    """The scan the automatic choice picked before the context-parallel scan (gdnPrefill.cu pickPrefillScan)."""
    if K > 128 or not kernels.launch.prefill_scan_runs(kernels.LIB, "wgmma", K):
        return "mma4"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return "wgmma_beside" if 2 * N * Hv * (V // 64) <= sms else "wgmma"


def bench_prefill(ceil: dict, quick: bool, kernels, fla_chunk, cases_filter: str = "", cp_segments=(4, 8, 16),
                  fi_chunk=None, scans=()):
    cases = [("qwen3next 1x4K", [4096]), ("qwen3next 1x16K", [16384]), ("qwen3next 16x1K", [1024] * 16),
             ("qwen3next ragged", [1, 63, 64, 65, 1000, 3000, 17, 2048, 129, 4096])]
    if not quick:
        cases.insert(2, ("qwen3next 1x64K", [65536]))
    shape = dict(qwen3next=(16, 32, 128, 128))
    extra = [("h16_d64 1x16K", [16384], (16, 16, 64, 64)), ("h16_d256 1x16K", [16384], (16, 16, 256, 256))]
    todo = [(n, sl, shape["qwen3next"]) for n, sl in cases] + ([] if quick else extra) + SHARD_CASES
    if cases_filter:
        filters = cases_filter.split(",")  # cases run in the order of the filters they match first
        rank = {c[0]: min((i for i, f in enumerate(filters) if f in c[0]), default=-1) for c in todo}
        todo = sorted((c for c in todo if rank[c[0]] >= 0), key=lambda c: rank[c[0]])
    have_ours = kernels is not None and kernels.HAS_PREFILL
    if kernels is not None and not kernels.HAS_PREFILL:
        log(f"[prefill] ours unavailable: {kernels.PREFILL_UNAVAILABLE_REASON}")
    for name, seqlens, (Hk, Hv, K, V) in todo:
        T, N = sum(seqlens), len(seqlens)
        x = prefill_case_inputs(seqlens, Hk, Hv, K, V)
        q, k, v, g, beta, cu, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "cu", "h0"))
        res, sync, graph, o_ours = {}, {}, {}, None  # GPU ms (primary), per-call ms with sync, graph replay
        if have_ours:
            L = kernels.launch
            p, o, fs = ours_prefill_params(L, x)
            nb = L.prefill_workspace_bytes(kernels.LIB, p)
            ws = torch.empty(nb, dtype=torch.uint8, device="cuda") if nb else None
            def ours():
                L.launch_prefill(kernels.LIB, p, ws, q.device)
            try:
                res["ours"] = gpu_busy_ms(ours)
                sync["ours"] = time_events(ours, reps=10)
                graph["ours"] = time_graph_one(ours)
                o_ours, s_ours = o.clone(), fs.clone()
            except Exception as e:  # noqa: BLE001
                log(f"  [{name}] ours failed: {type(e).__name__}: {e}")
            variants = {"ours_prev": dict(scan=_prev_scan(kernels, N, Hv, K, V))}
            variants.update({f"ours_{s}": dict(scan=s) for s in scans})
            if name.startswith("shard") or N == 1:
                variants["ours_cpauto"] = dict(scan="cp", segments=0)  # pass 1 on mma.sync, automatic G
                variants.update({f"ours_cp{G}": dict(scan="cp", segments=G) for G in cp_segments})
                if K <= 128:  # pass 1 on wgmma too
                    variants.update({f"ours_cpwg{G}": dict(scan="cp_wg", segments=G) for G in cp_segments})
            for tag, kw in variants.items():
                try:
                    wsv = torch.empty(L.prefill_workspace_bytes(kernels.LIB, p, kw.get("segments")),
                                      dtype=torch.uint8, device="cuda")
                    run = lambda wsv=wsv, kw=kw: L.launch_prefill(kernels.LIB, p, wsv, q.device, **kw)  # noqa: E731
                    run()
                    torch.cuda.synchronize()
                    if o_ours is not None:
                        log(f"  [{name}] {tag} ({kw}) vs ours: o {rel_err(o, o_ours):.2e} state {rel_err(fs, s_ours):.2e}")
                    res[tag] = gpu_busy_ms(run)
                    graph[tag] = time_graph_one(run)
                    del wsv
                except Exception as e:  # noqa: BLE001
                    log(f"  [{name}] {tag} failed: {type(e).__name__}: {e}")
        if fla_chunk is not None:
            cu64 = cu.long()

            def fla():
                return fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=h0,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu64)
            try:
                fo, fsf = fla()
                res["fla"] = gpu_busy_ms(fla)
                sync["fla"] = time_events(fla, reps=10)
                if o_ours is not None:
                    log(f"  [{name}] ours vs FLA: o {rel_err(o_ours, fo[0]):.2e} state {rel_err(s_ours, fsf):.2e}")
            except Exception as e:  # noqa: BLE001
                log(f"  [{name}] FLA failed: {type(e).__name__}: {e}")
        if fi_chunk is not None:
            # FlashInfer: same q/k/v/cu (GVA: Hv > Hk), fp32 beta, its native linear decay alpha = exp(g) made
            # outside the timed call (gate_domain="log" would add an exp per call); its states are [N, H, V, K]
            # (ours [N, H, K, V]); L2 norm eps 1e-6 and default scale 1/sqrt(K), as ours.
            alpha, h0_vk, fi_o = g.exp(), h0.transpose(-1, -2).contiguous(), torch.empty_like(v)
            fi_s = torch.empty_like(h0_vk)

            def flashinfer():
                return fi_chunk(q, k, v, alpha, beta, initial_state=h0_vk, output_final_state=True, cu_seqlens=cu,
                                use_qk_l2norm_in_kernel=True, output=fi_o, output_state=fi_s)
            try:
                flashinfer()  # compiles the CuTe-DSL kernel on first use
                torch.cuda.synchronize()
                if o_ours is not None:
                    log(f"  [{name}] ours vs FlashInfer: o {rel_err(o_ours, fi_o):.2e} "
                        f"state {rel_err(s_ours, fi_s.transpose(-1, -2)):.2e}")
                res["flashinfer"] = gpu_busy_ms(flashinfer)
                sync["flashinfer"] = time_events(flashinfer, reps=10)
            except Exception as e:  # noqa: BLE001
                log(f"  [{name}] FlashInfer failed: {type(e).__name__}: {e}")
            del alpha, h0_vk, fi_o, fi_s
        nbytes, flops = prefill_bytes(T, N, Hk, Hv, K, V), prefill_flops(T, Hv, K, V)
        bw_floor = nbytes / (ceil["copy_GBps"] * 1e9) * 1e3
        mm_floor = flops / (ceil["matmul_bf16_TFLOPs"] * 1e12) * 1e3
        res = {i: ms for i, ms in res.items() if ms}
        for impl, ms in res.items():
            row = dict(section="prefill", case=name, impl=impl, ms=ms, tokens=T, bytes=nbytes, flops=flops,
                       frac_bw_floor=bw_floor / ms, frac_tensor=mm_floor / ms, floor_ms=max(bw_floor, mm_floor))
            if impl in sync:
                row["ms_sync"] = sync[impl]
            if graph.get(impl):
                row["ms_graph"] = graph[impl]
            if "fla" in res:
                row["speedup_vs_fla"] = res["fla"] / ms
                if impl in sync and "fla" in sync:
                    row["speedup_vs_fla_sync"] = sync["fla"] / sync[impl]
            if "flashinfer" in res:
                row["speedup_vs_flashinfer"] = res["flashinfer"] / ms
            ROWS.append(row)
        log(f"[prefill {name}] T={T} floor bw {bw_floor:.3f}ms tensor {mm_floor:.3f}ms  GPU time " +
            "  ".join(f"{i}={ms:.3f}ms" for i, ms in res.items()) + "  | per call with sync " +
            "  ".join(f"{i}={ms:.3f}ms" for i, ms in sync.items()) +
            "  | graph replay " + "  ".join(f"{i}={ms:.3f}ms" for i, ms in graph.items() if ms))
        del x, q, k, v, g, beta, h0
        torch.cuda.empty_cache()


def write(out: Path, meta: dict):
    out.mkdir(parents=True, exist_ok=True)
    keys = []
    for r in ROWS:
        keys += [k for k in r if k not in keys]
    with open(out / "bench_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(ROWS)
    (out / "bench_kernels.json").write_text(json.dumps(dict(meta=meta, rows=ROWS), indent=1))
    log(f"wrote {out / 'bench_kernels.csv'} and bench_kernels.json")


def summary():
    log("\n=== summary ===")
    for r in ROWS:
        if r["section"] in ("decode", "verify"):
            log(f"decode  {r['case']:<22} {r['impl']:<10} {r['us']:8.2f} us  {r['frac_copy_bw']:.2f} of copy BW"
                + (f"  x{r['speedup_vs_fla']:.2f} vs FLA" if "speedup_vs_fla" in r else "")
                + (f"  (kernel alone {r['kernel_us']:.2f} us)" if "kernel_us" in r else ""))
        elif r["section"] == "prefill":
            log(f"prefill {r['case']:<22} {r['impl']:<10} {r['ms']:8.3f} ms GPU  bw-floor {r['frac_bw_floor']:.2f} "
                f"tensor {r['frac_tensor']:.2f}" + (f"  x{r['speedup_vs_fla']:.2f} vs FLA" if "speedup_vs_fla" in r else "")
                + (f"  x{r['speedup_vs_flashinfer']:.2f} vs FlashInfer" if "speedup_vs_flashinfer" in r else "")
                + (f"  | with sync {r['ms_sync']:.3f} ms" if "ms_sync" in r else "")
                + (f" x{r['speedup_vs_fla_sync']:.2f}" if "speedup_vs_fla_sync" in r else ""))


def main(argv=None):
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--sections", default="ceilings,decode,prefill")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (smoke run)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer's chunked prefill (SM90 only)")
    ap.add_argument("--cases", default="",
                    help="prefill cases whose name contains one of these (comma list), run in that order")
    ap.add_argument("--scans", default="",
                    help="comma list of prefill scans to time too in every case, as ours_<scan> (e.g. "
                         "wgmma,wgmma_beside,mma4; the library's names: gdn_deploy.kernels.library.prefill_scan_names)")
    ap.add_argument("--cp-segments", default="4,8,16",
                    help="forced context-parallel segment counts (shard and single-sequence cases; 0: none)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to benchmark")
        return 2
    import gdn_deploy.kernels as kernels
    try:
        kernels.load()  # the library alone
    except kernels.KernelsUnavailable as e:
        log(f"[ours] unavailable: {e}")
        kernels = None
    fla_chunk, fla_rec = (None, None) if a.no_fla else _fla()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, time=time.strftime("%F %T"),
                has_prefill=bool(kernels and kernels.HAS_PREFILL), fla=fla_rec is not None)
    fi_chunk = None if a.no_flashinfer or "prefill" not in a.sections.split(",") else _flashinfer()
    meta["flashinfer"] = fi_chunk is not None
    log(f"[meta] {meta}")
    sections = a.sections.split(",")
    ceil = ceilings(a.quick)
    meta.update(ceil)
    try:
        if "decode" in sections:
            bench_decode(ceil, a.quick, kernels, fla_rec)
        if "verify" in sections:
            bench_verify(ceil, a.quick, kernels)
        if "prefill" in sections:
            bench_prefill(ceil, a.quick, kernels, fla_chunk, a.cases,
                          tuple(int(x) for x in a.cp_segments.split(",") if x and int(x) > 0), fi_chunk,
                          tuple(x for x in a.scans.split(",") if x))
    finally:
        write(Path(a.out), meta)
        summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
