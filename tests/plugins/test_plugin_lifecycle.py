"""The plugin objects compute the right thing on a GPU, driven through TensorRT's call sequence without TensorRT.

``gdn_plugin_lifecycle`` (plugins_cpp/lifecycle, built by ``scripts/build_kernels.sh --all`` with TensorRT
headers) creates each plugin (prefill, decode, verify, commit) from parser-shaped fields, walks the build-time calls, enqueues the engine's clone,
re-creates the plugin from its serialized fields, attaches it to a context and enqueues it again directly and
inside a CUDA graph, on a non-default stream with NaN-poisoned outputs. Here every output of every phase is
compared with the float64 reference of lifecycle_cases.py (kernel tolerances of the spec), and with a pool a
skipped sequence's per-token outputs must be 0 and rows nobody owns keep their bits. The host part of the same
harness runs on CPU machines in test_plugin_cmake.py.

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
        inputs = {t.name: t.value for t in case.inputs}
        for phase in PHASES:
            got = {}
            for out in case.outputs:
                got[out.name] = read_output(d, phase, out)
                where = f"{case.name} {phase} {out.name}"
                assert not torch.isnan(got[out.name].float()).any(), f"{where}: unwritten (NaN-poisoned) elements"
                err = rel_err(got[out.name], out.value)
                assert err <= case.tolerance[out.name], f"{where}: rel err {err:.3e} > {case.tolerance[out.name]}"
            if "slots" in inputs:
                _check_pool_rules(case.name + " " + phase, inputs, got)


def _check_pool_rules(where, inputs, got):
    """Slot -1: every per-token output of that sequence is 0 (decode: its row; verify: its drafted tokens) and
    no pool row changes; rows no sequence owns keep their bits (decode and commit return the pool)."""
    slots = inputs["slots"].tolist()
    cu = inputs["cu_seqlens"].tolist() if "cu_seqlens" in inputs else list(range(len(slots) + 1))
    for b, s in enumerate(slots):
        if s < 0:
            for name, t in got.items():
                if name != "new_state":
                    part = t[cu[b]:cu[b + 1]].float()
                    assert torch.equal(part, torch.zeros_like(part)), f"{where}: {name} of skipped sequence {b}"
    if "new_state" in got:
        pool, used = got["new_state"], {s for s in slots if s >= 0}
        for row in range(pool.shape[0]):
            if row not in used:
                assert torch.equal(pool[row], inputs["state"][row]), f"{where}: pool row {row} changed"
