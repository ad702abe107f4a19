"""Where the context-parallel prefill's time goes: per-kernel device time of one launch (prep, pass 1, fix-up,
pass 2), from the torch profiler (CUPTI), median over repeats, next to the launch's GPU busy time and the time of one
CUDA-graph replay of the launch.

  python benchmarks/bench_cp_phases.py [--cases a,b] [--scan cp_wg] [--segments 0] [--reps 15] [--tag NAME]

Loads the kernel library named by GDN_KERNELS_LIB (so that two builds can be compared in one device call, one
process each). Prints one line per case: busy ms (first kernel start to last kernel end of one eager launch), graph
ms (median of CUDA events around one replay of a graph holding the launch), then each kernel's median us and the sum
of the gaps (busy minus the kernels: launch gaps and tails between dependent kernels).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_kernels import time_graph_one  # noqa: E402  (benchmarks/bench_kernels.py)
from prefill_inputs import ours_prefill_params, prefill_case_inputs  # noqa: E402  (benchmarks/prefill_inputs.py)

# (name, sequence lengths, (Hk, Hv, K, V)): the shard shapes of bench_kernels.py that run context parallel
CASES = [("Hk2Hv8 1x64K", [65536], (2, 8, 128, 128)), ("Hk4Hv8 1x64K", [65536], (4, 8, 128, 128)),
         ("d64 Hk4Hv8 1x64K", [65536], (4, 8, 64, 64)), ("Hk2Hv8 1x8K", [8192], (2, 8, 128, 128)),
         ("d64 Hk4Hv8 1x8K", [8192], (4, 8, 64, 64)), ("d256 Hk2Hv4 1x64K", [65536], (2, 4, 256, 256)),
         ("d256 Hk2Hv4 1x8K", [8192], (2, 4, 256, 256)), ("Hk2Hv8 1x4K", [4096], (2, 8, 128, 128)),
         ("d256 Hk2Hv4 1x4K", [4096], (2, 4, 256, 256))]

# kernel name fragment -> phase
PHASES = [("PrepKernel", "prep"), ("CpPass1Wg", "pass1"), ("CpKernel", "cpmma"), ("CpFix", "fix"),
          ("ScanWg", "pass2"), ("memset", "memset")]


def phase_of(name: str) -> str:
    if "gdnPrefillCpKernel" in name:  # mma.sync pass 1 (false) or pass 2 (true)
        return "pass1" if "false" in name else "pass2"
    for frag, ph in PHASES:
        if frag in name:
            return ph
    return "other"


def profile_once(fn):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start]
    per = {}
    for e in ev:
        ph = phase_of(e.name)
        per[ph] = per.get(ph, 0.0) + e.time_range.elapsed_us()
    if not ev:
        return None, per
    busy = max(e.time_range.end for e in ev) - min(e.time_range.start for e in ev)
    return busy, per


def main(argv=None):
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="")
    ap.add_argument("--scan", default="auto")
    ap.add_argument("--segments", type=int, default=0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    import gdn_deploy.kernels as kernels
    kernels.load()
    L = kernels.launch
    for name, seqlens, (Hk, Hv, K, V) in CASES:
        if a.cases and not any(f == name or f in name for f in a.cases.split(",")):
            continue
        inp = prefill_case_inputs(seqlens, Hk, Hv, K, V)
        p, o, fs = ours_prefill_params(L, inp)
        q = inp["q"]
        kw = {} if a.scan == "auto" else dict(scan=a.scan, segments=a.segments)
        ws = torch.empty(L.prefill_workspace_bytes(kernels.LIB, p, kw.get("segments")), dtype=torch.uint8,
                         device="cuda")

        def run():
            L.launch_prefill(kernels.LIB, p, ws, q.device, **kw)
        for _ in range(3):
            run()
        busy, per = [], {}
        for _ in range(a.reps):
            b, ph = profile_once(run)
            if b is None:
                continue
            busy.append(b)
            for kk, us in ph.items():
                per.setdefault(kk, []).append(us)
        bm = statistics.median(busy)
        graph_ms = time_graph_one(run, reps=a.reps)
        med = {kk: statistics.median(x) for kk, x in per.items()}
        gaps = bm - sum(med.values())
        cols = "  ".join(f"{kk} {us:7.1f}" for kk, us in sorted(med.items(), key=lambda t: -t[1]))
        gm = f"{graph_ms:.3f}" if graph_ms is not None else "-"
        print(f"[phases{' ' + a.tag if a.tag else ''}] {name:18s} scan={a.scan} G={a.segments}  busy {bm / 1e3:.3f} ms"
              f"  graph {gm} ms  | us: {cols}  gaps {gaps:6.1f}", flush=True)
        del inp, q, o, fs, ws
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
