#!/usr/bin/env bash
# Set up and run the test suite (the README's test command; CI runs exactly this).
#   bash scripts/test.sh [pytest args...]
# Steps: install (scripts/setup.sh test); compile the CUDA kernels (and the TensorRT plugins when the headers are
# found) for ONE architecture when nvcc is present, so compile errors fail here even without a GPU (output in
# build/build_kernels.log, one summary line; its errors and tail when it fails); run pytest.
# GPU tests and TensorRT tests skip with their reason when there is no GPU / no tensorrt module.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh test
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    GDN_BUILD_DIR="$PWD/build" bash scripts/run_logged.sh build/build_kernels.log \
        "compiling CUDA kernels for sm_${GDN_CI_ARCH:-90a} (compile check; kernels run only on a GPU)" \
        bash scripts/build_kernels.sh --all "${GDN_CI_ARCH:-90a}"
else
    echo "[test] nvcc not found: skipping the CUDA compile check"
fi
set +e
"$PY" -m pytest -ra -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
