"""The gdn op contract, loaded from ``gdn_ops.json`` (the single source of truth).

Everything that names an op, an input, an attribute, a default, a tolerance or a
validation message reads it from here: the reference, the torch.library ops, the
ONNX OpSchemas, the tests, and (through ``--emit-cpp``) the TensorRT plugins.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

__all__ = ["SPEC", "OpSpec", "TensorSpec", "ContractError", "contract_error", "load_spec",
           "PREFILL", "DECODE", "VERIFY", "COMMIT", "GATE_PRECOMPUTED", "GATE_RAW", "STATE_DENSE", "STATE_POOL"]

GATE_PRECOMPUTED, GATE_RAW = 0, 1
STATE_DENSE, STATE_POOL = 0, 1


class ContractError(ValueError):
    """A violation of the gdn op contract. ``rule`` is the spec's validation id."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"[gdn:{rule}] {message}")
        self.rule = rule


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...]
    dtype: str
    present_if: str | None = None
    doc: str = ""

    def present(self, attrs: dict[str, Any]) -> bool:
        """Whether this input/output exists for the given attribute values."""
        if self.present_if is None:
            return True
        attr, _, value = self.present_if.partition("==")
        return int(attrs[attr.strip()]) == int(value)


@dataclass(frozen=True)
class OpSpec:
    name: str
    torch_op: str
    attributes: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    defaults: dict[str, Any] = field(default_factory=dict)

    def attrs(self, **given: Any) -> dict[str, Any]:
        """Attribute values with the spec defaults filled in; unknown names raise."""
        unknown = set(given) - set(self.attributes)
        if unknown:
            raise contract_error("attribute", name=",".join(sorted(unknown)),
                                 why=f"not an attribute of {self.name} (known: {', '.join(self.attributes)})")
        out = dict(self.defaults)
        out.update({k: v for k, v in given.items() if v is not None})
        return out

    def input_names(self, attrs: dict[str, Any]) -> list[str]:
        return [t.name for t in self.inputs if t.present(attrs)]

    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


class _Spec:
    def __init__(self, raw: dict[str, Any]):
        self.raw = raw
        self.domain: str = raw["domain"]
        self.opset_version: int = raw["opset_version"]
        self.plugin_namespace: str = raw["plugin_namespace"]
        self.plugin_version: str = raw["plugin_version"]
        self.chunk_size: int = raw["chunk_size"]
        self.max_draft_tokens: int = raw["max_draft_tokens"]
        self.io_dtypes: tuple[str, ...] = tuple(raw["io_dtypes"])
        self.gate_dtypes: tuple[str, ...] = tuple(raw["gate_dtypes"])
        self.kernel_head_dims: tuple[int, ...] = tuple(raw["kernel_head_dims"])
        self.attributes: dict[str, dict[str, Any]] = raw["attributes"]
        self.tolerances: dict[str, Any] = raw["tolerances"]
        self.errors: dict[str, str] = {v["id"]: v["error"] for v in raw["validation"]}
        # ops: prefill/decode; speculative_ops: verify/commit; all_ops: both. Every op has a TensorRT plugin
        # (plugin_ops: the creators libgdn_trt_plugins.so returns, the nodes the *.trt.onnx copies hand to them).
        self.ops: dict[str, OpSpec] = {n: self._op(n, op) for n, op in raw["ops"].items()}
        self.speculative_ops: dict[str, OpSpec] = {n: self._op(n, op) for n, op in raw["speculative_ops"].items()
                                                   if not n.startswith("_")}
        self.all_ops: dict[str, OpSpec] = {**self.ops, **self.speculative_ops}
        self.plugin_ops: dict[str, OpSpec] = self.all_ops

    def _op(self, name: str, op: dict[str, Any]) -> OpSpec:
        mk = lambda d: TensorSpec(d["name"], tuple(d["shape"]), d["dtype"], d.get("present_if"), d.get("doc", ""))
        return OpSpec(name=name, torch_op=op["torch_op"], attributes=tuple(op["attributes"]),
                      inputs=tuple(mk(d) for d in op["inputs"]), outputs=tuple(mk(d) for d in op["outputs"]),
                      defaults={a: self.attributes[a]["default"] for a in op["attributes"]})

    def kernel_tolerance(self, dtype: str) -> float:
        return float(self.tolerances["kernel_vs_fp64"][dtype])

    def check_tolerance(self, dtype: str) -> dict[str, float]:
        """``{"atol", "rtol", "rel"}`` of an export of weight/activation dtype ``dtype`` against float32 PyTorch."""
        return {k: float(v) for k, v in self.tolerances["export_check"][dtype].items()}


def load_spec() -> _Spec:
    text = resources.files(__package__).joinpath("gdn_ops.json").read_text()
    return _Spec(json.loads(text))


SPEC = load_spec()
PREFILL = SPEC.ops["GatedDeltaPrefill"]
DECODE = SPEC.ops["GatedDeltaDecode"]
VERIFY = SPEC.speculative_ops["GatedDeltaVerify"]
COMMIT = SPEC.speculative_ops["GatedDeltaCommit"]


def contract_error(rule: str, **fields: Any) -> ContractError:
    """Build the ValueError the spec prescribes for validation rule ``rule``."""
    return ContractError(rule, SPEC.errors[rule].format(**fields))
