"""TensorRT side of gdn-deploy: where the plugin library is, and ONNX preparation for the TensorRT parser.

The plugin library ``libgdn_trt_plugins.so`` (built by CMake from ``plugins_cpp/``) holds the
IPluginV3 plugins ``GatedDeltaPrefill`` / ``GatedDeltaDecode`` (namespace ``gdn``, version ``1``).

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

import onnx
from onnx import helper

from ..export.onnx_functions import iter_gdn_nodes
from ..spec import SPEC

__all__ = ["PLUGIN_LIB_ENV", "PLUGIN_LIB_NAME", "plugin_library_candidates", "find_plugin_library",
           "prepare_onnx_for_tensorrt", "stamp_plugin_attributes", "PLUGIN_NAMESPACE_ATTR", "PLUGIN_VERSION_ATTR"]

PLUGIN_LIB_ENV = "GDN_PLUGIN_LIB"
PLUGIN_LIB_NAME = "libgdn_trt_plugins.so"
PLUGIN_NAMESPACE_ATTR = "plugin_namespace"
PLUGIN_VERSION_ATTR = "plugin_version"

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


def _all_gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = list(iter_gdn_nodes(model.graph))
    for f in model.functions:
        if not (f.domain == SPEC.domain and f.name in SPEC.ops):
            for node in f.node:
                if node.domain == SPEC.domain and node.op_type in SPEC.ops:
                    nodes.append(node)
    return nodes


def stamp_plugin_attributes(model: onnx.ModelProto) -> dict[str, int]:
    """Add ``plugin_namespace``/``plugin_version`` (spec values) to every gdn node that lacks them, in place.

    ``gdn-export`` stamps every file it writes, so the TensorRT parser maps the nodes to the plugins
    while onnxruntime still runs the attached function bodies. Returns ``{"nodes", "attributes_added"}``.
    A node that already names another namespace or version raises ValueError.
    """
    stats = {"nodes": 0, "attributes_added": 0}
    want = {PLUGIN_NAMESPACE_ATTR: SPEC.plugin_namespace, PLUGIN_VERSION_ATTR: SPEC.plugin_version}
    for node in _all_gdn_nodes(model):
        stats["nodes"] += 1
        have = {a.name: a for a in node.attribute}
        for name, value in want.items():
            if name in have:
                got = helper.get_attribute_value(have[name])
                got = got.decode() if isinstance(got, bytes) else got
                if got != value:
                    raise ValueError(f"{node.domain}::{node.op_type} node {node.name!r}: attribute {name}={got!r}, "
                                     f"the gdn plugins are registered with {value!r}")
            else:
                node.attribute.append(helper.make_attribute(name, value))
                stats["attributes_added"] += 1
    return stats


def prepare_onnx_for_tensorrt(model: onnx.ModelProto) -> dict[str, int]:
    """Make ``model`` (in place) select the gdn TensorRT plugins when parsed by TensorRT.

    Stamps ``plugin_namespace``/``plugin_version`` (:func:`stamp_plugin_attributes`), clears the
    nodes' ONNX ``overload``, and removes the model-local gdn FunctionProtos (onnxruntime bodies).
    Other nodes and functions are kept.
    Returns counts: ``{"nodes": gdn nodes, "attributes_added": n, "functions_removed": n}``.
    A node that already names another namespace raises ValueError.
    """
    stats = dict(stamp_plugin_attributes(model), functions_removed=0)
    for node in _all_gdn_nodes(model):
        if node.HasField("overload"):
            node.ClearField("overload")
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.ops)]
    stats["functions_removed"] = len(model.functions) - len(keep)
    if stats["functions_removed"]:
        del model.functions[:]
        model.functions.extend(keep)
    return stats
