"""Small prefill and decode cases for compute-sanitizer (memcheck, racecheck, initcheck, synccheck): every prefill
scan configuration that runs on the device, ragged lengths 0/1/63/64/65/130/0 with grouped value heads and
precomputed or raw gates, a 300-token sequence beside the prep, K=V=64 fp16, K=V=256 bf16, fp32 with V=64, then
dense decode and pool decode with a skipped slot. scripts/device_gpu_check.sh runs this file under each tool (with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that every buffer is a fresh allocation initcheck tracks).

Outputs and the workspace are fresh uninitialised allocations that are read after each launch, so initcheck sees
an output element the kernels never write. The one exception is --poison-bulk-stores (the initcheck run): o of the
wgmma scans loaded and stored by bulk tensor copies is NaN-filled first and checked to hold no NaN afterwards,
because initcheck does not count bulk tensor stores as writes (tests/kernels/sanitizer/sync_patterns.cu,
tma_store); the cp.async configurations of the same scan store o with generic stores and stay under initcheck.

  python3 tests/kernels/sanitizer_cases.py [--only SUBSTR] [--poison-bulk-stores]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent), str(HERE)]
from _gpu_util import DT, op_attrs, scan_configs, to_device  # noqa: E402
from conftest import make_decode_inputs, make_prefill_inputs  # noqa: E402  (tests/conftest.py)

RAGGED = [0, 1, 63, 64, 65, 130, 0]
# label, seqlens, Hk, Hv, K, V, io, gate dtype, gate_mode
PREFILL = [
    ("ragged-gva", RAGGED, 2, 4, 128, 128, "bf16", "f32", 0),
    ("ragged-gva-raw-gates", RAGGED, 2, 4, 128, 128, "bf16", "bf16", 1),
    ("long300", [300], 1, 2, 128, 128, "bf16", "f32", 0),
    ("k64-f16", RAGGED, 2, 2, 64, 64, "f16", "f16", 0),
    ("k256-bf16", RAGGED, 1, 2, 256, 256, "bf16", "f32", 1),
    ("f32-v64", RAGGED, 2, 4, 128, 64, "f32", "f32", 1),
]


def read_all(*ts):
    """Read every element (initcheck reports a read of memory no kernel wrote)."""
    return [float(t.double().abs().sum()) for t in ts]


def run_prefill(kernels, case, poison_bulk):
    label, lens, Hk, Hv, K, V, io, gd, gm = case
    gen = torch.Generator().manual_seed(1)
    d, _ = to_device(make_prefill_inputs(gen, lens, Hk, Hv, K, V, gate_mode=gm, use_qk_l2norm=1), DT[io], DT[gd])
    attrs = op_attrs(gm, 1)
    configs = [("auto", True)] + (scan_configs(kernels, K) if io != "f32" else [])
    auto_bulk = io != "f32" and kernels.launch.prefill_scan_runs(kernels.LIB, "wgmma", K)  # (auto: a wgmma scan)
    for scan, tma in configs:
        bulk = tma and (scan.startswith("wgmma") or (scan == "auto" and auto_bulk))  # (o stored by bulk tensor stores)
        poison = poison_bulk and bulk
        o = torch.full_like(d["v"], float("nan")) if poison else torch.empty_like(d["v"])
        final = torch.empty_like(d["initial_state"])
        p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                                          d["initial_state"], o, final, d.get("A_log"), d.get("dt_bias"), **attrs)
        nb = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
        ws = torch.empty(nb, dtype=torch.uint8, device="cuda") if nb else None
        kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), scan=scan, tma=tma)
        torch.cuda.synchronize()
        so, sf = read_all(o, final)
        ok = so == so and sf == sf  # (no NaN: every element written)
        stored = sum(n // 64 * 64 for n in lens) * Hv * V if bulk else 0  # (full chunks: one bulk store per tile)
        print(f"prefill {label} scan={scan}{'' if tma else ':cp.async'}: {stored} o elements by bulk tensor stores"
              f"{' (NaN-poisoned)' if poison else ''}: {'ok' if ok else 'UNWRITTEN OUTPUT'}", flush=True)
        if not ok:
            return 1
    return 0


def run_decode(kernels):
    gen = torch.Generator().manual_seed(2)
    d, _ = to_device(make_decode_inputs(gen, 3, Hk=2, Hv=4, K=128, V=128, use_qk_l2norm=1), torch.bfloat16,
                     torch.float32)
    o, s = torch.empty_like(d["v"]), torch.empty_like(d["state"])
    p = kernels.launch.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], s, o, state_mode=0,
                                     **op_attrs(0, 1))
    kernels.launch.launch_decode(kernels.LIB, p, torch.device("cuda"))
    torch.cuda.synchronize()
    read_all(o, s)
    print("decode dense B=3: ok", flush=True)
    inp = make_decode_inputs(gen, 4, Hk=2, Hv=2, K=64, V=128, use_qk_l2norm=1, pool_size=6)
    inp["slots"][1] = -1
    d, _ = to_device(inp, torch.float16, torch.float16)
    o = torch.empty_like(d["v"])
    p = kernels.launch.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], d["state"], o, d["slots"],
                                     state_mode=1, **op_attrs(0, 1))
    kernels.launch.launch_decode(kernels.LIB, p, torch.device("cuda"))
    torch.cuda.synchronize()
    read_all(o, d["state"])
    print("decode pool B=4 P=6, slot -1: ok", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the cases whose label contains this")
    ap.add_argument("--poison-bulk-stores", action="store_true")
    a = ap.parse_args()
    import gdn_deploy.kernels as kernels
    kernels.load()
    fails = 0
    for case in PREFILL:
        if a.only in case[0]:
            fails += run_prefill(kernels, case, a.poison_bulk_stores)
    if a.only in "decode":
        fails += run_decode(kernels)
    print("sanitizer cases:", "all ran" if not fails else f"{fails} failed", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
