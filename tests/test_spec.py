"""The op contract (gdn_deploy/spec): self-consistency, the generated C++ header is in sync, and the
torch.library op signatures follow the spec (input order, attribute names and defaults)."""
from __future__ import annotations

import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gdn_deploy.ops  # noqa: F401  (registers torch.ops.gdn.*)
from gdn_deploy import reference
from gdn_deploy.spec import DECODE, PREFILL, SPEC, ContractError, contract_error
from gdn_deploy.spec.__main__ import HEADER_PATH, emit_cpp

REPO = Path(__file__).resolve().parents[1]


def test_checked_in_header_is_generated():
    path = REPO / HEADER_PATH
    assert path.read_text() == emit_cpp(), (
        f"{HEADER_PATH} is stale: run `python -m gdn_deploy.spec --emit-cpp {HEADER_PATH}`")


def test_emit_cpp_cli_writes_the_same(tmp_path):
    out = tmp_path / "h.h"
    subprocess.run([sys.executable, "-m", "gdn_deploy.spec", "--emit-cpp", str(out)], check=True, cwd=REPO)
    assert out.read_text() == emit_cpp()


def test_header_names_every_op_input_and_attribute():
    text = emit_cpp()
    for name in SPEC.attributes:
        assert f'"{name}"' in text
    for op in SPEC.ops.values():
        assert f'"{op.name}"' in text
        for i, t in enumerate(op.inputs):
            assert f'k{op.name}Input{i} = "{t.name}"' in text


def test_ops_attributes_and_conditions_exist():
    for op in SPEC.ops.values():
        assert op.attributes, op.name
        for a in op.attributes:
            assert a in SPEC.attributes, f"{op.name}: attribute {a} not defined"
            assert op.defaults[a] == SPEC.attributes[a]["default"]
        names = [t.name for t in op.inputs]
        assert len(names) == len(set(names)), f"{op.name}: duplicate input names"
        seen_optional = False
        for t in op.inputs:
            if t.present_if:
                attr, _, value = t.present_if.partition("==")
                assert attr.strip() in op.attributes, f"{op.name}.{t.name}: condition on unknown {attr}"
                assert value.strip() in SPEC.attributes[attr.strip()]["values"]
                seen_optional = True
            else:
                assert not seen_optional, f"{op.name}: fixed input {t.name} after a conditional one"
            assert t.dtype in SPEC.raw["type_constraints"] or t.dtype in ("float32", "int32"), t.dtype


def test_attribute_defaults_are_allowed_values():
    for name, a in SPEC.attributes.items():
        assert a["type"] in ("int", "float")
        if "values" in a:
            assert str(a["default"]) in a["values"], name
        assert isinstance(a["default"], int if a["type"] == "int" else float), name


def test_tolerances_and_dtypes():
    assert set(SPEC.io_dtypes) == set(SPEC.raw["type_constraints"]["T"])
    assert set(SPEC.gate_dtypes) == set(SPEC.raw["type_constraints"]["G"])
    for dt in SPEC.io_dtypes:
        assert 0 < SPEC.kernel_tolerance(dt) < 0.1
        t = SPEC.check_tolerance(dt)
        assert set(t) == {"atol", "rtol", "rel"} and all(v > 0 for v in t.values())
    assert SPEC.kernel_tolerance("float32") < SPEC.kernel_tolerance("float16")
    # 16-bit export checks follow from the unit roundoff: atol = rtol = 64u, rel = 16u
    for dt, u in (("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)):
        t = SPEC.check_tolerance(dt)
        assert (t["atol"], t["rtol"], t["rel"]) == (64 * u, 64 * u, 16 * u)


def test_chunk_size_is_the_reference_default():
    import inspect
    assert inspect.signature(reference.chunked_scan).parameters["chunk"].default == SPEC.chunk_size


def test_validation_ids_unique_and_templates_well_formed():
    ids = [v["id"] for v in SPEC.raw["validation"]]
    assert len(ids) == len(set(ids))
    for rule, template in SPEC.errors.items():
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
        err = contract_error(rule, **{f: f"<{f}>" for f in fields})
        assert isinstance(err, ContractError) and isinstance(err, ValueError)
        assert err.rule == rule and str(err).startswith(f"[gdn:{rule}] ")


def _schema(op):
    return {a.name: a for a in op._schema.arguments}, [a.name for a in op._schema.arguments]


@pytest.mark.parametrize("torch_op,spec_op,rename,fixed", [
    ("prefill", PREFILL, {}, {}),
    ("decode", DECODE, {}, {"state_mode": 0}),
    ("decode_pool_", DECODE, {"state": "pool"}, {"state_mode": 1}),
])
def test_torch_op_signature_follows_spec(torch_op, spec_op, rename, fixed):
    """Inputs in spec order; an input conditional on a fixed attribute (state_mode picks decode vs
    decode_pool_) is required or absent; other conditional inputs are Optional[Tensor] = None;
    then the remaining attributes in spec order with the spec defaults."""
    op = getattr(torch.ops.gdn, torch_op).default
    args, order = _schema(op)
    attr_of = lambda t: t.present_if.partition("==")[0].strip() if t.present_if else None
    inputs = [t for t in spec_op.inputs if attr_of(t) not in fixed or t.present({**spec_op.defaults, **fixed})]
    want_inputs = [rename.get(t.name, t.name) for t in inputs]
    assert order[:len(want_inputs)] == want_inputs, order
    for t in inputs:
        a = args[rename.get(t.name, t.name)]
        if t.present_if and attr_of(t) not in fixed:
            assert str(a.type) == "Optional[Tensor]" and a.default_value is None, (t.name, str(a.type))
        else:
            assert str(a.type) == "Tensor" and not a.has_default_value(), (t.name, str(a.type))
    attrs = order[len(want_inputs):]
    want_attrs = [a for a in spec_op.attributes if a not in fixed]
    assert attrs == want_attrs
    for a in want_attrs:
        assert args[a].default_value == SPEC.attributes[a]["default"], (a, args[a].default_value)
        assert str(args[a].type) == SPEC.attributes[a]["type"]


def test_torch_op_names_match_spec():
    assert PREFILL.torch_op == "gdn::prefill"
    assert DECODE.torch_op == "gdn::decode"
    assert SPEC.raw["ops"]["GatedDeltaDecode"]["torch_op_pool"] == "gdn::decode_pool_"
    for qual in (PREFILL.torch_op, DECODE.torch_op, SPEC.raw["ops"]["GatedDeltaDecode"]["torch_op_pool"]):
        ns, name = qual.split("::")
        assert hasattr(getattr(torch.ops, ns), name)
    pool_schema = torch.ops.gdn.decode_pool_.default._schema
    assert [a.name for a in pool_schema.arguments if a.alias_info is not None and a.alias_info.is_write] == ["pool"]
