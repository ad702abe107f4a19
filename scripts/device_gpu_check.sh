#!/usr/bin/env bash
# One full GPU check for a device call: build the kernels for all archs, run the GPU tests, run the
# kernel benchmark. Each step logs to $OUT (or out/device/); a failing step is recorded and the
# next one still runs. Exit status: 0 only when every step that ran passed.
#
#   scripts/device_gpu_check.sh [--quick] [--skip-build] [--skip-tests] [--skip-bench]
# Env: GDN_CUDA_ARCHS (default "80;89;90a"), GDN_PYTEST_ARGS (extra pytest args, e.g. "-k decode"),
#      GDN_BENCH_ARGS (extra benchmark args), GDN_T_BUILD/GDN_T_TESTS/GDN_T_BENCH (step time limits, s).
# FLA for the benchmark: wheels in .whl/ (carried) are installed to /tmp/site first.
# Files written to $OUT (<= 8): summary.txt build.log tests.log bench.log bench_kernels.csv bench_kernels.json
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/out/device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
quick=0 build=1 tests=1 bench=1
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --skip-build) build=0 ;;
    --skip-tests) tests=0 ;;
    --skip-bench) bench=0 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
summary="$out/summary.txt"
: > "$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT_S CMD...: run with a time limit, log to $out/NAME.log, record the result
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "=== [$name] $* (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > >(tee "$out/$name.log") 2>&1
  local rc=$?
  sleep 0.2  # let tee flush
  if [[ $rc -ne 0 ]]; then status=1; fi
  note "[$name] rc=$rc ($((SECONDS - t0)) s)$([[ $rc -eq 124 ]] && echo ' TIMED OUT')"
  return 0
}

note "gdn device check $(date -u '+%F %T') UTC"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name())' 2>&1
  nvcc --version 2>&1 | tail -1; cmake --version 2>&1 | head -1; } | tee -a "$summary"

if compgen -G ".whl/*.whl" > /dev/null; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > "$out/pip.txt" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    note "wheels installed: $(ls .whl | tr '\n' ' ')"
  else
    note "wheel install failed: $(tail -3 "$out/pip.txt")"
  fi
  rm -f "$out/pip.txt"
fi

archs=${GDN_CUDA_ARCHS:-80;89;90a}
if [[ $build -eq 1 ]]; then
  step build "${GDN_T_BUILD:-240}" scripts/build_kernels.sh --all "$archs"
  if [[ ! -f build/plugins_cpp/kernels/libgdn_kernels.so ]]; then
    note "full build failed: retrying the kernel libraries without the prefill kernel (GDN_SKIP_PREFILL)"
    GDN_CMAKE_ARGS="-DGDN_SKIP_PREFILL=ON" step build_noprefill "${GDN_T_BUILD:-240}" scripts/build_kernels.sh "$archs"
  fi
fi
export GDN_KERNELS_LIB=${GDN_KERNELS_LIB:-$root/build/plugins_cpp/kernels/libgdn_kernels.so}
export GDN_REQUIRE_KERNELS=1   # a missing or broken kernel library fails the GPU tests instead of skipping them
python3 -c 'import gdn_deploy.ops; import gdn_deploy.kernels as k; print("kernels:", k.status())' 2>&1 | tail -2 | tee -a "$summary"

if [[ $tests -eq 1 ]]; then
  # shellcheck disable=SC2086
  step tests "${GDN_T_TESTS:-200}" python3 -m pytest tests/kernels -q -rs -p no:cacheprovider --durations=5 ${GDN_PYTEST_ARGS:-}
  grep -E "passed|failed|error|skipped" "$out/tests.log" | tail -1 | sed 's/^/  tests: /' | tee -a "$summary"
fi

if [[ $bench -eq 1 ]]; then
  qa=()
  [[ $quick -eq 1 ]] && qa=(--quick)
  # shellcheck disable=SC2086
  step bench "${GDN_T_BENCH:-300}" python3 benchmarks/bench_kernels.py --out "$out" "${qa[@]}" ${GDN_BENCH_ARGS:-}
  sed -n '/=== summary ===/,$p' "$out/bench.log" >> "$summary"
fi
note "overall status: $status"
exit $status
