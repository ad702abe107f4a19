#!/usr/bin/env bash
# One device call for the small-M GEMV (gemvSmallM.cu) with an already built kernel library ($GDN_KERNELS_LIB):
# the kernel's GPU tests, the microbenchmark beside cuBLAS (mid model shapes, M = 1, 8, 16), the decode engine's
# per-step time with the GEMV on and off (bench_generate engine rows: engine_graph_unfused_ms vs
# engine_graph_cublas_ms). Logs to $OUT; about 240 s in all.
#   GDN_KERNELS_LIB=/path/to/libgdn_kernels.so benchmarks/gemv_device_run.sh
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source "$root/benchmarks/device_steps.sh"
export PYTHONPATH=$root PYTHONUNBUFFERED=1 GDN_REQUIRE_KERNELS=1
export GDN_KERNELS_LIB=${GDN_KERNELS_LIB:-$root/build/plugins_cpp/kernels/libgdn_kernels.so}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/summary.txt"
echo "lib: $GDN_KERNELS_LIB" | tee -a "$out/summary.txt"
step test_gemv 40 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_gemv.py
step bench_gemv 40 python benchmarks/bench_gemv.py --m 1,2,4,8,16 --out "$out"
step bench_generate 150 python benchmarks/bench_generate.py --configs mid --device cuda --engine-batches 1,8 \
  --prompt-len 1024 --new 16 --engine-only --out "$out"
# the greedy == HF test with the GEMV off: whether its HF side fails on this machine without our kernel too
step test_greedy_gemv_off 30 env GDN_GEMV=0 python -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_engine.py \
  -k "greedy and qwen3_5 and not moe"
tail -n 3 "$out/test_gemv.txt" "$out/test_greedy_gemv_off.txt"
sed -n '/=== gemv summary/,$p' "$out/bench_gemv.txt"
grep -E "^\| mid" "$out/bench_generate.txt" | head -n 6
cat "$out/summary.txt"
