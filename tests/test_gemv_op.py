"""``gdn::gemv`` off the GPU: the reference path (F.linear + residual), shape inference, the switch and the ctypes
struct mirror of gemvSmallM.h (the kernel itself: tests/kernels/test_gemv.py)."""
from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F

from gdn_deploy.kernels import gemv

HEADER = Path(__file__).resolve().parents[1] / "plugins_cpp" / "kernels" / "gemvSmallM.h"


def test_cpu_is_linear_plus_residual():
    gen = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(3, 65, generator=gen).to(dt)
        w = torch.randn(63, 65, generator=gen).to(dt)
        r = torch.randn(3, 63, generator=gen).to(dt)
        assert not gemv.kernel_applies(x, w, r)
        assert torch.equal(torch.ops.gdn.gemv(x, w), F.linear(x, w))
        assert torch.equal(torch.ops.gdn.gemv(x, w, r), F.linear(x, w) + r)


def test_meta_shapes():
    x = torch.empty(2, 5, 64, device="meta")
    w = torch.empty(100, 64, device="meta")
    assert torch.ops.gdn.gemv(x, w).shape == (2, 5, 100)


def test_switch_off(monkeypatch):
    monkeypatch.setenv(gemv.ENV_VAR, "0")
    assert not gemv.enabled()
    assert gemv.unavailable_reason() == "turned off (GDN_GEMV=0)"
    monkeypatch.setenv(gemv.ENV_VAR, "1")
    assert gemv.enabled()


def test_struct_mirrors_header():
    """Same fields in the same order as gdn::GemvParams (the library's offsets are checked when it loads)."""
    body = re.search(r"struct GemvParams\s*\{(.*?)\};", HEADER.read_text(), re.S).group(1)
    names = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip().rstrip(";")
        if decl:
            decl = decl.split("=")[0].strip()
            names += [n.strip().split()[-1].lstrip("*") for n in decl.split(",")]
    assert names == [n for n, _ in gemv.GemvParams._fields_]
