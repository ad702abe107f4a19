"""Interop export: gdn ops as LinearAttention (com.microsoft contrib / ONNX opset 27) run by onnxruntime."""
from __future__ import annotations

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from conftest import (DECODE_ORDER, PREFILL_ORDER, DecodeOp, PrefillOp, call_decode_ref, call_prefill_ref,  # noqa: E402
                      cast_inputs, make_decode_inputs, make_prefill_inputs, ordered_args,
                      ordered_dynamic_shapes, rel_err)
from gdn_deploy.export.onnx_ops import export_program, gdn_nodes  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

FP32_TOL = 1e-5
RAW = dict(gate_mode=1, use_qk_l2norm=1)


class _DecodePool(torch.nn.Module):
    def forward(self, q, k, v, g, beta, pool, slots, A_log, dt_bias):
        o = torch.ops.gdn.decode_pool_(q, k, v, g, beta, pool, slots, A_log, dt_bias, **RAW)
        return o, pool


_PREFILL_DIMS = dict(q="T", k="T", v="T", g="T", beta="T", cu_seqlens="N1", initial_state="N")


def _linear_attention_nodes(model, domain):
    return [n for n in model.graph.node if n.op_type == "LinearAttention" and n.domain == domain]


@pytest.fixture(scope="module")
def msft_prefill(tmp_path_factory):
    gen = torch.Generator().manual_seed(2)
    inp = cast_inputs(make_prefill_inputs(gen, [4, 4], 1, 2, K=16, V=8, **RAW), torch.float32)
    path = tmp_path_factory.mktemp("interop") / "prefill_msft.onnx"
    model = export_program(PrefillOp(**RAW), ordered_args(inp, PREFILL_ORDER), path, interop="com.microsoft",
                           dynamic_shapes=ordered_dynamic_shapes(inp, PREFILL_ORDER, _PREFILL_DIMS))
    return path, model


def test_interop_emits_contrib_linear_attention(msft_prefill):
    _, model = msft_prefill
    (node,) = _linear_attention_nodes(model, "com.microsoft")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["update_rule"] == b"gated_delta" and attrs["q_num_heads"] == attrs["kv_num_heads"] == 2
    assert not gdn_nodes(model) and not model.functions


@pytest.mark.parametrize("seqlens", [[5, 5, 5], [9], [16, 16]])
def test_interop_prefill_matches_reference(msft_prefill, gen, seqlens):
    path, _ = msft_prefill
    inp = cast_inputs(make_prefill_inputs(gen, seqlens, 1, 2, K=16, V=8, **RAW), torch.float32)
    o, s = run_onnxruntime(path, ordered_args(inp, PREFILL_ORDER)).values()
    o64, s64 = call_prefill_ref(inp, **RAW, compute_dtype=torch.float64)
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL


def test_interop_varlen_is_rejected_at_export(gen):
    inp = cast_inputs(make_prefill_inputs(gen, [3, 5], 1, 2, K=16, V=8, **RAW), torch.float32)
    with pytest.raises(ValueError, match="no varlen.*\\[3, 5\\]"):
        export_program(PrefillOp(**RAW), ordered_args(inp, PREFILL_ORDER), None, interop="com.microsoft")
    with pytest.raises(ValueError, match="interop"):
        export_program(PrefillOp(**RAW), ordered_args(inp, PREFILL_ORDER), None, interop="trt")


def test_interop_unequal_lengths_at_run_time_give_nan(msft_prefill, gen):
    path, _ = msft_prefill
    inp = cast_inputs(make_prefill_inputs(gen, [2, 6], 1, 2, K=16, V=8, **RAW), torch.float32)
    o, _ = run_onnxruntime(path, ordered_args(inp, PREFILL_ORDER)).values()
    assert torch.isnan(o).all()


