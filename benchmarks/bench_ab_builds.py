"""Same-process A/B timing of several builds of libgdn_kernels.so (e.g. main against a branch, or compile-time
variants), interleaved round by round (with FLA's chunk_gated_delta_rule for prefill when it imports).

  python3 benchmarks/bench_ab_builds.py NAME=path/libgdn_kernels.so [NAME=path ...]
      [--op prefill|decode] [--case 1x64K] [--batch 64] [--scan auto] [--rounds 7]

Each build is loaded with ctypes under its own path (gdn_deploy.kernels.library.load_library: the product's
entry points only, so older builds load too). The op runs once per build on NaN-poisoned outputs and the
outputs are compared bitwise with the first build's (builds that differ only in scheduling or in checks that
valid inputs never trigger must agree bitwise). Then, per round, each build (order reversed every other round)
is timed:
- prefill (bf16, Hk=16, Hv=32, K=V=128, gates precomputed, q/k L2 norm): the median of 20 launches after 3
  warm-ups, CUDA events around each launch and no host sync between them (GPU time: the host enqueues faster
  than the GPU runs); FLA by its GPU time from the profiler (bench_kernels.gpu_busy_ms);
- decode (the same shapes, dense state): replays of one CUDA graph over rotating buffer sets (the state does
  not stay in L2), per call, as bench_kernels.py times decode.
Prints every round and the median per build. --scan forces a prefill scan by name (gdnPrefillConfig.h; every
build must have the named entry point); the default runs what the product runs (gdnPrefillLaunchC).
Build a variant with e.g. GDN_BUILD_DIR=b_x CUDAFLAGS=-DFOO=1 scripts/build_kernels.sh 90a.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
CASES = {"1x4K": [4096], "1x16K": [16384], "1x64K": [65536], "16x1K": [1024] * 16}
ATTRS = dict(gate_mode=0, use_qk_l2norm=1, scale=0.0, l2norm_eps=1e-6)


def prefill_runner(lib, d, o, fin, scan):
    """A callable enqueuing one prefill launch of build `lib` (its own workspace) on the current stream."""
    from gdn_deploy.kernels import launch
    from gdn_deploy.kernels.library import prefill_scan_code
    p = launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], d["initial_state"], o,
                              fin, **ATTRS)
    ws = torch.empty(max(launch.prefill_workspace_bytes(lib, p), 1), dtype=torch.uint8, device="cuda")
    p.workspace, p.workspaceBytes = ws.data_ptr(), ws.numel()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    if scan == "auto":
        def run():
            assert lib.gdnPrefillLaunchC(ctypes.byref(p), stream) == 0
    else:  # (the build was loaded with the tuning entry points)
        code = prefill_scan_code(lib, scan)

        def run():
            assert lib.gdnPrefillLaunchTunedC(ctypes.byref(p), stream, code, 1) == 0
    run.keep = (p, ws)  # (alive as long as the runner)
    return run


def decode_runners(lib, sets, outs):
    """Callables, one per rotating buffer set, enqueuing one dense decode launch of build `lib`."""
    from gdn_deploy.kernels import launch
    runs = []
    for s, o in zip(sets, outs):
        p = launch.decode_params(s["q"], s["k"], s["v"], s["g"], s["beta"], s["state"], o["s"], o["o"],
                                 state_mode=0, **ATTRS)

        def run(p=p):
            assert lib.gdnDecodeLaunchC(ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)) == 0
        runs.append(run)
    return runs


def main() -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=path/to/libgdn_kernels.so")
    ap.add_argument("--op", default="prefill", choices=["prefill", "decode"])
    ap.add_argument("--case", default="1x64K", choices=sorted(CASES), help="prefill: sequence lengths")
    ap.add_argument("--batch", type=int, default=64, help="decode: sequences")
    ap.add_argument("--scan", default="auto", help="prefill scan by name (gdnPrefillConfig.h)")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from bench_kernels import _fla, decode_bytes, decode_inputs, gpu_busy_ms, time_graph, time_queued
    from bench_prefill_variants import qwen3next_inputs
    from gdn_deploy.kernels.library import load_library

    libs = {}
    for spec in a.builds:
        name, path = spec.split("=", 1)
        libs[name] = load_library(Path(path).resolve(), core_only=a.op == "decode" or a.scan == "auto")

    timed, outs, fla = {}, {}, None
    if a.op == "prefill":
        d = qwen3next_inputs(CASES[a.case])
        o, fin = torch.empty_like(d["v"]), torch.empty_like(d["initial_state"])
        for name, lib in libs.items():
            run = prefill_runner(lib, d, o, fin, a.scan)
            o.fill_(float("nan"))
            fin.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            outs[name] = (o.clone(), fin.clone())
            timed[name] = lambda run=run: time_queued(run, reps=20, warmup=3)
        fla_fns = _fla()
        if fla_fns[0] is not None:
            cu64 = d["cu_seqlens"].long()

            def fla_call():
                return fla_fns[0](d["q"][None], d["k"][None], d["v"][None], d["g"][None], d["beta"][None],
                                  initial_state=d["initial_state"], output_final_state=True,
                                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu64)
            fla = lambda: gpu_busy_ms(fla_call, reps=5)  # noqa: E731
        label = f"prefill {a.case} scan={a.scan}"
    else:
        Hk, Hv, K, V = 16, 32, 128, 128
        nsets = max(2, min(64, math.ceil(256e6 / decode_bytes(a.batch, Hk, Hv, K, V))))
        sets = [decode_inputs(a.batch, Hk, Hv, K, V, seed=i) for i in range(nsets)]
        bufs = [dict(o=torch.empty_like(s["v"]), s=torch.empty_like(s["state"])) for s in sets]
        for name, lib in libs.items():
            runs = decode_runners(lib, sets, bufs)
            for b in bufs:
                b["o"].fill_(float("nan"))
                b["s"].fill_(float("nan"))
            for r in runs:
                r()
            torch.cuda.synchronize()
            outs[name] = (bufs[0]["o"].clone(), bufs[0]["s"].clone())
            timed[name] = lambda runs=runs: time_graph(runs, reps=20)
        label = f"decode B={a.batch} (Qwen3-Next shapes, CUDA graph over {nsets} buffer sets, ms per call)"

    first = next(iter(outs))
    for name, (x, s) in outs.items():
        same = all(torch.equal(t.view(torch.uint8), r.view(torch.uint8)) for t, r in zip((x, s), outs[first]))
        print(f"{name}: NaN in outputs {bool(torch.isnan(x).any() or torch.isnan(s).any())}, "
              f"bitwise equal to {first}: {same}, max |o - o[{first}]| "
              f"{float((x.float() - outs[first][0].float()).abs().max()):.3e}", flush=True)
    res = {name: [] for name in timed}
    if fla is not None:
        res["FLA"] = []
    for r in range(a.rounds):
        for name in (list(timed) if r % 2 == 0 else list(timed)[::-1]):
            res[name].append(timed[name]())
        if fla is not None:
            res["FLA"].append(fla())
    print(f"AB {label}, {torch.cuda.get_device_name()}", flush=True)
    for name, t in res.items():
        if t:
            md = statistics.median(t)
            vs = (f" | FLA median / median {statistics.median(res['FLA']) / md:.2f}x"
                  if res.get("FLA") and name != "FLA" else "")
            print(f"AB {label} {name:10s} " + " ".join(f"{x:.4f}" for x in t) + f" | median {md:.4f} min {min(t):.4f}"
                  + vs, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
