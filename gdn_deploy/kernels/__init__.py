"""CUDA implementations of the ``gdn`` torch ops, backed by ``libgdn_kernels.so`` (ctypes).

:func:`register` loads the library (``GDN_KERNELS_LIB``, else ``build/plugins_cpp/kernels/
libgdn_kernels.so`` under the repository, else next to this package) and registers CUDA kernels
for ``gdn::decode``, ``gdn::decode_pool_``, ``gdn::verify``, ``gdn::commit``, ``gdn::commit_`` (:mod:`.speculative`) and, when the library was built with the prefill kernel,
``gdn::prefill``. :mod:`gdn_deploy.ops` calls it once after defining the ops; on a machine without
a CUDA device or without a built library the ops keep the PyTorch reference for every device.
A library that exists but cannot be used (wrong struct layout, missing symbols, not loadable) is
reported with a warning; with ``GDN_REQUIRE_KERNELS=1`` every reason the kernels are unavailable
is an error instead (the GPU test suite and ``scripts/device_gpu_check.sh`` set it).
:func:`load` loads and checks the library alone (benchmarks use it without the torch ops).

Inputs are validated with :mod:`gdn_deploy.validate` (value checks, which sync with the device,
only when the current stream is not capturing a CUDA graph), made contiguous, and outputs and
the prefill workspace are allocated with torch's caching allocator: the ops are graph-capturable.
Shapes the kernels do not support (head dims outside the spec's kernel_head_dims) run the PyTorch
reference with a one-time warning.
"""
from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..spec import DECODE, PREFILL
from ..validate import validate_decode, validate_prefill
from . import launch
from .library import GdnDecodeParams, GdnPrefillParams, find_library, load_library  # noqa: F401

REQUIRE_ENV = "GDN_REQUIRE_KERNELS"

LIB = None                        # the loaded ctypes library (after load()/register())
LIB_PATH: Optional[Path] = None
HAS_PREFILL = False
PREFILL_UNAVAILABLE_REASON = "kernel library not loaded"
_fallback_warned: set[str] = set()


@dataclass(frozen=True)
class KernelStatus:
    available: bool              # the CUDA kernels serve the torch ops on cuda tensors
    reason: str                  # why not (empty when available)
    lib_path: Optional[Path] = None
    has_prefill: bool = False


_STATUS: Optional[KernelStatus] = None


class KernelsUnavailable(RuntimeError):
    """Raised by :func:`load` / :func:`register` when the kernels cannot be used."""


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def load():
    """Load and layout-check the kernel library (no torch.library registration); returns the ctypes library.

    Raises :class:`KernelsUnavailable` with the reason when there is no CUDA device or no usable library."""
    global LIB, LIB_PATH, HAS_PREFILL, PREFILL_UNAVAILABLE_REASON
    if LIB is not None:
        return LIB
    if not torch.cuda.is_available():
        raise KernelsUnavailable("no CUDA device (torch.cuda.is_available() is False)")
    try:
        lib = load_library()
    except ImportError as e:
        raise KernelsUnavailable(str(e)) from e
    LIB, LIB_PATH = lib, find_library()
    HAS_PREFILL = bool(lib.gdnKernelsHasPrefillC())
    PREFILL_UNAVAILABLE_REASON = "" if HAS_PREFILL else launch.prefill_supports(lib, GdnPrefillParams())
    return lib


def register() -> KernelStatus:
    """Load the library and register the CUDA kernels of the gdn torch ops (idempotent); returns the status.

    The ops must be defined first (``import gdn_deploy.ops``, which calls this). Unavailable kernels are
    not an error unless ``GDN_REQUIRE_KERNELS=1``; a library that is present but unusable warns."""
    global _STATUS
    if _STATUS is not None and (_STATUS.available or not _required()):
        return _STATUS
    try:
        torch.ops.gdn.prefill  # noqa: B018  (the ops module defines them)
    except (AttributeError, RuntimeError):
        raise RuntimeError("gdn_deploy.kernels.register(): the gdn ops are not defined; import gdn_deploy.ops "
                           "(it defines them and calls register())") from None
    try:
        load()
    except KernelsUnavailable as e:
        _STATUS = KernelStatus(False, str(e), find_library())
        if _required():
            raise KernelsUnavailable(f"gdn CUDA kernels required ({REQUIRE_ENV}=1) but unavailable: {e}") from e
        if _STATUS.lib_path is not None and torch.cuda.is_available():
            warnings.warn(f"gdn CUDA kernels unavailable, the ops run the PyTorch reference: {e}", stacklevel=3)
        return _STATUS
    torch.library.register_kernel("gdn::decode", "cuda", _decode_cuda)
    torch.library.register_kernel("gdn::decode_pool_", "cuda", _decode_pool_cuda)
    if HAS_PREFILL:
        torch.library.register_kernel("gdn::prefill", "cuda", _prefill_cuda)
    from . import speculative  # (replaces the NotImplementedError stubs of gdn_deploy.ops)
    for name, fn in zip(("verify", "commit", "commit_"),
                        speculative.make_cuda_ops(LIB, _same_cuda_device, _c, _fallback)):
        torch.library.register_kernel(f"gdn::{name}", "cuda", fn)
    _STATUS = KernelStatus(True, "", LIB_PATH, HAS_PREFILL)
    return _STATUS


def status() -> KernelStatus:
    """The result of the last :func:`register` (registering now if it never ran and the ops exist)."""
    return _STATUS if _STATUS is not None else register()


_TRUST = threading.local()


