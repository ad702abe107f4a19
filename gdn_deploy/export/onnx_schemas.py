"""ONNX ``OpSchema``s of ``gdn::GatedDeltaPrefill`` / ``gdn::GatedDeltaDecode`` (opset 1), built from the spec.

The schemas let ``onnx.checker``, ``onnx.shape_inference`` and onnxscript (hence the torch
dynamo exporter's custom translations) know the ops: inputs, outputs, type constraints,
attributes with defaults, and a type/shape inference function that also checks the
attribute-dependent input list.

Input lists are *compacted* as in the spec (and the TensorRT plugins): inputs whose
``present_if`` is false are left out, not passed as empty names. For GatedDeltaDecode with
``state_mode=0, gate_mode=1`` the inputs are therefore ``q k v g beta state A_log dt_bias``:
position 6 holds ``A_log``. The formal parameters after the fixed ones are declared optional
with types loose enough for every combination; the inference function checks the real types.
"""
from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto
from onnx.defs import OpSchema

from ..spec import SPEC, OpSpec

__all__ = ["register_schemas", "build_schema", "infer_node"]

_DTYPE_STR = {"float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)",
              "int32": "tensor(int32)"}
_ELEM = {"float32": TensorProto.FLOAT, "int32": TensorProto.INT32}
_ATTR_TYPE = {"int": OpSchema.AttrType.INT, "float": OpSchema.AttrType.FLOAT}
# Type constraint prefix for a conditional (compacted) input position that may hold several dtypes.
_LOOSE = "L"


def _type_str(dtype: str) -> str:
    return dtype if dtype in SPEC.raw["type_constraints"] else _DTYPE_STR[dtype]


def build_schema(op: OpSpec) -> OpSchema:
    fixed = [t for t in op.inputs if t.present_if is None]
    cond = [t for t in op.inputs if t.present_if is not None]
    inputs = [OpSchema.FormalParameter(t.name, _type_str(t.dtype), t.doc or f"shape {list(t.shape)}") for t in fixed]
    constraints = [(name, [_DTYPE_STR[d] for d in allowed], f"{name} dtypes of the gdn contract")
                   for name, allowed in SPEC.raw["type_constraints"].items()]
    for i, t in enumerate(cond):
        # Conditional position i may hold any later conditional input (earlier ones can be absent).
        possible = sorted({_DTYPE_STR[u.dtype] for u in cond[i:]})
        type_str = _type_str(t.dtype)
        if len(possible) > 1:
            type_str = f"{_LOOSE}{i}"
            constraints.append((type_str, possible, f"input position {len(fixed) + i} ({', '.join(u.name for u in cond[i:])}"
                                                    " by the attributes)"))
        inputs.append(OpSchema.FormalParameter(
            t.name, type_str, f"{t.doc or 'shape ' + str(list(t.shape))} ({t.dtype}; present iff {t.present_if}; "
            "absent inputs are left out and later ones move up)", param_option=OpSchema.FormalParameterOption.Optional))
    outputs = [OpSchema.FormalParameter(t.name, _type_str(t.dtype), f"shape {list(t.shape)}") for t in op.outputs]
    attributes = []
    for name in op.attributes:
        a = SPEC.attributes[name]
        doc = a.get("doc") or "; ".join(f"{k}: {v}" for k, v in a.get("values", {}).items())
        attributes.append(OpSchema.Attribute(name, onnx.helper.make_attribute(name, a["default"]), doc))
    # Read by the TensorRT ONNX parser to pick the plugin (op_type in this namespace, this version);
    # the op itself ignores them. gdn-export stamps them on every node.
    for name, value in (("plugin_namespace", SPEC.plugin_namespace), ("plugin_version", SPEC.plugin_version)):
        attributes.append(OpSchema.Attribute(name, onnx.helper.make_attribute(name, value),
                                             "TensorRT plugin lookup (ignored by the op)"))
    doc = (f"{op.name} of the gdn contract (Gated DeltaNet; kernel: {_raw_op(op.name)['kernel']}). "
           "Recurrence: " + " | ".join(s.strip() for s in SPEC.raw["recurrence"]))
    schema = OpSchema(op.name, SPEC.domain, SPEC.opset_version, doc, inputs=inputs, outputs=outputs,
                      type_constraints=constraints, attributes=attributes)
    schema.set_type_and_shape_inference_function(lambda ctx: infer_node(op, ctx))
    return schema


def _raw_op(name: str) -> dict[str, Any]:
    return SPEC.raw["ops"].get(name) or SPEC.raw["speculative_ops"][name]


