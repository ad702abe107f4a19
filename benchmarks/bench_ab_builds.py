"""Same-process A/B timing of several builds of libgdn_kernels.so (e.g. the last commit against the working
tree, or compile-time variants), interleaved round by round with FLA's chunk_gated_delta_rule.

  python3 benchmarks/bench_ab_builds.py NAME=path/libgdn_kernels.so [NAME=path ...]
      [--variant 3] [--case 1x64K] [--rounds 7]

Each build is loaded with ctypes under its own path; the prefill op (bf16, Hk=16, Hv=32, K=V=128, gates
precomputed, q/k L2 norm) runs once per build on NaN-poisoned outputs and the outputs are compared with the
first build's (the builds under test should agree bitwise when only scheduling changed). Then, per round,
each build (order reversed every other round) is timed as the median of 20 launches after 3 warm-ups, with
CUDA events around each launch and no host sync between them (GPU time: the host enqueues faster than the
GPU runs), and FLA by its GPU time from the profiler (bench_kernels.gpu_busy_ms, median of 5 calls; its
Python launch path takes ~1.2 ms of host time per call, so event timing with a sync would add host time). Prints every round and the median per build with FLA's median
over it. --variant is the scan variant of gdnPrefillLaunchTunedC (1 after the prep, 3 beside it, 0 auto).
Build a variant with e.g. GDN_BUILD_DIR=b_x CUDAFLAGS=-DFOO=1 scripts/build_kernels.sh 90a.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
CASES = {"1x4K": [4096], "1x16K": [16384], "1x64K": [65536], "16x1K": [1024] * 16}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=path/to/libgdn_kernels.so")
    ap.add_argument("--variant", type=int, default=3)
    ap.add_argument("--case", default="1x64K", choices=sorted(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import gdn_deploy.kernels as kernels  # (GDN_KERNELS_LIB or build/: the binding's types and helpers)
    kernels.load()  # the library alone (KernelsUnavailable says why not)
    from bench_kernels import _fla, gpu_busy_ms, time_queued
    from bench_prefill_variants import qwen3next_inputs

    fns, libs = {}, []
    for spec in a.builds:
        name, path = spec.split("=", 1)
        lib = ctypes.CDLL(str(Path(path).resolve()))
        lib.gdnPrefillWorkspaceSizeC.restype = ctypes.c_size_t
        lib.gdnPrefillWorkspaceSizeC.argtypes = [ctypes.POINTER(kernels.GdnPrefillParams)]
        fn = lib.gdnPrefillLaunchTunedC
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(kernels.GdnPrefillParams), ctypes.c_void_p, ctypes.c_int]
        fns[name] = fn
        libs.append(lib)
    d = qwen3next_inputs(CASES[a.case])
    o, fin = torch.empty_like(d["v"]), torch.empty_like(d["initial_state"])
    L = kernels.launch
    p = L.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], d["initial_state"], o, fin,
                         gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)
    nb = max(L.prefill_workspace_bytes(lib, p) for lib in libs)  # the largest layout of the builds
    ws = torch.empty(max(nb, 1), dtype=torch.uint8, device="cuda")
    p.workspace, p.workspaceBytes = ws.data_ptr(), ws.numel()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    outs = {}
    for name, fn in fns.items():
        o.fill_(float("nan"))
        rc = fn(ctypes.byref(p), stream, a.variant)
        torch.cuda.synchronize()
        if rc != 0:
            print(f"{name}: launch returned {rc}")
            return 1
        outs[name] = o.clone()
    first = next(iter(outs.values()))
    for name, x in outs.items():
        print(f"{name}: NaN {bool(torch.isnan(x).any())}, max |o - o[{next(iter(outs))}]| "
              f"{float((x.float() - first.float()).abs().max()):.3e}")
    fla_fns = _fla()
    fla = None
    if fla_fns:
        cu64 = d["cu_seqlens"].long()

        def fla():
            return fla_fns[0](d["q"][None], d["k"][None], d["v"][None], d["g"][None], d["beta"][None],
                              initial_state=d["initial_state"], output_final_state=True,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu64)
    res = {name: [] for name in fns}
    res["FLA"] = []
    for r in range(a.rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            fn = fns[name]
            res[name].append(time_queued(lambda fn=fn: fn(ctypes.byref(p), stream, a.variant), reps=20, warmup=3))
        if fla is not None:
            res["FLA"].append(gpu_busy_ms(fla, reps=5))
    for name, t in res.items():
        if t:
            md = statistics.median(t)
            ratio = f" | FLA median / median {statistics.median(res['FLA']) / md:.2f}x" if res["FLA"] else ""
            print(f"AB {a.case} v{a.variant} {name:10s} " + " ".join(f"{x:.3f}" for x in t)
                  + f" | median {md:.3f} min {min(t):.3f}" + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
