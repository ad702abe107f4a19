#!/usr/bin/env bash
# Install gdn-deploy and what it needs into the current Python environment.
#   bash scripts/setup.sh          # runtime deps (export, onnxruntime check)
#   bash scripts/setup.sh test     # + test deps (pytest, transformers, polygraphy)
# torch: an existing install is kept; otherwise torch==2.13.0 is installed (CPU is enough for export and tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=${1:-}
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0"
    "$PY" -m pip install -q "torch==2.13.0"
fi
spec="."
[ "$extra" = "test" ] && spec=".[test]"
echo "[setup] installing gdn-deploy ($spec) and its dependencies"
"$PY" -m pip install -q -e "$spec"
"$PY" -c "import torch, onnx, onnxruntime; print(f'[setup] torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}')"
