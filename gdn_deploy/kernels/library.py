"""Locate and ctypes-load ``libgdn_kernels.so``; ctypes mirrors of the kernel params structs; the one
place where the C entry points' ctypes signatures are declared.

The structs mirror ``plugins_cpp/kernels/gdnKernels.h`` field for field; :func:`load_library`
checks them against the compiler's layout (``gdnParamsLayoutC``) and refuses a mismatch.
The prefill scan variants are named by the library itself (``gdnPrefillScanNameC``):
:func:`prefill_scan_names` / :func:`prefill_scan_code` turn the names tests and benchmarks pass
into the codes of ``gdnPrefillConfig.h``.
No torch and no CUDA device are needed here.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

LIB_NAME = "libgdn_kernels.so"
ENV_VAR = "GDN_KERNELS_LIB"

# DType enum of gdnKernels.h
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

_P = ctypes.c_void_p
_I = ctypes.c_int32
_F = ctypes.c_float


class GdnPrefillParams(ctypes.Structure):
    _fields_ = [
        ("T", _I), ("N", _I), ("Hk", _I), ("Hv", _I), ("K", _I), ("V", _I),
        ("ioType", _I), ("gateType", _I), ("gateMode", _I), ("useQkL2norm", _I),
        ("scale", _F), ("l2normEps", _F),
        ("q", _P), ("k", _P), ("v", _P), ("g", _P), ("beta", _P), ("cuSeqlens", _P),
        ("initialState", _P), ("ALog", _P), ("dtBias", _P), ("o", _P), ("finalState", _P),
        ("workspace", _P), ("workspaceBytes", ctypes.c_size_t),
    ]


class GdnDecodeParams(ctypes.Structure):
    _fields_ = [
        ("B", _I), ("P", _I), ("Hk", _I), ("Hv", _I), ("K", _I), ("V", _I),
        ("ioType", _I), ("gateType", _I), ("gateMode", _I), ("useQkL2norm", _I), ("stateMode", _I),
        ("scale", _F), ("l2normEps", _F),
        ("q", _P), ("k", _P), ("v", _P), ("g", _P), ("beta", _P), ("stateIn", _P), ("stateOut", _P),
        ("slots", _P), ("ALog", _P), ("dtBias", _P), ("o", _P),
    ]


class GdnVerifyParams(ctypes.Structure):
    _fields_ = [
        ("T", _I), ("N", _I), ("P", _I), ("Hk", _I), ("Hv", _I), ("K", _I), ("V", _I),
        ("ioType", _I), ("gateType", _I), ("gateMode", _I), ("useQkL2norm", _I), ("stateMode", _I),
        ("scale", _F), ("l2normEps", _F),
        ("q", _P), ("k", _P), ("v", _P), ("g", _P), ("beta", _P), ("cuSeqlens", _P), ("state", _P),
        ("slots", _P), ("ALog", _P), ("dtBias", _P), ("o", _P), ("commitK", _P), ("commitDelta", _P),
        ("commitG", _P),
    ]


class GdnCommitParams(ctypes.Structure):
    _fields_ = [
        ("T", _I), ("N", _I), ("P", _I), ("Hk", _I), ("Hv", _I), ("K", _I), ("V", _I), ("stateMode", _I),
        ("commitK", _P), ("commitDelta", _P), ("commitG", _P), ("cuSeqlens", _P), ("accepted", _P),
        ("slots", _P), ("state", _P),
    ]


def candidate_paths() -> list[Path]:
    """Where the library is looked for, in order."""
    out: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Path(env))
    pkg = Path(__file__).resolve().parent
    repo = pkg.parent.parent
    out.append(repo / "build" / "plugins_cpp" / "kernels" / LIB_NAME)
    out.append(pkg / LIB_NAME)
    return out


def find_library() -> Optional[Path]:
    env = os.environ.get(ENV_VAR)
    if env:  # an explicit choice is not second-guessed
        return Path(env) if Path(env).is_file() else None
    for p in candidate_paths():
        if p.is_file():
            return p
    return None


def _struct_layout(cls: type[ctypes.Structure]) -> list[int]:
    return [ctypes.sizeof(cls)] + [getattr(cls, name).offset for name, _ in cls._fields_]


_PP, _PD = ctypes.POINTER(GdnPrefillParams), ctypes.POINTER(GdnDecodeParams)
_PV, _PC = ctypes.POINTER(GdnVerifyParams), ctypes.POINTER(GdnCommitParams)
# The product's entry points (gdnKernels.h and its extern "C" wrappers), stable across builds.
CORE_SIGNATURES = {
    "gdnDecodeLaunchC": (ctypes.c_int, [_PD, ctypes.c_void_p]),
    "gdnDecodeSupportsC": (ctypes.c_char_p, [_PD]),
    "gdnPrefillLaunchC": (ctypes.c_int, [_PP, ctypes.c_void_p]),
    "gdnPrefillSupportsC": (ctypes.c_char_p, [_PP]),
    "gdnPrefillWorkspaceSizeC": (ctypes.c_size_t, [_PP]),
    "gdnKernelsHasPrefillC": (ctypes.c_int, []),
    "gdnCudaErrorNameC": (ctypes.c_char_p, [ctypes.c_int]),
    "gdnCudaErrorStringC": (ctypes.c_char_p, [ctypes.c_int]),
    "gdnParamsLayoutC": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]),
}
# Speculative decoding (gdnVerify.cu): not in CORE_SIGNATURES so that an older build still loads with core_only.
SPECULATIVE_SIGNATURES = {
    "gdnVerifyLaunchC": (ctypes.c_int, [_PV, ctypes.c_void_p]),
    "gdnVerifySupportsC": (ctypes.c_char_p, [_PV]),
    "gdnCommitLaunchC": (ctypes.c_int, [_PC, ctypes.c_void_p]),
    "gdnCommitSupportsC": (ctypes.c_char_p, [_PC]),
}
# Forced configurations for tests and benchmarks (gdnKernelsCApi.cpp): decode V-tile, prefill scan by code,
# context-parallel segments.
TUNING_SIGNATURES = {
    "gdnDecodeLaunchTiledC": (ctypes.c_int, [_PD, ctypes.c_void_p, ctypes.c_int]),
    "gdnPrefillLaunchTunedC": (ctypes.c_int, [_PP, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    "gdnPrefillScanNameC": (ctypes.c_char_p, [ctypes.c_int]),
    "gdnPrefillScanRunsC": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    "gdnPrefillLaunchSegmentsC": (ctypes.c_int, [_PP, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
    "gdnPrefillWorkspaceSizeSegmentsC": (ctypes.c_size_t, [_PP, ctypes.c_int]),
}


def _declare(lib: ctypes.CDLL, sigs: dict) -> None:
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)  # AttributeError -> caller turns it into ImportError
        fn.restype, fn.argtypes = res, args


def check_layout(lib: ctypes.CDLL, *, speculative: bool = True) -> None:
    """Raise ImportError when a ctypes mirror differs from the C++ struct layout (``speculative``: the verify and
    commit params too)."""
    structs = [(0, GdnPrefillParams), (1, GdnDecodeParams)]
    if speculative:
        structs += [(2, GdnVerifyParams), (3, GdnCommitParams)]
    for which, cls in structs:
        buf = (ctypes.c_size_t * 64)()
        n = lib.gdnParamsLayoutC(which, buf, 64)
        got = list(buf[:n])
        want = _struct_layout(cls)
        if got != want:
            raise ImportError(f"gdn_deploy.kernels: ctypes {cls.__name__} layout {want} differs from the "
                              f"library's {got}; rebuild the library or update gdn_deploy/kernels/library.py")


def load_library(path: Optional[Path] = None, *, core_only: bool = False) -> ctypes.CDLL:
    """Load, declare and layout-check the kernel library; ImportError with a reason otherwise.

    ``core_only`` declares the product's entry points alone (an older build for a same-process A/B, whose
    tuning entry points may differ); otherwise the tuning entry points must be there too."""
    path = path or find_library()
    if path is None:
        tried = ", ".join(str(p) for p in candidate_paths())
        raise ImportError(f"gdn_deploy.kernels: {LIB_NAME} not found (tried {tried}); build it with "
                          f"scripts/build_kernels.sh or set {ENV_VAR}")
    try:
        lib = ctypes.CDLL(str(path))
        _declare(lib, CORE_SIGNATURES if core_only
                 else {**CORE_SIGNATURES, **SPECULATIVE_SIGNATURES, **TUNING_SIGNATURES})
    except (OSError, AttributeError) as e:
        raise ImportError(f"gdn_deploy.kernels: cannot load {path}: {e}") from e
    check_layout(lib, speculative=not core_only)
    return lib


def prefill_scan_names(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The prefill scan variants the library names, in code order ("auto" first)."""
    names = []
    while (name := lib.gdnPrefillScanNameC(len(names))) is not None:
        names.append(name.decode())
    return tuple(names)


def prefill_scan_code(lib: ctypes.CDLL, name: str) -> int:
    """The code of prefill scan ``name``; ValueError naming the known ones otherwise."""
    names = prefill_scan_names(lib)
    if name not in names:
        raise ValueError(f"prefill scan {name!r}: unknown, expected one of {', '.join(names)}")
    return names.index(name)


def error_text(lib: ctypes.CDLL, code: int) -> str:
    name = lib.gdnCudaErrorNameC(code) or b"?"
    text = lib.gdnCudaErrorStringC(code) or b""
    return f"{name.decode()} ({code}): {text.decode()}"
