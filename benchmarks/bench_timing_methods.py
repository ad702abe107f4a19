"""Timing methods for one prefill call, ours and FLA side by side (bf16, Hk=16, Hv=32, K=V=128): how much of a
per-call time is host launch latency rather than GPU time.

  python3 benchmarks/bench_timing_methods.py [1x64K,1x16K,1x4K] [ROUNDS]

Per round (ms per call, medians): "sync" = CUDA events around each call with a synchronize after it (the GPU
idles while the host launches: host latency included; bench_kernels' ms_sync); "queued" = events around
each call, no sync between calls (GPU time while the host keeps ahead; FLA's host path is slower than its
GPU time below 1x16K, so its queued time is host time there); "graph" = one CUDA-graph replay of our call
(synced / queued); "nocu" = FLA without cu_seqlens (one sequence). Then the host time of one launch call
while the GPU is busy (blocks when the launch queue is full: a rough number), and per call the profiler's
span (first device start to last end, including host gaps under the profiler) / busy (sum of kernel
times; ours overlap, so busy > span is possible) / number of device activities, with the last call's
kernels (name, start, duration). bench_kernels.py reports the union of the device intervals (GPU time).
"""
import statistics, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # noqa: E402
import argparse
from gdn_deploy.cli_util import OneLineParser
ALL = [("1x64K", [65536]), ("1x16K", [16384]), ("1x4K", [4096])]
ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("cases", nargs="?", default=",".join(c for c, _ in ALL), help="comma-separated, of %(default)s")
ap.add_argument("rounds", nargs="?", type=int, default=3, help="rounds (default %(default)s)")
args = ap.parse_args()    # before the kernels load: --help and usage errors work without a GPU
if set(args.cases.split(",")) - {c for c, _ in ALL} or args.rounds < 1:
    ap.error(f"cases must be among {[c for c, _ in ALL]} and rounds >= 1, got {args.cases!r} {args.rounds}")
import torch
import gdn_deploy.kernels as kernels
try:
    kernels.load()  # the library alone
except kernels.KernelsUnavailable as e:
    print(f"{ap.prog}: nothing to benchmark: {e}", file=sys.stderr)
    sys.exit(2)                                                          # as bench_kernels.py
from bench_kernels import _fla, time_events, time_queued as queued
from torch.profiler import ProfilerActivity, profile

fla_chunk = _fla()[0]
L = kernels.launch


def spans(fn, reps=5):
    fn(); torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(); torch.cuda.synchronize()
        ks = [e for e in prof.events() if e.device_type.name == "CUDA"]
        if not ks:
            continue
        t0 = min(e.time_range.start for e in ks); t1 = max(e.time_range.end for e in ks)
        busy = sum(e.time_range.elapsed_us() for e in ks)
        out.append(((t1 - t0) / 1e3, busy / 1e3, len(ks), [(e.name[:30], round((e.time_range.start - t0) / 1e3, 3), round(e.time_range.elapsed_us() / 1e3, 3)) for e in sorted(ks, key=lambda e: e.time_range.start)]))
    return out


def host_us(fn, reps=20):
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


for name, lens in [c for c in ALL if c[0] in args.cases.split(",")]:
    T, N, Hk, Hv, K, V = sum(lens), len(lens), 16, 32, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(7)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)
    q, k, v = r(T, Hk, K).bfloat16(), r(T, Hk, K).bfloat16(), r(T, Hv, V).bfloat16()
    g = -torch.rand(T, Hv, device="cuda", generator=gen) * 0.5 - 0.01
    beta = torch.rand(T, Hv, device="cuda", generator=gen)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    h0 = 0.1 * r(N, Hv, K, V)
    o, fs = torch.empty_like(v), torch.empty_like(h0)
    p = L.prefill_params(q, k, v, g, beta, cu, h0, o, fs, gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    nb = L.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.empty(nb, dtype=torch.uint8, device="cuda")
    ours = lambda: L.launch_prefill(kernels.LIB, p, ws, q.device)
    cu64 = cu.long()
    fla_v = lambda: fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=h0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu64)
    fla_b = lambda: fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=h0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
    gr = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        ours()
    torch.cuda.current_stream().wait_stream(st); torch.cuda.synchronize()
    with torch.cuda.graph(gr):
        ours()
    for rnd in range(args.rounds):
        res = {}
        res["ours sync"] = time_events(ours, reps=20, warmup=3)
        res["ours queued"] = queued(ours)
        res["ours graph"] = time_events(gr.replay, reps=20, warmup=3)
        res["ours graph queued"] = queued(gr.replay)
        res["fla sync"] = time_events(fla_v, reps=10, warmup=2)
        res["fla queued"] = queued(fla_v, reps=10)
        res["fla nocu sync"] = time_events(fla_b, reps=10, warmup=2)
        res["fla nocu queued"] = queued(fla_b, reps=10)
        print(name, rnd, " ".join(f"{k}={x:.3f}" for k, x in res.items()),
              f"| ratio sync {res['fla sync'] / res['ours sync']:.2f} queued {res['fla queued'] / res['ours queued']:.2f}"
              f" nocu-queued/graph {res['fla nocu queued'] / res['ours graph']:.2f}", flush=True)
    print(name, "host us per launch call (GPU busy): ours", round(host_us(ours), 1), "fla", round(host_us(fla_v, 5), 1), flush=True)
    for tag, fn in [("ours", ours), ("fla", fla_v), ("fla nocu", fla_b)]:
        sp = spans(fn)
        print(name, tag, "span/busy ms", [(round(a, 3), round(b, 3), n) for a, b, n, _ in sp], flush=True)
        print("   ", sp[-1][3][:12], flush=True)
    del q, k, v, g, beta, h0, o, fs, ws
    torch.cuda.empty_cache()
