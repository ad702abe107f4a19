#!/usr/bin/env bash
# Set up and run the main job on the bundled default model (the README's first command):
#   export (prefill + decode graphs) -> onnxruntime vs PyTorch check -> TensorRT engines when TensorRT is present.
#   bash scripts/quickstart.sh [OUTDIR]        (default OUTDIR: out/tiny_gdn_lm)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-out/tiny_gdn_lm}
bash scripts/setup.sh
echo "== 1/3 export the default model to $OUT"
gdn-export default -o "$OUT"
echo "== 2/3 check: onnxruntime (and TensorRT when installed) vs the float32 PyTorch reference in $OUT"
gdn-check "$OUT"
echo "== 3/3 TensorRT engines"
if "$PY" -c "import tensorrt" 2>/dev/null; then
    if [ ! -e build/plugins_cpp/libgdn_trt_plugins.so ] && [ -z "${GDN_PLUGIN_LIB:-}" ]; then
        bash scripts/build_kernels.sh --all
    fi
    gdn-build "$OUT"
else
    echo "TensorRT: skipped (the tensorrt Python module is not installed; see docs/tensorrt.md)"
fi
echo "done: files in $OUT"
