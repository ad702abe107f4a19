"""Layer stamping: export a hybrid LM's prefill / decode graph by tracing one decoder layer of each kind and
cloning its translated nodes for every layer of that kind.

Tracing (``torch.export`` and its decompositions) and translating cost time in proportion to the graph's node
count, and a decoder layer's nodes depend only on its kind, so for a model whose layer kinds repeat:

1. :func:`stamp_plan` groups the layers by signature (``layer_type``, post-norm, the MLP class, the layer's
   parameter names, shapes and dtypes, and its ``repr``, which shows sizes, eps and options) and picks the first layer of
   each kind (Qwen3.5 and Qwen3-Next: one GDN and one attention layer, whatever the depth);
2. the reduced model of those layers (the same modules, renumbered 0, 1, ...) is traced and translated with a
   marker node ``gdn_stamp::LayerEnd(h, layer=j)`` on the first layer's input (``j = -1``) and on each layer's
   output hidden state;
3. :func:`stamp_layers` tags every value of the translated, not yet optimized ``onnx_ir`` graph with the layer it
   depends on (its parameters and state inputs; a marker's output counts as the next layer's input). Values that
   depend on no layer (functions of ``input_ids``, ``cu_seqlens``, ``positions``, ``pad_index``, input shapes and
   literal constants, e.g. the RoPE tables) are shared and stay where the first layer of their kind computed them;
4. every layer ``i`` of the whole model gets a clone of its kind's tagged nodes (attributes shared, values renamed)
   reading layer ``i``'s hidden input, state inputs ``*_{i}`` and parameters ``net.layers.{i}.*`` (from the module,
   or for a lazy export the checkpoint) and writing ``*_out_{i}``; the head (final norm, logits) follows the last
   layer and the markers go. The optimizer then runs on the whole graph as it does on a fully traced one, so
   constants it folds out of each layer's weights are each layer's own.

A layer's nodes may read only shared values, its own and the previous layer's hidden state, and the head only
shared values and the last hidden state: anything else (or a subgraph attribute) raises :class:`NotStampable` and
``gdn-export`` traces every layer, saying why in one line. ``tests/export/test_layer_stamping.py`` checks for every
family that the stamped graphs equal the fully traced ones node by node and on onnxruntime.

``gdn-export --trace-every-layer``, ``ExportOptions(stamp=False)`` or ``GDN_EXPORT_STAMP=0`` trace every layer.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

__all__ = ["StampPlan", "stamp_plan", "stamping_enabled", "marked_layers", "LAYER_END", "layer_end_translations",
           "stamp_layers", "stamp_setup", "reduced_model", "parameter_tensor", "NotStampable"]

LAYER_END = ("gdn_stamp", "LayerEnd")
_LAYER_PARAM = re.compile(r"^net\.layers\.(\d+)\.(.*)$")
_STATE_NAME = re.compile(r"^(.*)_(\d+)$")


class NotStampable(Exception):
    """The model's layers do not fit the stamping assumptions (the message says why)."""
    stamping_refused = True


def stamping_enabled(option: bool = True) -> bool:
    return bool(option) and os.environ.get("GDN_EXPORT_STAMP", "1").strip().lower() not in ("0", "off", "false",
                                                                                             "no")


# ---- the marker op --------------------------------------------------------------------------------
@torch.library.custom_op("gdn_stamp::layer_end", mutates_args=())
def layer_end(h: Tensor, layer: int) -> Tensor:
    """Identity on a layer's output hidden state (export only: marks the layer boundary in the traced graph)."""
    return h.clone()


@layer_end.register_fake
def _(h, layer):
    return h.new_empty(h.shape)


def _register_schema() -> None:
    import onnx
    from onnx.defs import OpSchema
    if onnx.defs.has(LAYER_END[1], LAYER_END[0]):
        return
    schema = OpSchema(LAYER_END[1], LAYER_END[0], 1, "export-time layer boundary (removed before saving)",
                      inputs=[OpSchema.FormalParameter("h", "T")], outputs=[OpSchema.FormalParameter("y", "T")],
                      type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "")],
                      attributes=[OpSchema.Attribute("layer", OpSchema.AttrType.INT, "layer index")])
    schema.set_type_and_shape_inference_function(_infer_identity)
    onnx.defs.register_schema(schema)


def _infer_identity(ctx) -> None:
    ctx.set_output_type(0, ctx.get_input_type(0))


