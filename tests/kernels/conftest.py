"""GPU tests: skipped as a whole, with the reason, when there is no CUDA GPU or no built kernel library.

Build the library first: ``scripts/build_kernels.sh`` (or set GDN_KERNELS_LIB to a built .so).
With ``GDN_REQUIRE_KERNELS=1`` (``scripts/device_gpu_check.sh`` sets it) an unusable library, or none,
is an error that fails the run instead of a skip: a broken build must never pass as "skipped".
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent


def _skip_reason() -> str | None:
    import gdn_deploy.ops  # noqa: F401  (registers the kernels; raises under GDN_REQUIRE_KERNELS=1)
    from gdn_deploy import kernels
    st = kernels.status()
    return None if st.available else f"gdn CUDA kernels unavailable: {st.reason}"


SKIP_REASON = _skip_reason()


def pytest_collection_modifyitems(config, items):
    skip = None if SKIP_REASON is None else pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def kernels():
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    import gdn_deploy.kernels as k
    return k


@pytest.fixture(autouse=True)
def _seed(seed):
    """Fresh inputs every session: the global generators get the per-test seed of tests/conftest.py
    (random base seed, printed in the header; GDN_TEST_SEED=<base> reproduces a run)."""
    torch.manual_seed(seed)
    yield
