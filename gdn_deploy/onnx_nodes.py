"""The gdn nodes of an ONNX model and their TensorRT plugin attributes (used by both export and plugins).

The TensorRT ONNX parser looks a plugin up by ``op_type`` and the node attributes ``plugin_namespace`` /
``plugin_version`` (strings). Whether it uses that plugin or a model-local ONNX function of the same name depends
on its version: 10.0-10.6 import the local function whenever one exists; 10.7-10.14 prefer a registered plugin and
fall back to the function; 10.15+ use the plugin for nodes that carry ``plugin_namespace`` when it is registered,
else the function. A file with the onnxruntime bodies therefore runs the slow function body on TensorRT whenever
the plugin library is not loaded, and on 10.0-10.6 even when it is.

:func:`stamp_plugin_attributes` adds the attributes (the spec's values) to every gdn node (harmless for
onnxruntime); :func:`prepare_onnx_for_tensorrt` also drops the gdn function bodies and the nodes' ``overload``, so
only the plugin can serve a node and a missing plugin fails the parse loudly on every parser version.
:func:`write_tensorrt_onnx` writes such a TensorRT-ready copy (``prefill.trt.onnx``) beside an exported file;
:func:`tensorrt_ready_problems` says why a model is not TensorRT-ready.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import onnx
from onnx import helper

from .spec import SPEC

__all__ = ["PLUGIN_NAMESPACE_ATTR", "PLUGIN_VERSION_ATTR", "TENSORRT_ONNX_SUFFIX", "iter_gdn_nodes", "gdn_nodes",
           "all_gdn_nodes", "stamp_plugin_attributes", "prepare_onnx_for_tensorrt", "tensorrt_ready_problems",
           "tensorrt_onnx_path", "write_tensorrt_onnx"]

PLUGIN_NAMESPACE_ATTR = "plugin_namespace"
PLUGIN_VERSION_ATTR = "plugin_version"
TENSORRT_ONNX_SUFFIX = ".trt.onnx"


def iter_gdn_nodes(graph: onnx.GraphProto, ops=None) -> Iterator[onnx.NodeProto]:
    """Every gdn node of ``graph``, subgraphs (Loop/If/Scan bodies) included. ``ops``: the op names to match
    (default: every op with a TensorRT plugin, ``SPEC.plugin_ops``: prefill, decode, verify, commit)."""
    ops = SPEC.plugin_ops if ops is None else ops
    for node in graph.node:
        if node.domain == SPEC.domain and node.op_type in ops:
            yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from iter_gdn_nodes(a.g, ops)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from iter_gdn_nodes(g, ops)


def gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The gdn-domain nodes of the main graph (not of subgraphs or functions)."""
    return [n for n in model.graph.node if n.domain == SPEC.domain]


def all_gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """gdn nodes of the graph, its subgraphs and of model-local functions other than the gdn bodies."""
    nodes = list(iter_gdn_nodes(model.graph))
    for f in model.functions:
        if not (f.domain == SPEC.domain and f.name in SPEC.plugin_ops):
            for node in f.node:
                if node.domain == SPEC.domain and node.op_type in SPEC.plugin_ops:
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
    keep = [f for f in model.functions if not (f.domain == SPEC.domain and f.name in SPEC.plugin_ops)]
    stats["functions_removed"] = len(model.functions) - len(keep)
    if stats["functions_removed"]:
        del model.functions[:]
        model.functions.extend(keep)
    return stats


def tensorrt_ready_problems(model: onnx.ModelProto) -> list[str]:
    """Why ``model`` would not reach the gdn plugins on every TensorRT parser; empty when it is TensorRT-ready.

    Ready means: no model-local gdn FunctionProto, and every gdn node (subgraphs included) carries
    ``plugin_namespace`` / ``plugin_version`` as STRING attributes with the spec's values and no ``overload``.
    """
    problems = [f"model-local function {f.domain}::{f.name} (the onnxruntime body) is present"
                for f in model.functions if f.domain == SPEC.domain and f.name in SPEC.plugin_ops]
    want = {PLUGIN_NAMESPACE_ATTR: SPEC.plugin_namespace, PLUGIN_VERSION_ATTR: SPEC.plugin_version}
    for node in all_gdn_nodes(model):
        have = {a.name: a for a in node.attribute}
        where = f"{node.op_type} node {node.name!r}"
        for name, value in want.items():
            a = have.get(name)
            if a is None:
                problems.append(f"{where} has no {name} attribute")
            elif a.type != onnx.AttributeProto.STRING:
                problems.append(f"{where}: {name} is not a string attribute (the parser reads it as a string)")
            elif a.s.decode() != value:
                problems.append(f"{where}: {name}={a.s.decode()!r}, the plugins are registered with {value!r}")
        if node.overload:
            problems.append(f"{where} has overload {node.overload!r}")
    return problems


def tensorrt_onnx_path(path: str | Path) -> Path:
    """``prefill.onnx`` -> ``prefill.trt.onnx`` (same folder, so external weight files still resolve)."""
    p = Path(path)
    stem = p.name[:-len(".onnx")] if p.name.endswith(".onnx") else p.name
    return p.with_name(stem + TENSORRT_ONNX_SUFFIX)


def write_tensorrt_onnx(path: str | Path, out: str | Path | None = None) -> Path | None:
    """Write the TensorRT-ready copy of the ONNX file ``path`` (:func:`prepare_onnx_for_tensorrt`) to ``out``
    (default :func:`tensorrt_onnx_path`) and return it; None when the model has no gdn nodes (e.g. an interop
    export), then nothing is written. External data is not loaded: the copy refers to the same weight files.
    onnxruntime's GroupQueryAttention nodes (whole hybrid models) become ScatterND + the standard Attention
    (:func:`gdn_deploy.export.onnx_cache_attention.expand_cache_attention`); onnxruntime's MoE nodes become
    standard ops (:func:`gdn_deploy.export.onnx_moe.expand_moe`, the form of :func:`~gdn_deploy.export.onnx_moe.
    tensorrt_moe_form`)."""
    from .export.onnx_cache_attention import expand_cache_attention
    from .export.onnx_moe import expand_moe, tensorrt_moe_form
    model = onnx.load(str(path), load_external_data=False)
    if not all_gdn_nodes(model):
        return None
    prepare_onnx_for_tensorrt(model)
    expand_cache_attention(model)
    expand_moe(model, tensorrt_moe_form(Path(path).name))
    dst = Path(out) if out is not None else tensorrt_onnx_path(path)
    onnx.save_model(model, str(dst))
    return dst