def _layer_end_translation(h, layer: int):
    import onnxscript
    _register_schema()
    return onnxscript.values.Opset(LAYER_END[0], 1).LayerEnd(h, layer=layer)


def layer_end_translations() -> dict:
    return {torch.ops.gdn_stamp.layer_end.default: _layer_end_translation}


# ---- which layers are traced, which stamped ----------------------------------------------------------
@dataclass
class StampPlan:
    traced: list[int]               # the layers of the traced model (the first of each kind), in order
    kind_of: list[int]              # layer i -> index into ``traced`` of the layer whose nodes it clones
    num_layers: int


def _signature(layer: nn.Module) -> tuple:
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters(remove_duplicate=False))
    return (type(layer).__name__, getattr(layer, "layer_type", None), getattr(layer, "post_norm", None),
            type(getattr(layer, "mlp", None)).__name__, params, repr(layer))   # repr: sizes, eps, options


def stamp_plan(net: nn.Module) -> StampPlan:
    """The layers to trace (the first of each signature) and each layer's template; raises :class:`NotStampable`
    when no signature repeats."""
    layers = getattr(net, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not hasattr(net, "hybrid_config"):
        raise NotStampable("not a hybrid LM with a layer list")
    sigs = [_signature(layer) for layer in layers]
    first: dict = {}
    for i, s in enumerate(sigs):
        first.setdefault(s, i)
    traced = sorted(first.values())
    if len(traced) == len(sigs):
        raise NotStampable(f"no layer kind repeats ({len(sigs)} layers)")
    return StampPlan(traced, [traced.index(first[s]) for s in sigs], len(sigs))


def reduced_model(net: nn.Module, layers: list[int]) -> nn.Module:
    """A shallow copy of ``net`` holding only ``layers`` (the same modules and parameters; parameter and state
    names then number them 0, 1, ... in that order)."""
    small = copy.copy(net)
    small._modules = dict(net._modules)
    small._parameters = dict(net._parameters)
    small._buffers = dict(net._buffers)
    small.layers = nn.ModuleList([net.layers[i] for i in layers])
    c = net.hybrid_config
    small.hybrid_config = dataclasses.replace(c, layer_types=[c.layer_types[i] for i in layers],
                                              mlp_types=[c.mlp_types[i] for i in layers])
    return small


@contextlib.contextmanager
def marked_layers(net: nn.Module):
    """While active, each layer's ``prefill`` / ``decode`` passes its output hidden state through ``layer_end``
    (and the first layer its input, as layer -1's end)."""
    patched = []

    def wrap(j, fn):
        def call(h, *args, **kwargs):
            if j == 0:
                h = torch.ops.gdn_stamp.layer_end(h, -1)
            h, state = fn(h, *args, **kwargs)
            return torch.ops.gdn_stamp.layer_end(h, j), state
        return call

    try:
        for j, layer in enumerate(net.layers):
            for name in ("prefill", "decode"):
                setattr(layer, name, wrap(j, getattr(layer, name)))   # instance attribute: shadows the method
                patched.append((layer, name))
        yield
    finally:
        for layer, name in patched:
            layer.__dict__.pop(name, None)


# ---- stamping the translated ONNX IR -------------------------------------------------------------------
def _layer_of_param(name: str) -> int | None:
    m = _LAYER_PARAM.match(name)
    return int(m.group(1)) if m else None


def _renamed_param(name: str, layer: int) -> str:
    m = _LAYER_PARAM.match(name)
    return f"net.layers.{layer}.{m.group(2)}"


def _renamed_state(name: str, layer: int) -> str:
    return f"{_STATE_NAME.match(name).group(1)}_{layer}"


def _state_output_tail(node, state_layers: dict, segment: dict, layer: int) -> bool:
    """Whether ``node`` only turns values of reduced layer ``layer`` into that layer's state outputs: its outputs
    feed no node and are graph outputs of states, and its inputs are graph inputs, initializers, constants or
    values made in segments up to ``layer``. torch.export places the casts of bf16 models' new states (to the
    float32 state outputs) after the last layer; such a node belongs to its layer's segment."""
    for o in node.outputs:
        if list(o.uses()) or not o.is_graph_output() or state_layers.get(o.name) != layer:
            return False
    for v in node.inputs:
        if v is None:
            continue
        p = v.producer()
        if p is not None and segment.get(id(p), layer + 1) > layer:
            return False
    return True


def stamp_layers(model: Any, plan: StampPlan, state_layers: dict[str, int],
                 make_initializer: Callable[[str, Any], Any]) -> int:
    """Turn the translated graph of the reduced model (``onnx_ir.Model`` with ``LayerEnd`` markers; layer ``r``
    of it is the model's layer ``plan.traced[r]``) into the whole model's graph, in place. ``state_layers``:
    the reduced graph's state input / output names -> reduced layer; ``make_initializer(name, template_value)``
    returns the tensor of the whole model's parameter ``name``. Returns the number of layer nodes written;
    raises :class:`NotStampable` when a layer's nodes read what they may not."""
    import onnx_ir as ir
    graph = model.graph
    R = len(plan.traced)
    nodes = list(graph)
    markers: dict[int, Any] = {}
    for node in nodes:
        if (node.domain, node.op_type) == LAYER_END:
            markers[int(node.attributes["layer"].value)] = node
    if sorted(markers) != list(range(-1, R)):
        raise NotStampable(f"expected layer markers -1..{R - 1}, found {sorted(markers)}")
    for node in nodes:
        for a in node.attributes.values():
            if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                raise NotStampable(f"node {node.op_type} holds a subgraph")

    # tag: the reduced layer a value depends on (None: shared by all layers; R: the head)
    tag: dict[int, int | None] = {}
    graph_inputs = {id(v) for v in graph.inputs}
    for v in graph.inputs:
        tag[id(v)] = state_layers.get(v.name)
    for name, v in graph.initializers.items():
        tag[id(v)] = _layer_of_param(name)
    segment: dict[int, int] = {}           # id(node) -> the layer whose markers enclose it (-1 before, R after)
    seg = -1
    for node in nodes:
        if (node.domain, node.op_type) == LAYER_END:
            j = int(node.attributes["layer"].value)
            tag[id(node.outputs[0])] = j + 1
            segment[id(node)] = j
            seg = j + 1 if j >= 0 else 0
            continue
        segment[id(node)] = seg
        if node.op_type == "Shape" and node.inputs and id(node.inputs[0]) in graph_inputs:
            t = None                       # an input's shape: the same for every layer's state
        else:
            ts = [x for x in (tag.get(id(v)) for v in node.inputs if v is not None) if x is not None]
            t = max(ts) if ts else None
            if ts and min(ts) != t:
                raise NotStampable(f"a node {node.op_type} of layer {t} reads values of layer {min(ts)}")
        for o in node.outputs:
            tag[id(o)] = t
        if t is not None and t < seg and _state_output_tail(node, state_layers, segment, t):
            segment[id(node)] = t          # a cast of layer t's new state placed after later layers: move it back
            continue
        if t is not None and t != seg:
            raise NotStampable(f"a node {node.op_type} of layer {t} is traced among layer {seg}'s")
        if seg == R and t is not None and t != R:
            raise NotStampable(f"the head reads {node.op_type} of layer {t}")

    reduced_inits = {name: v for name, v in graph.initializers.items() if _layer_of_param(name) is not None}
    fixed_inputs = [v for v in graph.inputs if state_layers.get(v.name) is None]
    reduced_states = [(v, v.name) for v in graph.inputs if state_layers.get(v.name) is not None]
    head_outputs = [v for v in graph.outputs if state_layers.get(v.name) is None]
    state_out = {id(v) for v in graph.outputs if state_layers.get(v.name) is not None}
    out_rank = {id(v): k for k, v in enumerate(graph.outputs)}     # each layer's state outputs in traced order
    by_segment: dict[int, list] = {}
    for node in nodes:
        if (node.domain, node.op_type) != LAYER_END:
            by_segment.setdefault(segment[id(node)], []).append(node)
    for name in reduced_inits:
        graph.initializers.pop(name)
    graph.remove(nodes, safe=False)

    order = list(by_segment.get(-1, []))
    hidden = markers[-1].inputs[0]
    new_inputs, new_outputs = [], []
    last = {r: i for i, r in enumerate(plan.kind_of)}
    for i in range(plan.num_layers):
        r = plan.kind_of[i]
        first = plan.traced[r] == i
        env: dict[int, Any] = {id(markers[r - 1].outputs[0]): hidden}
        for v, name in reduced_states:
            if state_layers.get(name) == r:
                if i == last[r]:           # the same input, renamed: shared nodes read its shape (as traced
                    v.name, nv = _renamed_state(name, i), v     # in full: torch.export's choice, the last)
                else:
                    nv = ir.Value(name=_renamed_state(name, i), shape=v.shape, type=v.type)
                env[id(v)] = nv
                new_inputs.append(nv)
        for name, v in reduced_inits.items():
            if _layer_of_param(name) == r:
                new_name = _renamed_param(name, i)
                nv = ir.Value(name=new_name, shape=v.shape, type=v.type,
                              const_value=make_initializer(new_name, v))
                graph.register_initializer(nv)
                env[id(v)] = nv
        layer_outputs = []
        for node in by_segment.get(r, []):
            if not node.outputs or tag[id(node.outputs[0])] is None:
                if first:
                    order.append(node)     # shared: kept where the first layer of its kind computes it
                continue
            ins = [None if v is None else env.get(id(v), v) for v in node.inputs]
            attrs = [ir.Attr(a.name, a.type, a.value, a.ref_attr_name, doc_string=a.doc_string)
                     for a in node.attributes.values()]
            new = ir.Node(node.domain, node.op_type, ins, attrs, overload=node.overload,
                          num_outputs=len(node.outputs), version=node.version,
                          name=f"{node.name}__layer{i}" if node.name else None, doc_string=node.doc_string,
                          metadata_props=dict(node.metadata_props))
            for o, no in zip(node.outputs, new.outputs):
                no.type = o.type
                no.shape = o.shape.copy() if o.shape is not None else None
                if id(o) in state_out:
                    no.name = _renamed_state(o.name, i)
                    layer_outputs.append((out_rank[id(o)], no))
                else:
                    no.name = f"{o.name}__layer{i}"
                env[id(o)] = no
            order.append(new)
        new_outputs += [no for _, no in sorted(layer_outputs, key=lambda x: x[0])]
        hidden = env[id(markers[r].inputs[0])]
    last_out = markers[R - 1].outputs[0]
    for node in by_segment.get(R, []):
        for k, v in enumerate(node.inputs):
            if v is last_out:
                node.replace_input_with(k, hidden)
        order.append(node)
    kept = {id(n) for n in order}
    for node in nodes:                     # the reduced model's layer nodes and the markers: detached
        if id(node) not in kept:
            for k in range(len(node.inputs)):
                node.replace_input_with(k, None)
    graph.extend(order)
    graph.inputs.clear()
    graph.inputs.extend([*fixed_inputs, *new_inputs])
    graph.outputs.clear()
    graph.outputs.extend([*head_outputs, *new_outputs])
    return len(order)


def parameter_tensor(module: nn.Module, loaders: dict[str, Callable[[], Tensor]] | None) -> Callable[[str, Any], Any]:
    """``make_initializer`` for :func:`stamp_layers`: the parameter of ``module`` (the full plan module) named
    ``name``, or with ``loaders`` (a lazy export) a tensor that reads it from the checkpoint when written."""
    from torch.onnx._internal.exporter._core import TorchTensor
    params = dict(module.named_parameters(remove_duplicate=False))

    def make(name: str, template):
        if loaders is not None:
            from .lazy_export import lazy_tensor
            return lazy_tensor(name, loaders[name], template.const_value)
        p = params.get(name)
        if p is None:
            raise NotStampable(f"no parameter {name!r} in the model")
        return TorchTensor(p.detach(), name=name)

    return make


def stamp_setup(plan: Any, target: Any, make_plan: Callable[[Any, str], Any], log: Callable[[str], None]):
    """For the whole model's graph ``plan``: (the reduced model's plan, the IR transform that stamps every layer,
    the reduced target). Raises :class:`NotStampable` when no layer kind repeats."""
    from .hybrid_graphs import hybrid_state_specs
    from .lazy_export import is_lazy, lazy_initializers
    from .targets import ExportTarget
    net = target.module
    sp = stamp_plan(net)
    small_net = reduced_model(net, sp.traced)
    small = ExportTarget(small_net, target.kind, target.source, target.all_logits, target.mtp_head)
    traced = make_plan(small, plan.name)
    state_layers = {s[k]: s["layer"] for s in hybrid_state_specs(small_net)
                    for k in ("prefill_input", "prefill_output", "decode_input", "decode_output")}
    make = parameter_tensor(plan.module, lazy_initializers(plan.module, target) if is_lazy(target) else None)

    def transform(model):
        n = stamp_layers(model, sp, state_layers, make)
        log(f"  {plan.name}: traced {len(sp.traced)} of {sp.num_layers} layers ({sp.traced}), stamped the others "
            f"({n} nodes)")

    return traced, transform, small
