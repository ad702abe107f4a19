"""The contract's beta range [0, 2] (gate_mode 0) in the ONNX function bodies: onnxruntime == float64 reference."""
from __future__ import annotations

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from conftest import (call_decode_ref, call_prefill_ref, cast_inputs, make_decode_inputs,  # noqa: E402
                      make_prefill_inputs, rel_err)
from gdn_deploy.export.onnx_ops import add_function_bodies  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import DECODE, PREFILL, SPEC  # noqa: E402

_ELEM = {torch.float32: TensorProto.FLOAT, torch.int32: TensorProto.INT32}
FP32_TOL = 1e-5


def _one_node(op, attrs, inp):
    names = op.input_names(attrs)
    feeds = [inp[n] for n in names]
    ins = [helper.make_tensor_value_info(n, _ELEM[t.dtype], [None] * t.dim()) for n, t in zip(names, feeds)]
    outs = [helper.make_tensor_value_info(op.outputs[0].name, TensorProto.FLOAT, [None] * 3),
            helper.make_tensor_value_info(op.outputs[1].name, TensorProto.FLOAT, [None] * 4)]
    node = helper.make_node(op.name, names, [o.name for o in outs], domain=SPEC.domain, **attrs)
    model = helper.make_model(helper.make_graph([node], "beta_range", ins, outs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(SPEC.domain, 1)])
    add_function_bodies(model)
    return model, feeds


@pytest.mark.parametrize("g_range", [(-3.0, -0.5), (-0.01, 0.0)], ids=["strong", "weak"])
def test_prefill_body_beta_up_to_two(gen, g_range):
    inp = make_prefill_inputs(gen, [1, 63, 64, 65, 130], 2, 4, K=16, V=8, use_qk_l2norm=1, g_range=g_range,
                              beta_range=(0.0, 2.0))
    assert float(inp["beta"].max()) > 1.9
    attrs = PREFILL.attrs(gate_mode=0, use_qk_l2norm=1)
    o64, s64 = call_prefill_ref(inp, **attrs)
    o, s = run_onnxruntime(*_one_node(PREFILL, attrs, cast_inputs(inp, torch.float32))).values()
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL


def test_decode_body_beta_up_to_two(gen):
    inp = make_decode_inputs(gen, 6, 2, 4, K=16, V=8, use_qk_l2norm=1, beta_range=(1.0, 2.0))
    attrs = DECODE.attrs(gate_mode=0, use_qk_l2norm=1, state_mode=0)
    o64, s64 = call_decode_ref(inp, **attrs)
    o, s = run_onnxruntime(*_one_node(DECODE, attrs, cast_inputs(inp, torch.float32))).values()
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
