"""The gdn nodes of an ONNX model and their TensorRT plugin attributes (used by both export and plugins).

The TensorRT ONNX parser picks a plugin for a node by ``op_type`` and the node attributes
``plugin_namespace`` / ``plugin_version``; :func:`stamp_plugin_attributes` adds them (the spec's
values) to every gdn node, and :func:`prepare_onnx_for_tensorrt` also drops the onnxruntime
function bodies and the nodes' ``overload``, so only the plugin can serve the node.
"""
from __future__ import annotations

from typing import Iterator

import onnx
from onnx import helper

from .spec import SPEC

__all__ = ["PLUGIN_NAMESPACE_ATTR", "PLUGIN_VERSION_ATTR", "iter_gdn_nodes", "gdn_nodes", "all_gdn_nodes",
           "stamp_plugin_attributes", "prepare_onnx_for_tensorrt"]

PLUGIN_NAMESPACE_ATTR = "plugin_namespace"
PLUGIN_VERSION_ATTR = "plugin_version"


def iter_gdn_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every gdn node of ``graph``, subgraphs (Loop/If/Scan bodies) included."""
    for node in graph.node:
        if node.domain == SPEC.domain and node.op_type in SPEC.ops:
            yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from iter_gdn_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from iter_gdn_nodes(g)


def gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The gdn-domain nodes of the main graph (not of subgraphs or functions)."""
    return [n for n in model.graph.node if n.domain == SPEC.domain]


def all_gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """gdn nodes of the graph, its subgraphs and of model-local functions other than the gdn bodies."""
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
    for node in all_gdn_nodes(model):
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
    for node in all_gdn_nodes(model):
        if node.HasField("overload"):
            node.ClearField("overload")
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.ops)]
    stats["functions_removed"] = len(model.functions) - len(keep)
    if stats["functions_removed"]:
        del model.functions[:]
        model.functions.extend(keep)
    return stats
