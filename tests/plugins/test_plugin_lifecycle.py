"""The plugin objects compute the right thing on a GPU, driven through TensorRT's call sequence without TensorRT.

``gdn_plugin_lifecycle`` (plugins_cpp/lifecycle, built by ``scripts/build_kernels.sh --all`` with TensorRT
headers) creates each plugin from parser-shaped fields, walks the build-time calls, enqueues the engine's clone,
re-creates the plugin from its serialized fields, attaches it to a context and enqueues it again directly and
inside a CUDA graph, on a non-default stream with NaN-poisoned outputs. Here every output of every phase is
compared with the float64 reference of lifecycle_cases.py (kernel tolerances of the spec). The host part of the
same harness runs on CPU machines in test_plugin_cmake.py.

Needs a CUDA GPU and a full build (``$GDN_BUILD_DIR`` or ``build/``); skipped with the reason otherwise, an error
under ``GDN_REQUIRE_KERNELS=1`` (scripts/device_gpu_check.sh), so a broken build never passes as skipped.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import rel_err

from .lifecycle_cases import PHASES, default_cases, read_output, write_case

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(os.environ.get("GDN_BUILD_DIR", REPO / "build")) / "plugins_cpp" / "gdn_plugin_lifecycle"


def _harness() -> Path:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if not HARNESS.is_file():
        reason = (f"{HARNESS} not built (scripts/build_kernels.sh --all with TensorRT headers: TensorRT_ROOT=...)")
        if os.environ.get("GDN_REQUIRE_KERNELS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return HARNESS


@pytest.mark.gpu
def test_lifecycle_on_gpu(tmp_path, gen):
    harness = _harness()
    cases = default_cases(gen)
    dirs = [write_case(tmp_path, c) for c in cases]
    r = subprocess.run([str(harness), *map(str, dirs)], capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout[-6000:] + r.stderr[-2000:]
    for case, d in zip(cases, dirs):
        state_in = next((t.value for t in case.inputs if t.name == "state"), None)
        slots = next((t.value for t in case.inputs if t.name == "slots"), None)
        for phase in PHASES:
            for out in case.outputs:
                got = read_output(d, phase, out)
                where = f"{case.name} {phase} {out.name}"
                assert not torch.isnan(got.float()).any(), f"{where}: unwritten (NaN-poisoned) elements"
                err = rel_err(got, out.value)
                assert err <= case.tolerance[out.name], f"{where}: rel err {err:.3e} > {case.tolerance[out.name]}"
            if slots is not None:
                # slot -1: o = 0 and the pool untouched; rows no sequence uses are untouched too (bitwise)
                o = read_output(d, phase, case.outputs[0])
                pool = read_output(d, phase, case.outputs[1])
                used = {int(s) for s in slots if s >= 0}
                for b, s in enumerate(slots.tolist()):
                    if s < 0:
                        assert torch.equal(o[b].float(), torch.zeros_like(o[b].float())), f"{case.name} {phase}"
                for row in range(pool.shape[0]):
                    if row not in used:
                        assert torch.equal(pool[row], state_in[row]), f"{case.name} {phase}: pool row {row} changed"
