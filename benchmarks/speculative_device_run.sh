#!/usr/bin/env bash
# One device call for the speculative-decoding plugins and numbers (results/h100/speculative_*.txt):
# build everything for sm_90a with the TensorRT headers (TensorRT_ROOT), run the plugin lifecycle on the GPU
# (prefill, decode, verify, commit cases), the verify/decode kernel tests, the graphed engine's speculative step
# tests, the verify-vs-decode logits check (bf16), the verify kernel benchmark
# (T = 1, 2, 4, 8 at B = 1, 8, 64) and the end-to-end speculative benchmark. Logs to $OUT.
#   TensorRT_ROOT=/path/to/TensorRT benchmarks/speculative_device_run.sh
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source "$root/benchmarks/device_steps.sh"
export PYTHONPATH=$root PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/summary.txt"
step build 170 scripts/build_kernels.sh --all "${GDN_CUDA_ARCHS:-90a}"
export GDN_KERNELS_LIB=$root/build/plugins_cpp/kernels/libgdn_kernels.so GDN_REQUIRE_KERNELS=1
step tests 90 python -m pytest -q -rA tests/plugins/test_plugin_lifecycle.py tests/kernels/test_verify_kernel.py
step tests_decode 40 python -m pytest -q tests/kernels/test_decode_kernel.py
step bench_verify 60 python benchmarks/bench_kernels.py --sections ceilings,verify --no-fla --out "$out"
step tests_engine 70 python -m pytest -q -rA tests/kernels/test_engine_speculative_gpu.py
step check_bf16 30 python benchmarks/check_verify_logits.py --dtype bf16 --batches 16 --lengths 8
step bench_speculative 75 python benchmarks/bench_speculative.py --repeats 2 --out "$out"
tail -n 3 "$out/tests.txt" "$out/tests_decode.txt"; grep -E "rel err|^case|gdn_plugin_lifecycle:" "$out/tests.txt" | tail -n 40; grep -E "^\[verify|^\[ceil" "$out/bench_verify.txt"; cat "$out/bench_speculative.md" 2>/dev/null
cat "$out/summary.txt"
