"""Prefill scan variants of the CUDA kernel: correctness of every variant against the float64 reference,
then timings of the Qwen3-Next shapes (bf16 I/O, fp32 gates, Hk=16, Hv=32, K=V=128) per variant.

  python3 benchmarks/bench_prefill_variants.py [--variants 0,2,4] [--cases 1x4K,1x64K] [--no-check]

Variants: the last argument of gdnPrefillLaunchTunedC (gdnPrefill.cu): 1 = warpgroup wgmma scan after the
prep kernel, 3 = the same scan beside a persistent prep kernel (both need an sm_90a build on an sm_90
device; K = 256 falls back to 4), loading tiles by bulk tensor copies; 5 / 7 = 1 / 3 with cp.async loads;
2 or 4 = mma.sync scan with that many warps per CTA (V-tile 16 x warps); 0 = the automatic pick.
Correctness: fresh random inputs per check, NaN-poisoned outputs and 0xFF-poisoned workspace, rel err
vs the float64 chunked reference <= the spec tolerance (1e-2 for 16-bit I/O). Exit status 1 on a failure.
Timing: median of 20 launches after 3 warm-ups, CUDA events around each and no host sync between them
(GPU time; bench_kernels.time_queued); the 1x64K case also prints the
per-kernel split (prep / scan) from the torch profiler for each variant.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "kernels")]
kernels = None  # gdn_deploy.kernels, imported in main() (needs a CUDA device)
from bench_kernels import time_queued  # noqa: E402  (benchmarks/bench_kernels.py)
from conftest import make_prefill_inputs, rel_err  # noqa: E402  (tests/conftest.py)
from gdn_deploy.reference import prefill_ref  # noqa: E402
from gdn_deploy.validate import tolerance_for  # noqa: E402

DEV = torch.device("cuda")
VARIANTS = (1, 3, 4, 0)
CASES = {"1x4K": [4096], "1x16K": [16384], "1x64K": [65536], "16x1K": [1024] * 16,
         "ragged": [3000, 17, 900, 4096, 1, 511, 2048, 64, 7000, 333]}
ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
# (seqlens, Hk, Hv, K, V, io dtype, gate_mode, l2norm, gate kwargs)
CHECKS = [
    ([0, 1, 63, 64, 65, 1000], 2, 4, 128, 128, torch.bfloat16, 0, 1, {}),
    ([0, 1, 63, 64, 65, 1000], 2, 4, 128, 128, torch.float16, 1, 1, {}),
    ([130, 7, 300], 2, 4, 64, 64, torch.bfloat16, 0, 0, {}),
    ([130, 7, 300], 1, 4, 256, 256, torch.bfloat16, 1, 1, {}),
    ([130, 7, 300], 2, 4, 128, 64, torch.float16, 0, 1, {}),
    ([1, 64, 300], 2, 4, 128, 128, torch.bfloat16, 0, 1, dict(g_range=(-1e-4, 0.0), beta_range=(0.99, 1.0))),
    ([1, 64, 300], 2, 4, 128, 128, torch.bfloat16, 0, 1, dict(g_range=(-20.0, 0.0), beta_range=(0.0, 1.0))),
    ([2000, 333], 16, 32, 128, 128, torch.bfloat16, 0, 1, {}),
    ([5000, 2100, 0, 700], 2, 4, 128, 128, torch.bfloat16, 0, 1, {}),  # beside: the prep's throttle engaged
]


def tuned_fn():
    fn = kernels.LIB.gdnPrefillLaunchTunedC
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(kernels.GdnPrefillParams), ctypes.c_void_p, ctypes.c_int]
    return fn


def setup(d, attrs, o, final):
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                                      d["initial_state"], o, final, d.get("A_log"), d.get("dt_bias"), **attrs)
    nb = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.full((max(nb, 1),), 0xFF, dtype=torch.uint8, device=DEV)
    p.workspace, p.workspaceBytes = ws.data_ptr(), nb
    return p, ws


def check(fn, variant, seed, case):
    seqlens, Hk, Hv, K, V, io, gm, l2, gkw = case
    gen = torch.Generator().manual_seed(seed)
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=gm, use_qk_l2norm=l2, **gkw)
    d, ref = {}, {}
    for n, t in inp.items():
        x = t.to(io) if n in ("q", "k", "v") else (t.float() if t.is_floating_point() else t)
        d[n] = x.to(DEV)
        ref[n] = d[n].double() if x.is_floating_point() else d[n]
    attrs = dict(gate_mode=gm, use_qk_l2norm=l2, scale=0.0, l2norm_eps=1e-6)
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p, ws = setup(d, attrs, o, final)
    rc = fn(ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), variant)
    torch.cuda.synchronize()
    if rc != 0:
        return False, f"rc={rc}"
    ro, rs = prefill_ref(*[ref.get(n) for n in ORDER], form="chunked", **attrs)
    if torch.isnan(o).any() or torch.isnan(final).any():
        return False, "unwritten (NaN) outputs"
    eo, es = rel_err(o, ro), rel_err(final, rs)
    tol = tolerance_for(io)
    return eo <= tol and es <= tol, f"o {eo:.2e} state {es:.2e}"


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


def time_case(fn, name, variants):
    lens = CASES[name]
    T, N = sum(lens), len(lens)
    d = qwen3next_inputs(lens)
    o, fin = torch.empty_like(d["v"]), torch.empty_like(d["initial_state"])
    p, ws = setup(d, dict(gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6), o, fin)
    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    row = []
    for v in variants:
        def run(v=v):
            assert fn(ctypes.byref(p), s, v) == 0
        row.append(f"v{v}: {time_queued(run, reps=20, warmup=3):.3f}")
        if name == "1x64K":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
            split = [f"{'prep' if 'Prep' in e.key else 'scan'} {e.device_time / 1e3:.3f}"
                     for e in prof.key_averages() if "Prefill" in e.key]
            row[-1] += f" ({', '.join(split)})"
    print(f"TIME {name:7s} T={T:6d} N={N:3d} ms | " + " | ".join(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(map(str, VARIANTS)))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    global kernels
    import gdn_deploy.kernels as kernels  # noqa: E402
    kernels.load()  # the library alone (KernelsUnavailable says why not)
    variants = [int(x) for x in a.variants.split(",")]
    fn = tuned_fn()
    print(torch.cuda.get_device_name(), flush=True)
    fails = 0
    if not a.no_check:
        base = int(os.environ.get("GDN_BENCH_SEED", time.time_ns() % 1_000_000))
        print(f"correctness seed base {base}", flush=True)
        for v in variants:
            res = []
            for i, case in enumerate(CHECKS):
                ok, msg = check(fn, v, base + 1000 * i + v, case)
                fails += not ok
                res.append(("" if ok else "FAIL ") + msg)
            print(f"CHECK v{v}: " + " ; ".join(res), flush=True)
    for name in a.cases.split(","):
        time_case(fn, name, variants)
    print("ALL CHECKS PASSED" if fails == 0 else f"{fails} CHECKS FAILED", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