def _attr(ctx, op: OpSpec, name: str) -> Any:
    a = ctx.get_attribute(name)
    if a is None:
        return op.defaults[name]
    return onnx.helper.get_attribute_value(a)


def _tensor_type(ctx, i: int) -> onnx.TypeProto | None:
    if i >= ctx.get_num_inputs() or not ctx.has_input(i):
        return None
    t = ctx.get_input_type(i)
    return t if t is not None and t.HasField("tensor_type") else None


def _fail(op: OpSpec, msg: str) -> None:
    raise onnx.shape_inference.InferenceError(f"[gdn] {SPEC.domain}::{op.name}: {msg}")


def _dims(t: onnx.TypeProto | None) -> list[onnx.TensorShapeProto.Dimension] | None:
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return list(t.tensor_type.shape.dim)


def _out_type(elem: int, dims: list | None) -> onnx.TypeProto:
    out = onnx.TypeProto()
    out.tensor_type.elem_type = elem
    if dims is not None:
        shape = out.tensor_type.shape
        for d in dims:
            nd = shape.dim.add()
            if d is None:
                continue
            nd.CopyFrom(d)
    return out


def infer_node(op: OpSpec, ctx) -> None:
    """Output types/shapes of a gdn node; raises on a wrong input count or dtype."""
    attrs = {name: _attr(ctx, op, name) for name in op.attributes}
    names = op.input_names(attrs)
    if ctx.get_num_inputs() != len(names):
        _fail(op, f"{ctx.get_num_inputs()} inputs given, the attributes {attrs} need {len(names)}: {', '.join(names)}")
    types = {n: _tensor_type(ctx, i) for i, n in enumerate(names)}
    spec_in = {t.name: t for t in op.inputs}
    io_elem = types["q"].tensor_type.elem_type if types.get("q") is not None else None
    gate_elem = types["g"].tensor_type.elem_type if types.get("g") is not None else None
    for n in names:
        t, want = types[n], spec_in[n].dtype
        if t is None:
            continue
        elem = t.tensor_type.elem_type
        if want in _ELEM and elem != _ELEM[want]:
            _fail(op, f"input {n} has element type {onnx.helper.tensor_dtype_to_np_dtype(elem)}, expected {want}")
        if want == "T" and io_elem is not None and elem != io_elem:
            _fail(op, f"input {n} must have the dtype of q")
        if want == "G" and gate_elem is not None and elem != gate_elem:
            _fail(op, f"input {n} must have the dtype of g (g and beta share the gate type G)")
        dims = _dims(t)
        if dims is not None and len(dims) != len(spec_in[n].shape):
            _fail(op, f"input {n} has rank {len(dims)}, expected {len(spec_in[n].shape)} {list(spec_in[n].shape)}")
    if op.name == "GatedDeltaCommit":   # one output: the state (or pool) with the accepted steps replayed
        ctx.set_output_type(0, _out_type(TensorProto.FLOAT, _dims(types["state"])))
        return
    q_dims, v_dims = _dims(types["q"]), _dims(types["v"])
    if q_dims and v_dims and all(d.HasField("dim_value") for d in (q_dims[1], v_dims[1])):
        hk, hv = q_dims[1].dim_value, v_dims[1].dim_value
        if hk == 0 or hv % hk:
            _fail(op, f"Hv={hv} is not a multiple of Hk={hk} (grouped value attention needs Hv % Hk == 0)")
    if io_elem is not None:
        ctx.set_output_type(0, _out_type(io_elem, v_dims))
    if op.name == "GatedDeltaVerify":   # o, then the commit factors k [T,Hk,K], delta [T,Hv,V], g [T,Hv]
        for i, n in enumerate(("k", "v", "g"), start=1):
            ctx.set_output_type(i, _out_type(TensorProto.FLOAT, _dims(types[n])))
        return
    state_name = "initial_state" if "initial_state" in types else "state"
    state_dims = _dims(types[state_name])
    if state_dims is None and q_dims and v_dims:
        state_dims = [None, v_dims[1], q_dims[2], v_dims[2]]
    ctx.set_output_type(1, _out_type(TensorProto.FLOAT, state_dims))


_REGISTERED: dict[str, OpSchema] = {}


def register_schemas() -> None:
    """Register the gdn OpSchemas (plugin and speculative ops) with ``onnx.defs`` (idempotent)."""
    for op in SPEC.all_ops.values():
        if op.name in _REGISTERED or onnx.defs.has(op.name, SPEC.domain):
            continue
        schema = build_schema(op)
        onnx.defs.register_schema(schema)
        _REGISTERED[op.name] = schema
