"""Small-M GEMV (``gdn::gemv``, gemvSmallM.cu) side by side with torch.matmul (cuBLAS) in one run.

  python benchmarks/bench_gemv.py [--out DIR] [--m 1,8,16] [--shapes 8224x1024,...]

Shapes (N x K) default to the mid model's decode projections (Qwen3.5-0.8B: GDN in-proj 8224x1024, MLP gate|up
7168x1024, down 1024x3584, GDN out 1024x2048, attention q|k|v 5120x1024, lm_head 32768x1024), bf16. Each case is
timed as CUDA-graph replays over enough weight sets to defeat L2 (>= 256 MB per pass): us per call, GB/s (W + x + y
bytes), fraction of the measured copy bandwidth (read + write); ours with the automatic split and each forced
split (1, 2, 4, 8 warps per row). Every case checks ours against cuBLAS (rel err). Results: bench_gemv.csv in --out.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import ceilings, log, rel_err, time_graph  # noqa: E402

SHAPES = "8224x1024,7168x1024,1024x3584,1024x2048,5120x1024,32768x1024"


def bench(M: int, N: int, K: int, dtype, copy_bw: float, gemv) -> list[dict]:
    wbytes = N * K * torch.finfo(dtype).bits // 8
    sets = max(1, min(64, math.ceil(256e6 / wbytes)))
    ws = [torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5 for _ in range(sets)]
    xs = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty(M, N, device="cuda", dtype=dtype) for _ in range(sets)]
    nbytes = wbytes + (M * K + M * N) * torch.finfo(dtype).bits // 8
    rows = []

    def row(impl, us, err=None):
        r = dict(M=M, N=N, K=K, dtype=str(dtype).replace("torch.", ""), impl=impl, us=us,
                 GBps=nbytes / (us * 1e-6) / 1e9, frac_copy_bw=nbytes / (us * 1e-6) / copy_bw)
        if err is not None:
            r["rel_err_vs_cublas"] = err
        rows.append(r)
        log(f"[gemv] M={M:<2} {N:>6}x{K:<5} {impl:<8} {us:8.2f} us {r['GBps']:7.0f} GB/s {r['frac_copy_bw']:.2f} of copy"
            + (f"  err {err:.1e}" if err is not None else ""))

    row("cublas", 1e3 * time_graph([lambda i=i: torch.mm(xs[i], ws[i].T, out=ys[i]) for i in range(sets)]))
    ref = F.linear(xs[0], ws[0])
    for split in (0, 1, 2, 4, 8):
        y = torch.full_like(ys[0], float("nan"))
        gemv.launch(xs[0], ws[0], y, None, split_k=split)
        err = rel_err(y, ref)
        us = 1e3 * time_graph([lambda i=i: gemv.launch(xs[i], ws[i], ys[i], None, split_k=split) for i in range(sets)])
        row("ours" if split == 0 else f"ours_s{split}", us, err)
    del ws, xs, ys
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    from gdn_deploy.cli_util import OneLineParser
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--m", default="1,8,16")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to benchmark")
        return 2
    from gdn_deploy.kernels import gemv
    why = gemv.unavailable_reason()
    if why is not None:
        log(f"[gemv] kernel unavailable: {why}")
        return 1
    copy_bw = ceilings(quick=True)["copy_GBps"] * 1e9
    rows = []
    for shape in a.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        for M in (int(v) for v in a.m.split(",")):
            rows += bench(M, N, K, getattr(torch, a.dtype), copy_bw, gemv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench_gemv.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    log("\n=== gemv summary (us; fraction of copy bandwidth) ===")
    for r in rows:
        if r["impl"] in ("cublas", "ours"):
            log(f"M={r['M']:<2} {r['N']:>6}x{r['K']:<5} {r['impl']:<7} {r['us']:8.2f} us  {r['frac_copy_bw']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
