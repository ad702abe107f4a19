"""The gdn prefill body on onnxruntime's com.microsoft::LinearAttention (what the CUDA provider loads,
runtime/ort_attention.py) against the float64 reference, on the CPU provider's float32 kernel: ragged batches with
empty, single-token and chunk-edge sequences, GVA, raw and precomputed gates, strong and weak gates, beta in
[0, 2], non-zero initial states."""
from __future__ import annotations

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from conftest import (assert_each_sequence_close, call_prefill_ref, cast_inputs, make_prefill_inputs,  # noqa: E402
                      rel_err, single_node_model)
from gdn_deploy.export.onnx_functions import (BODY_METADATA_KEY, LA_BODY, add_function_bodies,  # noqa: E402
                                              onnxruntime_has_linear_attention)
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import PREFILL, SPEC  # noqa: E402

pytestmark = pytest.mark.skipif(not onnxruntime_has_linear_attention(),
                                reason="this onnxruntime has no com.microsoft::LinearAttention")
FP32_TOL = SPEC.kernel_tolerance("float32")


def _run(inp, attrs):
    model, feeds = single_node_model(PREFILL, attrs, cast_inputs(inp, torch.float32), torch.float32, LA_BODY,
                                     static_shapes=True)
    assert {p.key: p.value for p in model.metadata_props}[BODY_METADATA_KEY] == LA_BODY
    o, s = run_onnxruntime(model, feeds).values()
    return o, s, feeds


@pytest.mark.parametrize("gate_mode, use_qk_l2norm", [(0, 0), (1, 1)], ids=["precomputed", "raw_l2norm"])
@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 4)], ids=["gva1", "gva2", "gva4"])
def test_ragged_batch_edge_lengths(gen, gate_mode, use_qk_l2norm, heads):
    """Lengths 0, 1, 63, 64, 65, 300 in one batch; every sequence's output and final state on its own."""
    lengths = [0, 1, 63, 64, 65, 300]
    inp = make_prefill_inputs(gen, lengths, *heads, K=16, V=32, gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm)
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=0.3 if gate_mode else 0.0)
    o64, s64 = call_prefill_ref(inp, **attrs)
    o, s, feeds = _run(inp, attrs)
    assert o.dtype == torch.float32 and o.shape == o64.shape and s.shape == s64.shape
    assert_each_sequence_close(o, s, o64, s64, inp["cu_seqlens"], FP32_TOL)
    assert torch.equal(s[0], feeds[6][0])              # the empty sequence keeps its state bit for bit


@pytest.mark.parametrize("gates", [(-40.0, -1.0), (-0.01, 0.0)], ids=["strong", "weak"])
def test_strong_and_weak_gates_beta_to_2(gen, gates):
    """g per token in ``gates`` (down to -40: whole chunks decay below float32's range), beta in [0, 2]."""
    inp = make_prefill_inputs(gen, [700, 5, 129], 2, 4, K=32, V=16, g_range=gates, beta_range=(0.0, 2.0))
    attrs = PREFILL.attrs()
    o64, s64 = call_prefill_ref(inp, **attrs)
    o, s, _ = _run(inp, attrs)
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL


def test_no_tokens_keeps_states(gen):
    """T = 0 (two empty sequences): o is empty and the final states are the initial states."""
    inp = make_prefill_inputs(gen, [0, 0], 2, 2, K=16, V=8)
    o, s, feeds = _run(inp, PREFILL.attrs())
    assert o.shape[0] == 0 and torch.equal(s, feeds[6])


def test_needs_static_value_heads(gen):
    """Without a static value-head count (the initial state's dim 1) the body is refused with one line."""
    inp = make_prefill_inputs(gen, [3], 2, 2, K=16, V=8)
    model, _ = single_node_model(PREFILL, PREFILL.attrs(), cast_inputs(inp, torch.float32), torch.float32)
    with pytest.raises(ValueError, match="value heads static"):
        add_function_bodies(model, LA_BODY)


_CUDA = "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available()


@pytest.mark.skipif(not _CUDA, reason="needs onnxruntime-gpu (CUDAExecutionProvider) and a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
@pytest.mark.parametrize("case", ["ragged", "long_strong", "long_weak"])
def test_cuda_provider(gen, dtype, case):
    """onnxruntime's CUDA kernels of the body (float16 at K = V = 128: its chunked tensor-core kernel; float32:
    its recurrent kernel), Qwen3.5 GDN heads (Hk = Hv = 16) and GVA (8 -> 16), raw gates with the L2 norm:
    ragged lengths 0, 1, 63, 64, 65, 1000, 4097; one 16K sequence with strong (g to -40) or weak gates, beta to 2."""
    from gdn_deploy.export.runtimes import session_settings
    if case == "ragged":
        inp = make_prefill_inputs(gen, [1, 63, 0, 64, 65, 1000, 4097], 8, 16, K=128, V=128, gate_mode=1,
                                  use_qk_l2norm=1)
        attrs = PREFILL.attrs(gate_mode=1, use_qk_l2norm=1)
    else:
        g = (-40.0, -1.0) if case == "long_strong" else (-0.01, 0.0)
        inp = make_prefill_inputs(gen, [16384], 16, 16, K=128, V=128, g_range=g, beta_range=(0.0, 2.0),
                                  use_qk_l2norm=1)
        attrs = PREFILL.attrs(use_qk_l2norm=1)
    o64, s64 = call_prefill_ref(inp, **attrs)
    model, feeds = single_node_model(PREFILL, attrs, cast_inputs(inp, dtype), dtype, LA_BODY, static_shapes=True)
    sess = ort.InferenceSession(model.SerializeToString(), **session_settings(["CUDAExecutionProvider"]))
    o, s = run_onnxruntime(sess, feeds).values()
    tol = SPEC.kernel_tolerance("float16" if dtype == torch.float16 else "float32")
    assert o.dtype == dtype and rel_err(o, o64) < tol and rel_err(s, s64) < tol, (rel_err(o, o64), rel_err(s, s64))
    assert_each_sequence_close(o, s, o64, s64, inp["cu_seqlens"], tol)
