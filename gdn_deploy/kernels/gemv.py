"""``gdn::gemv``: y = x @ W^T (+ residual) for the decode step's small batches, on the small-M GEMV kernel
(``plugins_cpp/kernels/gemvSmallM.cu``) where it applies, ``torch.nn.functional.linear`` elsewhere.

The kernel serves CUDA tensors with 1..16 rows of x (after flattening the leading dims) and K >= 1, x / W / residual in one
dtype (float32, float16, bfloat16), W and x with unit stride along K. It streams W at copy bandwidth where cuBLAS's
small-M GEMMs do not, and is deterministic (fixed-order sums, no atomics). Every other call -- the CPU, more rows,
mixed dtypes, a library without the kernel, ``GDN_GEMV=0`` -- runs ``F.linear`` (+ residual), the op's reference.
The CUDA path allocates only the output and never syncs: usable under CUDA-graph capture.
"""
from __future__ import annotations

import ctypes
import math
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .library import DTYPE_CODES

ENV_VAR = "GDN_GEMV"                 # "0" turns the kernel off (F.linear everywhere)
MAX_M = 16

_P, _I = ctypes.c_void_p, ctypes.c_int32
_DTYPES = {torch.float32: DTYPE_CODES["float32"], torch.float16: DTYPE_CODES["float16"],
           torch.bfloat16: DTYPE_CODES["bfloat16"]}


class GemvParams(ctypes.Structure):
    """Mirror of ``gdn::GemvParams`` (gemvSmallM.h), checked against ``gdnGemvLayoutC`` when loaded."""
    _fields_ = [("M", _I), ("N", _I), ("K", _I), ("dtype", _I), ("ldx", _I), ("ldw", _I), ("ldy", _I), ("ldr", _I),
                ("splitK", _I), ("x", _P), ("w", _P), ("residual", _P), ("y", _P)]


_LIB = None
_WHY_NOT: Optional[str] = None


def _load():
    """The kernel library with the gemv entry points declared, or None (reason in ``_WHY_NOT``)."""
    global _LIB, _WHY_NOT
    if _LIB is not None or _WHY_NOT is not None:
        return _LIB
    from . import KernelsUnavailable, load
    try:
        lib = load()
    except KernelsUnavailable as e:
        _WHY_NOT = str(e)
        return None
    try:
        lib.gdnGemvLaunchC.restype, lib.gdnGemvLaunchC.argtypes = ctypes.c_int, [ctypes.POINTER(GemvParams), _P]
        lib.gdnGemvSupportsC.restype, lib.gdnGemvSupportsC.argtypes = ctypes.c_char_p, [ctypes.POINTER(GemvParams)]
        lib.gdnGemvLayoutC.restype = ctypes.c_int
        lib.gdnGemvLayoutC.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    except AttributeError:
        _WHY_NOT = "the kernel library has no gemv entry points (built before gemvSmallM.cu)"
        return None
    buf = (ctypes.c_size_t * 32)()
    got = list(buf[:lib.gdnGemvLayoutC(buf, 32)])
    want = [ctypes.sizeof(GemvParams)] + [getattr(GemvParams, n).offset for n, _ in GemvParams._fields_]
    if got != want:
        _WHY_NOT = f"ctypes GemvParams layout {want} differs from the library's {got}"
        return None
    _LIB = lib
    return lib


def enabled() -> bool:
    """Whether ``GDN_GEMV`` leaves the kernel on (the default)."""
    return os.environ.get(ENV_VAR, "1") != "0"


def unavailable_reason() -> Optional[str]:
    """None when the kernel can serve CUDA tensors, else why not."""
    if not enabled():
        return f"turned off ({ENV_VAR}=0)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    _load()
    return _WHY_NOT


def kernel_applies(x: Tensor, w: Tensor, residual: Optional[Tensor] = None) -> bool:
    """Whether :func:`gemv` runs the kernel for these inputs (shape, dtype and device rules only)."""
    if x.device.type != "cuda" or w.device != x.device or x.dtype not in _DTYPES or w.dtype != x.dtype:
        return False
    if x.dim() < 1 or w.dim() != 2 or x.shape[-1] != w.shape[1] or min(w.shape) < 1 or w.stride(1) != 1:
        return False
    M = math.prod(x.shape[:-1])
    ldw = w.stride(0) if w.shape[0] > 1 else w.shape[1]
    if not 1 <= M <= MAX_M or ldw < w.shape[1] or max(ldw, w.shape[1], w.shape[0]) >= 2 ** 31:
        return False
    if residual is not None and (residual.dtype != x.dtype or residual.device != x.device or
                                 tuple(residual.shape) != (*x.shape[:-1], w.shape[0])):
        return False
    return unavailable_reason() is None


def launch(x2: Tensor, w: Tensor, y: Tensor, residual: Optional[Tensor] = None, split_k: int = 0) -> None:
    """Enqueue the kernel on torch's current stream: y [M, N] = x2 [M, K] @ w[N, K]^T (+ residual [M, N]); every
    tensor on one CUDA device, rows of unit stride. ``split_k`` forces the warps per row (1, 2, 4, 8; benchmarks),
    0 lets the library choose. ValueError with the library's reason for unsupported params."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"gdn gemv kernel unavailable: {_WHY_NOT}")
    p = GemvParams()
    p.M, p.K = x2.shape
    p.N = w.shape[0]
    p.dtype = _DTYPES[x2.dtype]
    p.ldx, p.ldy = x2.stride(0) if p.M > 1 else p.K, y.stride(0) if p.M > 1 else p.N
    p.ldw = w.stride(0) if p.N > 1 else p.K
    p.ldr = (residual.stride(0) if p.M > 1 else p.N) if residual is not None else 0
    p.splitK = int(split_k)
    p.x, p.w, p.y = x2.data_ptr(), w.data_ptr(), y.data_ptr()
    p.residual = residual.data_ptr() if residual is not None else None
    with torch.cuda.device(x2.device):
        rc = lib.gdnGemvLaunchC(ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream(x2.device).cuda_stream))
    if rc == -1:
        raise ValueError(f"gdn gemv kernel: unsupported parameters: {(lib.gdnGemvSupportsC(ctypes.byref(p)) or b'').decode()}")
    if rc != 0:
        from .library import error_text
        raise RuntimeError(f"gdn gemv kernel launch failed: {error_text(lib, rc)}")


def _rows(t: Tensor) -> Tensor:
    """t as [M, last] with unit stride along the last dim (a copy only when the view cannot be had)."""
    t2 = t.reshape(-1, t.shape[-1])
    ok = t2.stride(-1) == 1 and (t2.shape[0] == 1 or t2.stride(0) >= t2.shape[1])
    return t2 if ok else t2.contiguous()


@torch.library.custom_op("gdn::gemv", mutates_args=())
def gemv(x: Tensor, weight: Tensor, residual: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight) (+ residual)``: on the small-M kernel where :func:`kernel_applies`, else on F.linear."""
    if not kernel_applies(x, weight, residual):
        y = F.linear(x, weight)
        return y if residual is None else y + residual
    x2 = _rows(x)
    y = torch.empty((x2.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    r2 = _rows(residual) if residual is not None else None
    launch(x2, weight, y, r2)
    return y.reshape(*x.shape[:-1], weight.shape[0])


@gemv.register_fake
def _(x, weight, residual=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
