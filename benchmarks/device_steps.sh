# Sourced by the benchmarks/*_device_run.sh scripts: the device run's output folder and its step runner.
#   out=$OUT (default out/device); step NAME LIMIT CMD... runs CMD under a time limit, its output in $out/NAME.txt,
#   one "[NAME] rc=.. (.. s)" line appended to $out/summary.txt.
out=${OUT:-$(pwd)/out/device}
mkdir -p "$out"
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "[$name] rc=$? ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
}
