#!/usr/bin/env bash
# One full GPU check for a device call: build the kernels for all archs, run the GPU tests, run the
# sanitizers over small cases, run the kernel benchmark. Each step logs to $OUT (or out/device/); a failing
# step is recorded and the next one still runs. Exit status: 0 only when every step that ran passed.
#
#   scripts/device_gpu_check.sh [--quick] [--skip-build] [--skip-tests] [--skip-sanitizer] [--skip-bench]
# Env: GDN_CUDA_ARCHS (default "80;89;90a"), GDN_PYTEST_ARGS (extra pytest args, e.g. "-k decode"),
#      GDN_BENCH_ARGS (extra benchmark args), GDN_T_BUILD/GDN_T_TESTS/GDN_T_SAN/GDN_T_BENCH (step time limits, s).
# FLA for the benchmark: wheels in .whl/ (carried) are installed to /tmp/site first.
# The sanitizer step (compute-sanitizer, when present): memcheck, racecheck, synccheck and initcheck over
# tests/kernels/sanitizer_cases.py, memcheck over tests/kernels/test_garbage_indices.py, then the reproductions
# of tests/kernels/sanitizer/sync_patterns.cu, each with its verdict in summary.txt (docs/kernels.md, Sanitizers).
# Files written to $OUT (<= 8): summary.txt build.log tests.log sanitizer.log bench.log bench_kernels.csv
# bench_kernels.json
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-$root/out/device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
quick=0 build=1 tests=1 san=1 bench=1
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --skip-build) build=0 ;;
    --skip-tests) tests=0 ;;
    --skip-sanitizer) san=0 ;;
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
  # the GPU tests and the plugin lifecycle harness (that one runs where the build found TensorRT headers: TensorRT_ROOT)
  step tests "${GDN_T_TESTS:-200}" python3 -m pytest tests/kernels tests/plugins/test_plugin_lifecycle.py -q -rs \
    -p no:cacheprovider --durations=5 ${GDN_PYTEST_ARGS:-}
  grep -E "passed|failed|error|skipped" "$out/tests.log" | tail -1 | sed 's/^/  tests: /' | tee -a "$summary"
fi

# sanitize LABEL TOOL EXPECT CMD...: one compute-sanitizer run appended to sanitizer.log, its verdict in the
# summary. EXPECT "clean": any error or hazard fails the step; "flags": a reproduction of a tool false positive
# (the tool is expected to report the correct pattern; recorded, never a failure); "mbarrier": racecheck of the
# wgmma scan, whose only acceptable reports are the mbarrier hand-off racecheck does not model
# (tests/kernels/sanitizer/racecheck_verdict.py decides).
sanitize() {
  local label=$1 tool=$2 expect=$3
  shift 3
  local log=$out/san_run.log t0=$SECONDS
  echo "=== [sanitizer] $label: compute-sanitizer --tool $tool $*" >> "$out/sanitizer.log"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout --signal=TERM --kill-after=10 "${GDN_T_SAN:-300}" \
    "$csan" --tool "$tool" --print-limit "${GDN_SAN_PRINT_LIMIT:-30}" --error-exitcode 99 "$@" > "$log" 2>&1
  local rc=$?
  cat "$log" >> "$out/sanitizer.log"
  local n
  n=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | grep -v "not printed" \
    | grep -Eo "(ERROR SUMMARY|RACECHECK SUMMARY): [0-9]+ [a-z]+( displayed)?( \([^)]*\))?" | tail -1)
  local verdict
  if [[ $rc -eq 0 ]]; then verdict="clean"
  elif [[ $rc -eq 99 ]]; then verdict="reports errors"
  elif [[ $rc -eq 124 ]]; then verdict="TIMED OUT"
  else verdict="program failed (rc=$rc)"; fi
  if [[ $expect == mbarrier && ( $rc -eq 0 || $rc -eq 99 ) ]]; then
    verdict=$(python3 tests/kernels/sanitizer/racecheck_verdict.py "$log" 2>&1 | tee -a "$out/sanitizer.log" | head -1)
    python3 tests/kernels/sanitizer/racecheck_verdict.py "$log" > /dev/null 2>&1 || status=1
  elif [[ $expect != flags && $rc -ne 0 ]]; then status=1; fi
  local note_=""
  [[ $expect == flags ]] && note_=" [tool false-positive reproduction: expected to report]"
  note "  [sanitizer] $label ($tool): $verdict; ${n:-no summary line} ($((SECONDS - t0)) s)$note_"
  rm -f "$log"
}

if [[ $san -eq 1 ]]; then
  csan=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [[ -z "$csan" ]]; then
    note "[sanitizer] compute-sanitizer absent: sanitizer step not run"
  else
    : > "$out/sanitizer.log"
    note "[sanitizer] $("$csan" --version | tail -1)"
    repro=/tmp/gdn_sync_patterns
    if nvcc -std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a tests/kernels/sanitizer/sync_patterns.cu \
        -o "$repro" >> "$out/sanitizer.log" 2>&1; then
      for m in cpasync_syncthreads named_arrive prep_pairs_sync; do
        sanitize "repro $m" racecheck clean --racecheck-report analysis "$repro" "$m"
      done
      for m in prep_pairs mbar_st mbar_cpasync; do
        sanitize "repro $m" racecheck flags --racecheck-report analysis "$repro" "$m"
      done
      sanitize "repro generic_store" initcheck clean "$repro" generic_store
      sanitize "repro bulk_store" initcheck flags "$repro" bulk_store
      sanitize "repro tma_store" initcheck flags "$repro" tma_store
    else
      note "  [sanitizer] sync_patterns.cu did not build (sanitizer.log)"; status=1
    fi
    cases=(python3 tests/kernels/sanitizer_cases.py)
    sanitize "cases (every kernel but the wgmma scan)" racecheck clean --racecheck-report analysis \
      --kernel-name-exclude kns=gdnPrefillScanWgKernel "${cases[@]}"
    sanitize "cases (the wgmma scan)" racecheck mbarrier --racecheck-report analysis \
      --kernel-name kns=gdnPrefillScanWgKernel "${cases[@]}"
    sanitize "cases" initcheck clean "${cases[@]}" --poison-bulk-stores
    sanitize "cases, o of the bulk tensor stores not poisoned" initcheck flags "${cases[@]}" --only ragged-gva-raw
    sanitize "cases" memcheck clean "${cases[@]}"
    sanitize "cases" synccheck clean "${cases[@]}"
    sanitize "garbage indices" memcheck clean python3 -m pytest tests/kernels/test_garbage_indices.py -q -p no:cacheprovider
  fi
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
