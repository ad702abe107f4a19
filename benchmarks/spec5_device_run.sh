#!/usr/bin/env bash
# One device call for speculative decoding on the graphed engine (results/h100/bench_speculative.md): its GPU
# tests, the verify-vs-decode logits check (bf16 and fp32, B = 1, 16, L = 2, 4, 8) and bench_speculative (mid
# config, B = 1, 16, K = 1, 3, 7, 2 repeats). The kernel library is prebuilt: GDN_KERNELS_LIB. Logs to $OUT.
#   GDN_KERNELS_LIB=/path/libgdn_kernels.so benchmarks/spec5_device_run.sh
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/out/device}
mkdir -p "$out"
export PYTHONPATH=$root PYTHONUNBUFFERED=1 GDN_REQUIRE_KERNELS=1
: "${GDN_KERNELS_LIB:?set GDN_KERNELS_LIB to the built kernel library}"
export GDN_KERNELS_LIB
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "[$name] rc=$? ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/summary.txt"
step tests 70 python -m pytest -q -rA tests/kernels/test_engine_speculative_gpu.py
step check_bf16 30 python benchmarks/check_verify_logits.py --dtype bf16 --batches 16 --lengths 8
step bench_speculative 75 python benchmarks/bench_speculative.py --repeats 2 --out "$out"
grep '^{' "$out/check_bf16.txt"
tail -n 15 "$out/tests.txt"
cat "$out/bench_speculative.md" 2>/dev/null
cat "$out/summary.txt"
