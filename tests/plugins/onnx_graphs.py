"""Tiny ONNX graphs with one gdn node each, and gdn-export-like folders around them (test helpers)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from gdn_deploy.onnx_nodes import write_tensorrt_onnx
from gdn_deploy.spec import DECODE, PREFILL, SPEC

ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}

# symbolic shapes of every tensor, per op; dims not in `sizes` stay symbolic (dynamic)
_SHAPES = {
    "q": ["X", "Hk", "K"], "k": ["X", "Hk", "K"], "v": ["X", "Hv", "V"], "g": ["X", "Hv"], "beta": ["X", "Hv"],
    "cu_seqlens": ["N1"], "initial_state": ["N", "Hv", "K", "V"], "final_state": ["N", "Hv", "K", "V"],
    "state": ["S", "Hv", "K", "V"], "new_state": ["S", "Hv", "K", "V"], "slots": ["X"],
    "A_log": ["Hv"], "dt_bias": ["Hv"], "o": ["X", "Hv", "V"],
}


def _dtype(name: str, io: str, gate: str) -> int:
    if name in ("q", "k", "v", "o"):
        return ONNX_DTYPES[io]
    if name in ("g", "beta"):
        return ONNX_DTYPES[gate]
    return TensorProto.INT32 if name in ("cu_seqlens", "slots") else TensorProto.FLOAT


def gdn_model(op_name: str, *, io: str = "float32", gate: str = "float32", Hk: int = 2, Hv: int = 4, K: int = 64,
              V: int = 64, with_function: bool = True, **attrs: Any) -> onnx.ModelProto:
    """A model whose only node is ``gdn::<op_name>`` (inputs/outputs named as in the spec, batch dims dynamic).

    ``with_function`` attaches a dummy model-local FunctionProto of the same name (as gdn-export's
    onnxruntime bodies are) so that preparation for TensorRT has something to remove."""
    op = SPEC.ops[op_name]
    full = op.attrs(**attrs)
    sizes = {"Hk": Hk, "Hv": Hv, "K": K, "V": V}
    ins, outs = op.input_names(full), op.output_names()
    if op_name == DECODE.name and int(full["state_mode"]) == 0:
        sizes_state = "X"   # dense: one state row per sequence
    else:
        sizes_state = "S" if op_name == DECODE.name else "N"

    def vi(name: str):
        shape = [sizes_state if d == "S" else d for d in _SHAPES[name]]
        return helper.make_tensor_value_info(name, _dtype(name, io, gate), [sizes.get(d, d) for d in shape])

    node_attrs = {a: full[a] for a in op.attributes}
    node = helper.make_node(op_name, ins, outs, name=f"{op_name}_0", domain=SPEC.domain, **node_attrs)
    graph = helper.make_graph([node], f"{op_name}_graph", [vi(n) for n in ins], [vi(n) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(SPEC.domain, SPEC.opset_version)])
    if with_function:
        body = [helper.make_node("Identity", [ins[2]], [outs[0]])]
        body += [helper.make_node("Identity", [ins[5] if op_name == DECODE.name else ins[6]], [outs[1]])]
        model.functions.append(helper.make_function(SPEC.domain, op_name, ins, outs, body,
                                                    [helper.make_opsetid("", 18)], list(node_attrs)))
    return model


def write_export_dir(d: Path, graphs: dict[str, onnx.ModelProto], profiles: dict[str, Any] | None = None, *,
                     tensorrt: bool = True) -> Path:
    """Write ``<name>.onnx`` files and a gdn_model.json like gdn-export's (graphs + profiles); with ``tensorrt``
    also the TensorRT-ready ``<name>.trt.onnx`` copies named by ``graphs.<name>.tensorrt_file``, as gdn-export
    writes them (without: a folder from before gdn-export wrote them)."""
    d.mkdir(parents=True, exist_ok=True)
    from gdn_deploy.export.metadata import FORMAT, FORMAT_VERSION
    meta: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": {"kind": "block"},
                            "precision": "fp32", "graphs": {}, "profiles": {}}
    for name, model in graphs.items():
        onnx.save(model, str(d / f"{name}.onnx"))
        meta["graphs"][name] = {"file": f"{name}.onnx",
                                "inputs": [{"name": i.name} for i in model.graph.input]}
        if tensorrt:
            meta["graphs"][name]["tensorrt_file"] = write_tensorrt_onnx(d / f"{name}.onnx").name
    meta["profiles"] = profiles or {}
    (d / "gdn_model.json").write_text(json.dumps(meta, indent=2))
    return d


def decode_profile(B: tuple[int, int, int] = (1, 4, 8), P: int | None = None, *, Hk: int = 2, Hv: int = 4,
                   K: int = 64, V: int = 64, state_mode: int = 0, gate_mode: int = 0) -> dict[str, Any]:
    """min/opt/max of every decode input for batch sizes ``B`` (pool of P rows in state_mode 1)."""
    def s(b: int) -> dict[str, list[int]]:
        rows = b if state_mode == 0 else P
        d = {"q": [b, Hk, K], "k": [b, Hk, K], "v": [b, Hv, V], "g": [b, Hv], "beta": [b, Hv],
             "state": [rows, Hv, K, V]}
        if state_mode == 1:
            d["slots"] = [b]
        if gate_mode == 1:
            d["A_log"] = [Hv]
            d["dt_bias"] = [Hv]
        return d
    lv = [s(b) for b in B]
    return {n: {"min": lv[0][n], "opt": lv[1][n], "max": lv[2][n]} for n in lv[0]}


def prefill_profile(T: tuple[int, int, int] = (1, 64, 256), N: tuple[int, int, int] = (1, 2, 4), *, Hk: int = 2,
                    Hv: int = 4, K: int = 64, V: int = 64, gate_mode: int = 0) -> dict[str, Any]:
    def s(t: int, n: int) -> dict[str, list[int]]:
        d = {"q": [t, Hk, K], "k": [t, Hk, K], "v": [t, Hv, V], "g": [t, Hv], "beta": [t, Hv],
             "cu_seqlens": [n + 1], "initial_state": [n, Hv, K, V]}
        if gate_mode == 1:
            d["A_log"] = [Hv]
            d["dt_bias"] = [Hv]
        return d
    lv = [s(t, n) for t, n in zip(T, N)]
    return {k: {"min": lv[0][k], "opt": lv[1][k], "max": lv[2][k]} for k in lv[0]}


__all__ = ["gdn_model", "write_export_dir", "decode_profile", "prefill_profile", "PREFILL", "DECODE"]