class trusted_values:
    """``with trusted_values():`` the CUDA ops skip their value checks (finite inputs, cu_seqlens / slot ranges:
    device-to-host syncs) for callers whose inputs come from their own computation, e.g. the model's layers;
    the kernels clamp offsets and slots on the device either way. Shape and dtype checks stay."""

    def __enter__(self):
        _TRUST.depth = getattr(_TRUST, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        _TRUST.depth -= 1


def _checks_values() -> bool:
    return not getattr(_TRUST, "depth", 0) and not torch.cuda.is_current_stream_capturing()


def _same_cuda_device(names: tuple[str, ...], tensors: tuple[Optional[Tensor], ...]) -> torch.device:
    dev = tensors[0].device
    for n, t in zip(names, tensors):
        if t is not None and t.device != dev:
            raise ValueError(f"{n}: on {t.device}, expected {dev} (all gdn inputs on one CUDA device)")
    return dev


def _c(t: Optional[Tensor]) -> Optional[Tensor]:
    """Contiguous and 16-byte aligned (the kernels use vector loads); copies only when needed."""
    if t is None:
        return None
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _fallback(op: str, why: str) -> None:
    if op not in _fallback_warned:
        _fallback_warned.add(op)
        warnings.warn(f"gdn::{op}: CUDA kernel unavailable for these inputs ({why}); using the PyTorch reference",
                      stacklevel=3)


def _decode_common(q, k, v, g, beta, state, slots, A_log, dt_bias, attrs, state_out):
    """Launch decode; returns o, or None when the kernel does not support the shapes."""
    dev = _same_cuda_device(("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias"),
                            (q, k, v, g, beta, state, slots, A_log, dt_bias))
    q, k, v, g, beta, slots, A_log, dt_bias = (_c(t) for t in (q, k, v, g, beta, slots, A_log, dt_bias))
    o = torch.empty_like(v)
    p = launch.decode_params(q, k, v, g, beta, state, state_out, o, slots, A_log, dt_bias,
                             gate_mode=attrs["gate_mode"], use_qk_l2norm=attrs["use_qk_l2norm"],
                             scale=attrs["scale"], l2norm_eps=attrs["l2norm_eps"], state_mode=attrs["state_mode"])
    try:
        with torch.cuda.device(dev):
            launch.launch_decode(LIB, p, dev)  # (the library checks the params once)
    except launch.KernelUnsupported:
        return None, launch.decode_supports(LIB, p)
    return o, ""


def _decode_cuda(q, k, v, g, beta, state, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0,
                 scale=0.0, l2norm_eps=1e-6):
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                         state_mode=0)
    validate_decode(dict(q=q, k=k, v=v, g=g, beta=beta, state=state, A_log=A_log, dt_bias=dt_bias), attrs,
                    check_values=_checks_values())
    state = _c(state)
    new = torch.empty_like(state)
    o, why = _decode_common(q, k, v, g, beta, state, None, A_log, dt_bias, attrs, new)
    if o is None:
        _fallback("decode", why)
        o, new = reference.decode_ref(q, k, v, g, beta, state, None, A_log, dt_bias, state_mode=0,
                                      check_values=False, **{a: attrs[a] for a in _ATTRS4})
        return o.contiguous(), new.contiguous()
    return o, new


def _decode_pool_cuda(q, k, v, g, beta, pool, slots, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0,
                      scale=0.0, l2norm_eps=1e-6):
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                         state_mode=1)
    validate_decode(dict(q=q, k=k, v=v, g=g, beta=beta, state=pool, slots=slots, A_log=A_log, dt_bias=dt_bias),
                    attrs, check_values=_checks_values())
    work = pool if pool.is_contiguous() and pool.data_ptr() % 16 == 0 else _c(pool)  # a copy here
    o, why = _decode_common(q, k, v, g, beta, work, slots, A_log, dt_bias, attrs, work)
    if o is None:
        _fallback("decode_pool_", why)
        o, new = reference.decode_ref(q, k, v, g, beta, pool, slots, A_log, dt_bias, state_mode=1,
                                      check_values=False, **{a: attrs[a] for a in _ATTRS4})
        used = slots.to(torch.long)
        used = used[used >= 0]
        pool.index_copy_(0, used, new.index_select(0, used).to(pool.dtype))
        return o.contiguous()
    if work is not pool:
        pool.copy_(work)
    return o


def _prefill_cuda(q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None, gate_mode=0,
                  use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6):
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps)
    validate_prefill(dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                          A_log=A_log, dt_bias=dt_bias), attrs, check_values=_checks_values())
    dev = _same_cuda_device(("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias"),
                            (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias))
    q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias = (
        _c(t) for t in (q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias))
    o = torch.empty_like(v)
    final = torch.empty_like(initial_state)
    p = launch.prefill_params(q, k, v, g, beta, cu_seqlens, initial_state, o, final, A_log, dt_bias,
                              **{a: attrs[a] for a in _ATTRS4})
    nbytes = launch.prefill_workspace_bytes(LIB, p)
    ws = torch.empty(nbytes, dtype=torch.uint8, device=dev) if nbytes else None
    try:
        with torch.cuda.device(dev):
            launch.launch_prefill(LIB, p, ws, dev)  # (the library checks the params once)
    except launch.KernelUnsupported:
        _fallback("prefill", launch.prefill_supports(LIB, p))
        o, s = reference.prefill_ref(q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias, form="chunked",
                                     check_values=False, **{a: attrs[a] for a in _ATTRS4})
        return o.contiguous(), s.contiguous()
    return o, final


_ATTRS4 = ("gate_mode", "use_qk_l2norm", "scale", "l2norm_eps")

__all__ = ["LIB", "LIB_PATH", "HAS_PREFILL", "PREFILL_UNAVAILABLE_REASON", "KernelStatus", "KernelsUnavailable",
           "REQUIRE_ENV", "launch", "load", "load_library", "register", "status"]
