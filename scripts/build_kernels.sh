#!/usr/bin/env bash
# Build the gdn CUDA kernel libraries with CMake into build/ (or $GDN_BUILD_DIR):
#   build/plugins_cpp/kernels/libgdn_kernels.so        (ctypes: gdn_deploy.kernels)
#   build/plugins_cpp/kernels/libgdn_kernels_static.a  (TensorRT plugin library)
# Usage: scripts/build_kernels.sh [--all] [ARCHS]
#   ARCHS   CMake CUDA architectures, default $GDN_CUDA_ARCHS or "80;89;90a" (CI: "90a")
#   --all   build every target (also the TensorRT plugins when their headers are found)
# Env: GDN_BUILD_DIR (default build/), GDN_CMAKE_ARGS (extra configure args, e.g. -DGDN_SKIP_PREFILL=ON)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
targets=(--target gdn_kernels gdn_kernels_static)
if [[ "${1:-}" == "--all" ]]; then
  targets=()
  shift
fi
archs=${1:-${GDN_CUDA_ARCHS:-80;89;90a}}
build=${GDN_BUILD_DIR:-$root/build}
gen=()
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  gen=(-G Ninja)
fi
jobs=$(nproc 2>/dev/null || echo 4)
echo "gdn: building kernels for CUDA archs '$archs' in $build ($jobs jobs)"
cmake -S "$root" -B "$build" "${gen[@]}" -DGDN_CUDA_ARCHS="$archs" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DCMAKE_BUILD_TYPE=Release -DGDN_SKIP_PREFILL=OFF ${GDN_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs" "${targets[@]}"
ls -la "$build/plugins_cpp/kernels/"libgdn_kernels*