def test_interop_decode_dense_and_pool(tmp_path, gen):
    dense = cast_inputs(make_decode_inputs(gen, 3, 2, 4, K=8, V=16), torch.float32)
    dims = dict(q="B", k="B", v="B", g="B", beta="B", state="B", slots="B")
    p_dense = tmp_path / "decode.onnx"
    export_program(DecodeOp(), ordered_args(dense, DECODE_ORDER), p_dense, interop="com.microsoft",
                   dynamic_shapes=ordered_dynamic_shapes(dense, DECODE_ORDER, dims))
    dense = cast_inputs(make_decode_inputs(gen, 5, 2, 4, K=8, V=16), torch.float32)
    o, s = run_onnxruntime(p_dense, ordered_args(dense, DECODE_ORDER)).values()
    o64, s64 = call_decode_ref(dense, compute_dtype=torch.float64)
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL

    pool = cast_inputs(make_decode_inputs(gen, 3, 1, 2, K=8, V=8, pool_size=5, **RAW), torch.float32)
    p_pool = tmp_path / "decode_pool.onnx"
    export_program(_DecodePool(), ordered_args(pool, DECODE_ORDER), p_pool, interop="com.microsoft",
                   dynamic_shapes=ordered_dynamic_shapes(pool, DECODE_ORDER, dict(dims, state="P")))
    pool = cast_inputs(make_decode_inputs(gen, 4, 1, 2, K=8, V=8, pool_size=6, **RAW), torch.float32)
    pool["slots"][1] = -1
    o, new_pool = run_onnxruntime(p_pool, ordered_args(pool, DECODE_ORDER)).values()
    o64, pool64 = call_decode_ref(pool, **RAW, state_mode=1, compute_dtype=torch.float64)
    assert rel_err(o, o64) < FP32_TOL and rel_err(new_pool, pool64) < FP32_TOL
    assert torch.count_nonzero(o[1]) == 0
    untouched = sorted(set(range(6)) - set(pool["slots"].tolist()))
    assert torch.equal(new_pool[untouched], pool["state"][untouched])


def test_interop_fp16_io(tmp_path, gen):
    inp = cast_inputs(make_prefill_inputs(gen, [3, 3], 2, 2, K=16, V=8), torch.float16)
    path = tmp_path / "prefill_fp16.onnx"
    model = export_program(PrefillOp(), ordered_args(inp, PREFILL_ORDER), path, interop="com.microsoft",
                           dynamic_shapes=ordered_dynamic_shapes(inp, PREFILL_ORDER, _PREFILL_DIMS))
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    inp = cast_inputs(make_prefill_inputs(gen, [7, 7], 2, 2, K=16, V=8), torch.float16)
    o, s = run_onnxruntime(path, ordered_args(inp, PREFILL_ORDER)).values()
    o64, s64 = call_prefill_ref(cast_inputs(inp, torch.float64, torch.float64))
    assert o.dtype == torch.float16 and rel_err(o, o64) < SPEC.kernel_tolerance("float16")
    assert rel_err(s, s64) < 1e-4


def test_onnx_standard_linear_attention_opset27(tmp_path, gen, monkeypatch):
    inp = cast_inputs(make_prefill_inputs(gen, [4, 4], 1, 2, K=8, V=8, **RAW), torch.float32)
    with pytest.raises(ValueError, match="opset >= 27"):
        export_program(PrefillOp(**RAW), ordered_args(inp, PREFILL_ORDER), None, interop="onnx", opset=20)
    path = tmp_path / "prefill_onnx27.onnx"
    model = export_program(PrefillOp(**RAW), ordered_args(inp, PREFILL_ORDER), path, interop="onnx", opset=27,
                           dynamic_shapes=ordered_dynamic_shapes(inp, PREFILL_ORDER, _PREFILL_DIMS))  # checker inside
    assert len(_linear_attention_nodes(model, "")) == 1 and not _linear_attention_nodes(model, "com.microsoft")
    assert {i.domain: i.version for i in model.opset_import}[""] == 27
    # onnxruntime 1.31 calls opset 27 "under development" and refuses it unless this is set:
    monkeypatch.setenv("ALLOW_RELEASED_ONNX_OPSET_ONLY", "0")
    inp = cast_inputs(make_prefill_inputs(gen, [6, 6, 6], 1, 2, K=8, V=8, **RAW), torch.float32)
    o, s = run_onnxruntime(path, ordered_args(inp, PREFILL_ORDER)).values()
    o64, s64 = call_prefill_ref(inp, **RAW, compute_dtype=torch.float64)
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL


def test_ragged_batches_are_refused_with_one_line():
    from gdn_deploy.errors import UsageError
    from gdn_deploy.export.interop import require_equal_lengths
    require_equal_lengths(torch.tensor([0, 4, 8, 12], dtype=torch.int32))           # equal: fine
    require_equal_lengths([0, 5])                                                    # one sequence: fine
    with pytest.raises(UsageError, match=r"needs sequences of equal length; got lengths 3, 5\. Pad") as e:
        require_equal_lengths(torch.tensor([0, 3, 8], dtype=torch.int32))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_interop_export_records_its_limit(tmp_path):
    from gdn_deploy.export.cli import main as export_main
    from gdn_deploy.export.metadata import read_metadata
    assert export_main(["default", "-o", str(tmp_path / "o"), "--interop", "com.microsoft", "--graphs", "prefill",
                        "-q"]) == 0
    assert read_metadata(tmp_path / "o")["limits"]["equal_length_prefill"] is True
