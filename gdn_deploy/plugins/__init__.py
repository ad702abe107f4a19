"""TensorRT side of gdn-deploy: where the plugin libraries are, loading them once, and ONNX preparation.

CMake builds two libraries from ``plugins_cpp/`` holding the IPluginV3 plugins ``GatedDeltaPrefill`` /
``GatedDeltaDecode`` (namespace ``gdn``, version ``1``):

- ``libgdn_trt_plugins.so`` exports ``getCreators`` / ``setLoggerFinder`` and registers nothing by itself: for
  ``IPluginRegistry::loadLibrary`` (``trtexec --dynamicPlugins``, Python ``load_library``, gdn-build, gdn-check);
- ``libgdn_trt_plugins_autoreg.so`` registers the creators when it is loaded: for tools that only ``dlopen``
  (``trtexec --staticPlugins``, ``polygraphy run/convert --plugins``).

:func:`load_gdn_plugins` registers them exactly once per process (see :mod:`.loader`).

The TensorRT ONNX parser looks a plugin up by ``op_type`` and the node attributes ``plugin_namespace`` /
``plugin_version``, but a model-local ONNX function of the same name (the onnxruntime bodies ``gdn-export``
attaches) wins on parsers 10.0-10.6 and serves the node on every version when the plugin is not registered (see
:mod:`gdn_deploy.onnx_nodes`). TensorRT must therefore get the TensorRT-ready files ``gdn-export`` writes beside
the onnxruntime ones (``prefill.trt.onnx``: bodies removed, attributes stamped, named by ``gdn_model.json``);
:func:`prepare_onnx_for_tensorrt` makes such a model in memory.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..onnx_nodes import (PLUGIN_NAMESPACE_ATTR, PLUGIN_VERSION_ATTR, prepare_onnx_for_tensorrt,
                          stamp_plugin_attributes)
from .loader import PluginLoadError, load_gdn_plugins, registered_gdn_creators

__all__ = ["PLUGIN_LIB_ENV", "PLUGIN_LIB_NAME", "AUTOREG_LIB_NAME", "plugin_library_candidates",
           "find_plugin_library", "load_gdn_plugins", "registered_gdn_creators", "PluginLoadError",
           "prepare_onnx_for_tensorrt", "stamp_plugin_attributes", "PLUGIN_NAMESPACE_ATTR", "PLUGIN_VERSION_ATTR"]

PLUGIN_LIB_ENV = "GDN_PLUGIN_LIB"
PLUGIN_LIB_NAME = "libgdn_trt_plugins.so"
AUTOREG_LIB_NAME = "libgdn_trt_plugins_autoreg.so"

_PACKAGE_DIR = Path(__file__).resolve().parent          # gdn_deploy/plugins
_REPO_ROOT = _PACKAGE_DIR.parent.parent                   # checkout root (source installs)


def plugin_library_candidates() -> list[Path]:
    """Where :func:`find_plugin_library` looks, in order (``$GDN_PLUGIN_LIB`` alone when it is set)."""
    env = os.environ.get(PLUGIN_LIB_ENV)
    if env:
        return [Path(env).expanduser()]
    rel = Path("build") / "plugins_cpp" / PLUGIN_LIB_NAME
    cands = [_REPO_ROOT / rel, Path.cwd() / rel, _PACKAGE_DIR / PLUGIN_LIB_NAME, _PACKAGE_DIR.parent / PLUGIN_LIB_NAME]
    out: list[Path] = []
    for c in cands:
        if c not in out:
            out.append(c)
    return out


def find_plugin_library() -> Path | None:
    """The plugin library: ``$GDN_PLUGIN_LIB`` if set (None when that file does not exist), else
    ``build/plugins_cpp/libgdn_trt_plugins.so`` of the checkout or the current directory, else a copy
    next to the package. None when there is none."""
    for c in plugin_library_candidates():
        if c.is_file():
            return c.resolve()
    return None
