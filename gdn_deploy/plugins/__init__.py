"""TensorRT side of gdn-deploy: where the plugin library is, and ONNX preparation for the TensorRT parser.

The plugin library ``libgdn_trt_plugins.so`` (built by CMake from ``plugins_cpp/``) holds the
IPluginV3 plugins ``GatedDeltaPrefill`` / ``GatedDeltaDecode`` (namespace ``gdn``, version ``1``).
The ONNX preparation lives in :mod:`gdn_deploy.onnx_nodes` and is re-exported here.

The TensorRT ONNX parser picks a plugin for a node only by ``op_type`` and the node *attributes*
``plugin_namespace`` (default "") and ``plugin_version`` (default "1"); the node's ONNX domain is
not used for that lookup, and a model-local ONNX function with the node's name (the onnxruntime
bodies that ``gdn-export`` attaches) is imported *instead of* the plugin unless the node carries
``plugin_namespace``. :func:`prepare_onnx_for_tensorrt` therefore adds both attributes to every
gdn node and drops the gdn function bodies; ``gdn-build`` does this in memory before parsing.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..onnx_nodes import (PLUGIN_NAMESPACE_ATTR, PLUGIN_VERSION_ATTR, prepare_onnx_for_tensorrt,
                          stamp_plugin_attributes)

__all__ = ["PLUGIN_LIB_ENV", "PLUGIN_LIB_NAME", "plugin_library_candidates", "find_plugin_library",
           "prepare_onnx_for_tensorrt", "stamp_plugin_attributes", "PLUGIN_NAMESPACE_ATTR", "PLUGIN_VERSION_ATTR"]

PLUGIN_LIB_ENV = "GDN_PLUGIN_LIB"
PLUGIN_LIB_NAME = "libgdn_trt_plugins.so"

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
