"""Register the gdn plugin creators in TensorRT's plugin registry exactly once per process.

``IPluginRegistry.load_library`` fails (returns None) when any creator of the library is already registered, so
a second ``gdn-build`` / ``gdn-check`` in one process, or a library that Polygraphy's ``--plugins`` already loaded,
would fail. :func:`load_gdn_plugins` first asks the registry for every gdn creator and only loads the library when
they are missing; it also refuses a library compiled for another TensorRT major version (whose interfaces differ)
with one clear message instead of handing it to TensorRT.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from ..spec import SPEC

__all__ = ["PluginLoadError", "load_gdn_plugins", "registered_gdn_creators", "library_tensorrt_version"]

# Library handles returned by load_library, by resolved path: kept for the life of the process.
_HANDLES: dict[str, object] = {}


class PluginLoadError(Exception):
    """The gdn plugins could not be registered; the message is one line saying why and what to do."""


def _get_creator(registry):
    return getattr(registry, "get_creator", None) or registry.get_plugin_creator


def registered_gdn_creators(trt) -> dict[str, bool]:
    """For each gdn op: whether its creator (namespace/version of the spec) is in TensorRT's registry."""
    get = _get_creator(trt.get_plugin_registry())
    return {op: get(op, SPEC.plugin_version, SPEC.plugin_namespace) is not None for op in SPEC.plugin_ops}


def library_tensorrt_version(lib: str | Path) -> int | None:
    """NV_TENSORRT_VERSION (major*10000 + minor*100 + patch) the library was compiled with; None when it does not
    say (an older build). Loading libgdn_trt_plugins.so this way registers nothing."""
    try:
        fn = ctypes.CDLL(str(lib)).gdnPluginTensorRtVersion
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int32
    return int(fn())


def _major(trt) -> int:
    head = str(getattr(trt, "__version__", "0")).split(".")[0]
    return int("".join(c for c in head if c.isdigit()) or 0)


def load_gdn_plugins(trt, lib: str | Path) -> str:
    """Make every gdn creator (``SPEC.plugin_ops``) available in this process; returns what was done (one line).

    ``lib`` is ``libgdn_trt_plugins.so`` (loaded with ``load_library``, the handle kept) or
    ``libgdn_trt_plugins_autoreg.so`` (self-registering when loaded). Nothing is loaded when all creators are
    already registered. Raises :class:`PluginLoadError`.
    """
    lib = Path(lib)
    have = registered_gdn_creators(trt)
    if all(have.values()):
        return f"gdn plugins already registered in this process ({', '.join(SPEC.plugin_ops)})"
    if any(have.values()):
        missing = [op for op, ok in have.items() if not ok]
        raise PluginLoadError(f"only some gdn plugin creators are registered in this process ({', '.join(missing)} "
                              "missing): another library registers the same names; load only one gdn plugin library")
    if not lib.is_file():
        raise PluginLoadError(f"plugin library {lib} does not exist")
    try:
        cdll = ctypes.CDLL(str(lib))
    except OSError:
        cdll = None                             # let TensorRT's load_library report what is wrong with the file
    if cdll is not None and hasattr(cdll, "gdnRegisterPlugins"):   # the self-registering library
        cdll.gdnRegisterPlugins.restype = ctypes.c_int32
        cdll.gdnRegisterPlugins()
        how = f"{lib} (self-registering)"
    else:
        built = library_tensorrt_version(lib)
        if built is not None and built // 10000 != _major(trt):
            raise PluginLoadError(
                f"{lib} was compiled with TensorRT {built // 10000}.{built // 100 % 100} headers but this is TensorRT "
                f"{trt.__version__}; rebuild it with TensorRT_ROOT pointing at TensorRT {_major(trt)} "
                "(cmake -S . -B build -DTensorRT_ROOT=... && cmake --build build)")
        try:
            handle = trt.get_plugin_registry().load_library(str(lib))
        except Exception as e:  # noqa: BLE001 - TensorRT raises plain RuntimeError/TypeError
            raise PluginLoadError(f"TensorRT could not load the plugin library {lib}: {e}") from None
        if handle is None:
            raise PluginLoadError(f"TensorRT could not load the plugin library {lib} (see the TensorRT log above)")
        _HANDLES[str(lib.resolve())] = handle
        how = str(lib)
    missing = [op for op, ok in registered_gdn_creators(trt).items() if not ok]
    if missing:
        raise PluginLoadError(f"{lib}: loaded, but no plugin creator {', '.join(missing)} (namespace "
                              f"{SPEC.plugin_namespace!r}, version {SPEC.plugin_version!r}); is it the gdn plugin "
                              "library, built for this TensorRT? (see the log above)")
    return f"plugins: {how} ({', '.join(SPEC.plugin_ops)}, namespace {SPEC.plugin_namespace!r})"
