#!/usr/bin/env bash
# Run a noisy command with its output in a log file; print one summary line, or on failure the log's errors and tail.
#   bash scripts/run_logged.sh LOG "what it does" CMD [ARGS...]
# Exit status: the command's. Used by scripts/test.sh for the CUDA compile check (hundreds of ptxas lines).
set -uo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: run_logged.sh LOG WHAT CMD [ARGS...]" >&2
  exit 2
fi
log=$1 what=$2
shift 2
mkdir -p "$(dirname "$log")"
start=$SECONDS
"$@" >"$log" 2>&1
rc=$?
secs=$((SECONDS - start))
if [[ $rc -eq 0 ]]; then
  echo "[test] $what: ok in ${secs} s ($(wc -l <"$log") lines of output in $log)"
else
  echo "[test] $what: FAILED (exit $rc) after ${secs} s; full output in $log" >&2
  errors=$(grep -n -i -m 20 -E '(^|[^a-z_])error([^a-z_]|$)' "$log" || true)
  if [[ -n "$errors" ]]; then
    echo "--- first lines naming an error:" >&2
    echo "$errors" >&2
  fi
  echo "--- last 30 lines:" >&2
  tail -n 30 "$log" >&2
fi
exit $rc
