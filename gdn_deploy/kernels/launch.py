"""Torch-facing launchers of the CUDA kernels (no validation here: see :mod:`gdn_deploy.kernels`).

Each launcher fills a ctypes params struct from tensors the caller has already validated and
made contiguous, enqueues on torch's current stream and raises ``RuntimeError`` naming the CUDA
error on failure, or :class:`KernelUnsupported` (with the library's reason) when the kernels do not
support the params: the library checks them once per launch, so callers need not ask first.
No allocation and no host sync: usable under CUDA-graph capture.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from .library import DTYPE_CODES, GdnDecodeParams, GdnPrefillParams, error_text, prefill_scan_code

_CODES = {torch.float32: DTYPE_CODES["float32"], torch.float16: DTYPE_CODES["float16"],
          torch.bfloat16: DTYPE_CODES["bfloat16"]}


_UNSUPPORTED, _NOT_BUILT = -1, -2  # launch return codes of gdnKernelsCApi.cpp


class KernelUnsupported(ValueError):
    """The kernels do not support these params (the message holds the library's reason)."""


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def dtype_code(dt: torch.dtype) -> int:
    try:
        return _CODES[dt]
    except KeyError:
        raise ValueError(f"gdn kernels: dtype {dt} is not float32, float16 or bfloat16") from None


def decode_params(q, k, v, g, beta, state_in, state_out, o, slots=None, A_log=None, dt_bias=None, *,
                  gate_mode: int, use_qk_l2norm: int, scale: float, l2norm_eps: float,
                  state_mode: int) -> GdnDecodeParams:
    p = GdnDecodeParams()
    p.B, p.Hk, p.K = q.shape
    p.Hv, p.V = v.shape[1], v.shape[2]
    p.P = state_in.shape[0]
    p.ioType, p.gateType = dtype_code(q.dtype), dtype_code(g.dtype)
    p.gateMode, p.useQkL2norm, p.stateMode = int(gate_mode), int(use_qk_l2norm), int(state_mode)
    p.scale, p.l2normEps = float(scale), float(l2norm_eps)
    p.q, p.k, p.v, p.g, p.beta = _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta)
    p.stateIn, p.stateOut, p.o = _ptr(state_in), _ptr(state_out), _ptr(o)
    p.slots, p.ALog, p.dtBias = _ptr(slots), _ptr(A_log), _ptr(dt_bias)
    return p


def decode_supports(lib: ctypes.CDLL, p: GdnDecodeParams) -> str:
    return (lib.gdnDecodeSupportsC(ctypes.byref(p)) or b"").decode()


def launch_decode(lib: ctypes.CDLL, p: GdnDecodeParams, device: torch.device, bv: int = 0) -> None:
    """Enqueue the decode kernel; ``bv`` forces a V-tile (8/16/32/64), 0 lets the library choose."""
    if bv:
        rc = lib.gdnDecodeLaunchTiledC(ctypes.byref(p), ctypes.c_void_p(_stream(device)), int(bv))
    else:
        rc = lib.gdnDecodeLaunchC(ctypes.byref(p), ctypes.c_void_p(_stream(device)))
    if rc < 0:
        raise KernelUnsupported(f"gdn decode kernel: unsupported parameters: {decode_supports(lib, p)}")
    if rc != 0:
        raise RuntimeError(f"gdn decode kernel launch failed: {error_text(lib, rc)}")


def prefill_params(q, k, v, g, beta, cu_seqlens, initial_state, o, final_state, A_log=None, dt_bias=None, *,
                   gate_mode: int, use_qk_l2norm: int, scale: float, l2norm_eps: float) -> GdnPrefillParams:
    p = GdnPrefillParams()
    p.T, p.Hk, p.K = q.shape
    p.Hv, p.V = v.shape[1], v.shape[2]
    p.N = cu_seqlens.shape[0] - 1
    p.ioType, p.gateType = dtype_code(q.dtype), dtype_code(g.dtype)
    p.gateMode, p.useQkL2norm = int(gate_mode), int(use_qk_l2norm)
    p.scale, p.l2normEps = float(scale), float(l2norm_eps)
    p.q, p.k, p.v, p.g, p.beta = _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta)
    p.cuSeqlens, p.initialState, p.o, p.finalState = _ptr(cu_seqlens), _ptr(initial_state), _ptr(o), _ptr(final_state)
    p.ALog, p.dtBias = _ptr(A_log), _ptr(dt_bias)
    return p


def prefill_supports(lib: ctypes.CDLL, p: GdnPrefillParams) -> str:
    return (lib.gdnPrefillSupportsC(ctypes.byref(p)) or b"").decode()


def prefill_workspace_bytes(lib: ctypes.CDLL, p: GdnPrefillParams, segments: Optional[int] = None) -> int:
    """Workspace bytes of the automatic launch, or (``segments``) of the context-parallel scan forced to that many
    segments per sequence (0: its automatic count)."""
    if segments is not None:
        return int(lib.gdnPrefillWorkspaceSizeSegmentsC(ctypes.byref(p), int(segments)))
    return int(lib.gdnPrefillWorkspaceSizeC(ctypes.byref(p)))


def prefill_scan_runs(lib: ctypes.CDLL, scan: str, K: int) -> bool:
    """Whether prefill scan ``scan`` (a name of :func:`library.prefill_scan_names`) runs here for head dim K."""
    return bool(lib.gdnPrefillScanRunsC(prefill_scan_code(lib, scan), int(K)))


def launch_prefill(lib: ctypes.CDLL, p: GdnPrefillParams, workspace: Optional[Tensor], device: torch.device,
                   scan: str = "auto", tma: bool = True, segments: Optional[int] = None) -> None:
    """Enqueue the prefill kernel with a caller-allocated workspace (``prefill_workspace_bytes``).

    ``scan`` forces a scan variant by name and ``tma=False`` the wgmma scans' cp.async loads (tests and
    benchmarks, gdnPrefillConfig.h); ``segments`` forces a context-parallel scan (``scan`` "cp", "cp_mma" or "cp_wg"; "auto":
    "cp") with that many segments per sequence (0: its automatic count; workspace:
    ``prefill_workspace_bytes(.., segments)``). The defaults are what the product runs."""
    p.workspace = _ptr(workspace)
    p.workspaceBytes = 0 if workspace is None else workspace.numel() * workspace.element_size()
    stream = ctypes.c_void_p(_stream(device))
    if segments is not None:
        rc = lib.gdnPrefillLaunchSegmentsC(ctypes.byref(p), stream, prefill_scan_code(lib, "cp" if scan == "auto" else scan),
                                           int(segments))
    elif scan == "auto" and tma:
        rc = lib.gdnPrefillLaunchC(ctypes.byref(p), stream)
    else:
        rc = lib.gdnPrefillLaunchTunedC(ctypes.byref(p), stream, prefill_scan_code(lib, scan), int(bool(tma)))
    if rc == _NOT_BUILT:
        raise RuntimeError(f"gdn prefill kernel: {prefill_supports(lib, p)}")
    if rc == _UNSUPPORTED:
        raise KernelUnsupported(f"gdn prefill kernel: unsupported parameters: {prefill_supports(lib, p)}")
    if rc != 0:
        raise RuntimeError(f"gdn prefill kernel launch failed: {error_text(lib, rc)}")
