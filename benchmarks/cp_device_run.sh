#!/usr/bin/env bash
# One device call for the context-parallel prefill (issue 34): GPU tests of the prefill kernels, then the prefill
# benchmark's shard shapes (ours, the previous automatic scan, forced segment counts, FLA) and the existing cases.
#   [TESTS=..] [K_EXPR=..] [CASES=..] [CP_SEGS=..] [BENCH=0] [PHASE_LIBS="a.so b.so"] bash benchmarks/cp_device_run.sh
# Expects the kernel library at build/plugins_cpp/kernels/libgdn_kernels.so (scripts/build_kernels.sh 90a) and
# FLA wheels in .whl/ (optional); logs under $OUT. PHASE_LIBS: kernel libraries (e.g. main's build and this one)
# whose per-kernel phase times (benchmarks/bench_cp_phases.py) are printed first, each in its own process.
set -u -o pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$out/pip.txt" 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export GDN_KERNELS_LIB=$PWD/build/plugins_cpp/kernels/libgdn_kernels.so GDN_REQUIRE_KERNELS=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$out/device.txt"
for lib in ${PHASE_LIBS:-}; do
  GDN_KERNELS_LIB=$PWD/$lib timeout "${PHASE_TIMEOUT:-120}" python3 benchmarks/bench_cp_phases.py \
    --tag "$(basename "$lib")" ${PHASE_ARGS:-} 2>&1 | tee -a "$out/phases.txt"
done
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/kernels/test_prefill_cp.py} \
  ${K_EXPR:+-k "$K_EXPR"} -s > "$out/tests.log" 2>&1
echo "tests rc=$?" | tee -a "$out/tests.log"
tail -5 "$out/tests.log"
if [[ -n "${BENCH:-1}" && "${BENCH:-1}" != 0 ]]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_kernels.py --sections prefill --out "$out" \
    ${CASES:+--cases "$CASES"} ${CP_SEGS:+--cp-segments "$CP_SEGS"} > "$out/bench.txt" 2>&1
  echo "bench rc=$?"
  grep -A200 "=== summary" "$out/bench.txt" | grep prefill | cut -c1-150
fi
