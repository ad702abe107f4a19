"""Prefill scan variants of the CUDA kernel, by name: timings of the Qwen3-Next shapes (bf16 I/O, fp32 gates,
Hk=16, Hv=32, K=V=128) per variant, after a check that every variant computes the same function.

  python3 benchmarks/bench_prefill_variants.py [--scans auto,wgmma,wgmma_beside,wgmma:cp.async,mma4]
      [--cases 1x4K,1x64K] [--no-check]

Scans (gdnPrefillConfig.h): "wgmma" (warpgroup scan after the prep kernel), "wgmma_beside" (the same scan beside
a persistent prep kernel), both needing an sm_90a build on an sm_90 device and loading tiles by bulk tensor
copies unless suffixed ":cp.async"; "mma2" / "mma4" (mma.sync scan, 2 or 4 warps per CTA); "auto" (what the
product runs). Correctness of every variant is the GPU tests' job (tests/kernels/test_prefill_kernel.py); the
check here only makes sure the timed variants compute the same function: each one's output on the 1x4K inputs
against the float64 reference, within the spec's tolerance (exit status 1 otherwise).
Timing: median of 20 launches after 3 warm-ups, CUDA events around each and no host sync between them (GPU time;
bench_kernels.time_queued); the 1x64K case also prints the per-kernel split (prep / scan) from the torch profiler.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from bench_kernels import rel_err, time_queued  # noqa: E402  (benchmarks/bench_kernels.py)

DEV = torch.device("cuda")
SCANS = ("wgmma", "wgmma_beside", "wgmma:cp.async", "mma4", "auto")
CASES = {"1x4K": [4096], "1x16K": [16384], "1x64K": [65536], "16x1K": [1024] * 16,
         "ragged": [3000, 17, 900, 4096, 1, 511, 2048, 64, 7000, 333]}
ATTRS = dict(gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)


def qwen3next_inputs(lens):
    """Timing inputs on the GPU for sequences of lengths lens: bf16 q, k, v at Hk=16, Hv=32, K=V=128, fp32
    gates g in (-0.5, 0], beta in [0, 1), an initial state (seed 0; also used by bench_ab_builds.py)."""
    T, N, Hk, Hv, K, V = sum(lens), len(lens), 16, 32, 128, 128
    g = torch.Generator(device=DEV).manual_seed(0)
    return {"q": torch.randn(T, Hk, K, device=DEV, dtype=torch.bfloat16, generator=g),
            "k": torch.randn(T, Hk, K, device=DEV, dtype=torch.bfloat16, generator=g),
            "v": torch.randn(T, Hv, V, device=DEV, dtype=torch.bfloat16, generator=g),
            "g": -torch.rand(T, Hv, device=DEV, generator=g) * 0.5, "beta": torch.rand(T, Hv, device=DEV, generator=g),
            "cu_seqlens": torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV),
            "initial_state": torch.randn(N, Hv, K, V, device=DEV) * 0.1}


def runner(kernels, d, o, fin, scan):
    """A callable enqueuing one prefill launch with scan `scan` ("name" or "name:cp.async")."""
    name, _, loads = scan.partition(":")
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                                      d["initial_state"], o, fin, **ATTRS)
    nb = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.empty(max(nb, 1), dtype=torch.uint8, device=DEV)

    def run():
        kernels.launch.launch_prefill(kernels.LIB, p, ws, DEV, scan=name, tma=loads != "cp.async")
    return run


def check(kernels, scans) -> int:
    from gdn_deploy.reference import prefill_ref
    from gdn_deploy.validate import tolerance_for
    d = qwen3next_inputs(CASES["1x4K"])
    ref = {n: (t.double() if t.is_floating_point() else t) for n, t in d.items()}
    ro, rs = prefill_ref(ref["q"], ref["k"], ref["v"], ref["g"], ref["beta"], ref["cu_seqlens"],
                         ref["initial_state"], form="chunked", **ATTRS)
    tol, fails = tolerance_for(torch.bfloat16), 0
    for scan in scans:
        o = torch.full_like(d["v"], float("nan"))
        fin = torch.full_like(d["initial_state"], float("nan"))
        runner(kernels, d, o, fin, scan)()
        torch.cuda.synchronize()
        eo, es = rel_err(o, ro), rel_err(fin, rs)
        ok = eo <= tol and es <= tol
        fails += not ok
        print(f"CHECK {scan}: 1x4K vs float64 o {eo:.2e} state {es:.2e}" + ("" if ok else " FAIL"), flush=True)
    return fails


def time_case(kernels, name, scans):
    lens = CASES[name]
    d = qwen3next_inputs(lens)
    o, fin = torch.empty_like(d["v"]), torch.empty_like(d["initial_state"])
    row = []
    for scan in scans:
        run = runner(kernels, d, o, fin, scan)
        row.append(f"{scan}: {time_queued(run, reps=20, warmup=3):.3f}")
        if name == "1x64K":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
            split = [f"{'prep' if 'Prep' in e.key else 'scan'} {e.device_time / 1e3:.3f}"
                     for e in prof.key_averages() if "Prefill" in e.key]
            row[-1] += f" ({', '.join(split)})"
    print(f"TIME {name:7s} T={sum(lens):6d} N={len(lens):3d} ms | " + " | ".join(row), flush=True)


def main():
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scans", default=",".join(SCANS))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    import gdn_deploy.kernels as kernels
    try:
        kernels.load()  # the library alone
    except kernels.KernelsUnavailable as e:
        print(f"{ap.prog}: nothing to benchmark: {e}", file=sys.stderr)
        sys.exit(2)                                                      # as bench_kernels.py
    scans = [s for s in a.scans.split(",")
             if kernels.launch.prefill_scan_runs(kernels.LIB, s.partition(":")[0], 128)]
    print(torch.cuda.get_device_name(), "scans:", ", ".join(scans), flush=True)
    fails = 0 if a.no_check else check(kernels, scans)
    for name in a.cases.split(","):
        time_case(kernels, name, scans)
    print("ALL CHECKS PASSED" if fails == 0 else f"{fails} CHECKS FAILED", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
