"""The chunked prefill function body (standard ONNX ops, run by onnxruntime) against the float64 reference."""
from __future__ import annotations

import itertools

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


from conftest import (assert_each_sequence_close, call_decode_ref, call_prefill_ref, cast_inputs,  # noqa: E402
                      make_decode_inputs, make_prefill_inputs, rel_err, single_node_model)
from gdn_deploy.export.onnx_chunked import packing_model  # noqa: E402
from gdn_deploy.export.onnx_functions import (BODY_METADATA_KEY, add_function_bodies, function_body,  # noqa: E402
                                              make_function)
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import DECODE, PREFILL, SPEC  # noqa: E402

FP32_TOL = SPEC.kernel_tolerance("float32")          # 1e-4, norm-relative vs float64
EDGE_LENGTHS = [0, 1, 63, 64, 65, 1000]


def _run_prefill(inp, attrs, dtype=torch.float32, body="chunked", opset=20):
    model, feeds = single_node_model(PREFILL, attrs, cast_inputs(inp, dtype), dtype, body, opset)
    o, s = run_onnxruntime(model, feeds).values()
    return o, s, feeds


def _packing(seqlens):
    sess = ort.InferenceSession(packing_model().SerializeToString(), providers=["CPUExecutionProvider"])
    cu = torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32).numpy()
    lanes, steps, lane, start, restarts = sess.run(None, {"cu_seqlens": cu})
    return int(lanes), int(steps), lane.tolist(), start.tolist(), bool(restarts)


# ---- numerics -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate_mode, use_qk_l2norm", [(0, 0), (1, 1)], ids=["precomputed", "raw_l2norm"])
@pytest.mark.parametrize("heads", [(2, 2), (2, 4), (1, 4)], ids=["gva1", "gva2", "gva4"])
def test_ragged_batch_edge_lengths(gen, gate_mode, use_qk_l2norm, heads):
    """Lengths 0, 1, 63, 64, 65, 1000 in one batch: empty, single-token, partial/full/partial chunks, long."""
    Hk, Hv = heads
    inp = make_prefill_inputs(gen, EDGE_LENGTHS, Hk, Hv, K=16, V=32, gate_mode=gate_mode,
                              use_qk_l2norm=use_qk_l2norm)
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=0.3 if gate_mode else 0.0)
    o64, s64 = call_prefill_ref(inp, **attrs)
    o, s, feeds = _run_prefill(inp, attrs)
    assert o.dtype == torch.float32 and o.shape == o64.shape and s.shape == s64.shape
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
    assert_each_sequence_close(o, s, o64, s64, inp["cu_seqlens"], FP32_TOL)
    assert torch.equal(s[0], feeds[6][0])              # the empty sequence keeps its state bit for bit


@pytest.mark.parametrize("gates", [(-40.0, -1.0), (-0.01, 0.0)], ids=["strong", "weak"])
def test_16k_tokens_strong_and_weak_gates(gen, gates):
    """fp32 body vs float64 at 16K tokens (plus a short second sequence).

    Strong gates: g down to -40 per token (G = -2560 over a chunk: every exp argument must be <= 0).
    Weak gates: the state remembers thousands of tokens, so rounding errors have time to accumulate.
    The float64 truth is the chunked reference (tests/test_reference.py holds it to the token-by-token
    one; at 16K tokens the latter takes ~10 s); the other tests here use the token-by-token one."""
    inp = make_prefill_inputs(gen, [16384, 100], 1, 2, K=32, V=32, use_qk_l2norm=1, g_range=gates)
    attrs = PREFILL.attrs(use_qk_l2norm=1)
    o64, s64 = call_prefill_ref(inp, **attrs, form="chunked")
    o, s, _ = _run_prefill(inp, attrs)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
    assert rel_err(o[16384:], o64[16384:]) < FP32_TOL and rel_err(s[1], s64[1]) < FP32_TOL


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_aligned_keys_no_combinatorial_growth(gen, beta):
    """All keys equal (L all ones when beta = 1, no decay): the chunk's triangular matrix at its most
    coupled. A nilpotent-product inverse forms powers of L with entries up to C(62, 15) ~ 4e13 here and
    loses everything to cancellation in fp32; the recursive block inverse only forms true inverse blocks."""
    T, H, K, V = 200, 2, 16, 16
    k = torch.randn(1, 1, K, generator=gen, dtype=torch.float64)
    k = (k / k.norm()).expand(T, H, K).contiguous()
    inp = make_prefill_inputs(gen, [T], H, H, K=K, V=V, g_range=(-1e-9, 0.0))
    inp.update(k=k, beta=torch.full((T, H), beta, dtype=torch.float64))
    o64, s64 = call_prefill_ref(inp, **PREFILL.attrs())
    o, s, _ = _run_prefill(inp, PREFILL.attrs())
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_io(gen, dtype):
    inp = cast_inputs(make_prefill_inputs(gen, [5, 0, 130], 1, 2, K=16, V=16, gate_mode=1, use_qk_l2norm=1), dtype)
    attrs = PREFILL.attrs(gate_mode=1, use_qk_l2norm=1)
    o_ref, s_ref = call_prefill_ref(cast_inputs(inp, torch.float64, torch.float64), **attrs)
    model, feeds = single_node_model(PREFILL, attrs, inp, dtype)
    o, s = run_onnxruntime(model, feeds).values()
    assert o.dtype == dtype and s.dtype == torch.float32
    assert rel_err(o, o_ref) < SPEC.kernel_tolerance(str(dtype).replace("torch.", "")) and rel_err(s, s_ref) < FP32_TOL


@pytest.mark.parametrize("opset", [18, 27])
def test_opset_range_and_no_sequences(gen, opset):
    inp = make_prefill_inputs(gen, [70, 3], 2, 2, K=8, V=8)
    o64, s64 = call_prefill_ref(inp, **PREFILL.attrs())
    o, s, _ = _run_prefill(inp, PREFILL.attrs(), opset=opset)
    assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
    o, s, _ = _run_prefill(make_prefill_inputs(gen, [], 2, 2, K=8, V=8), PREFILL.attrs(), opset=opset)
    assert o.shape == (0, 2, 8) and s.shape == (0, 2, 8, 8)


@pytest.mark.parametrize("keys, gate", [("random", 0.3), ("random", 40.0), ("aligned", 1e-9), ("aligned", 0.5)])
def test_triangular_inverse_blocks(gen, keys, gate):
    """The body's (I + L)^-1 alone against float64, for batches of 64 x 64 L_ij = beta_i exp(G_i - G_j) k_i.k_j:
    entries whose total decay exp(G_i - G_j) is below e^EXP_FLOOR are exactly 0, all others match."""
    from onnx import TensorProto, helper
    from gdn_deploy.export.onnx_chunked import CHUNK, EXP_FLOOR, _triangular_inverse
    from gdn_deploy.export.onnx_graph import GraphBuilder
    n, C, K = 12, CHUNK, 16
    k = torch.randn(n, C if keys == "random" else 1, K, generator=gen, dtype=torch.float64).expand(n, C, K)
    k = k / k.norm(dim=-1, keepdim=True)
    G = torch.cumsum(-torch.rand(n, C, generator=gen, dtype=torch.float64) * gate, dim=1)
    beta = 2 * torch.rand(n, C, generator=gen, dtype=torch.float64)
    x = G[:, :, None] - G[:, None, :]
    L = torch.tril(beta[:, :, None] * (k @ k.transpose(1, 2)) * x.clamp(EXP_FLOOR, 0).exp(), -1)
    b = GraphBuilder()
    b("Identity", _triangular_inverse(b, "L_neg", "G", b("Shape", "L_neg", start=0, end=-2)), outputs=["T"])
    f32 = lambda name, *dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))  # noqa: E731
    model = helper.make_model(helper.make_graph(b.nodes, "tri", [f32("L_neg", None, C, C), f32("G", None, C)],
                                                [f32("T", None, C, C)]), opset_imports=[helper.make_opsetid("", 20)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = torch.from_numpy(sess.run(None, {"L_neg": (-L).float().numpy(), "G": G.float().numpy()})[0])
    keep = torch.tril(x >= EXP_FLOOR)
    ref = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + L) * keep
    assert (out[~keep] == 0).all()
    assert rel_err(out, ref) < 1e-6


# ---- lane packing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seqlens, lanes, steps, restarts", [
    ([1000], 1, 16, False),                      # one sequence: one lane, one Scan step per chunk
    ([64] * 8, 8, 1, False),                     # equal lengths: one lane each, no waste
    ([16384, 100], 1, 258, True),                # long + short: one lane (two lanes would double the work)
    ([300, 1, 1, 1, 70, 70, 70], 3, 5, True),    # short sequences share lanes of the longest's length
    ([0, 0], 1, 1, False),                       # nothing to do: still one step (onnxruntime's Scan needs one)
    ([], 1, 1, False),
])
def test_packing(seqlens, lanes, steps, restarts):
    got_lanes, got_steps, lane, start, got_restarts = _packing(seqlens)
    assert (got_lanes, got_steps, got_restarts) == (lanes, steps, restarts)
    chunks = [(n + 63) // 64 for n in seqlens]
    cells = set()
    for n, c in enumerate(chunks):                # every chunk gets its own (step, lane) cell inside the grid
        assert 0 <= lane[n] < lanes and 0 <= start[n] and start[n] + c <= steps
        cells |= {(start[n] + i, lane[n]) for i in range(c)}
    assert len(cells) == sum(chunks)
    assert got_lanes * got_steps <= 2 * sum(chunks) + got_steps   # waste bounded: under half the slots idle


def test_packed_lanes_match_reference(gen):
    """Several sequences per lane (states restarted and saved inside the Scan) with GVA and raw gates."""
    seqlens = [300, 1, 1, 1, 70, 70, 70, 0, 5, 128]
    assert _packing(seqlens)[4]
    inp = make_prefill_inputs(gen, seqlens, 2, 4, K=16, V=8, gate_mode=1, use_qk_l2norm=1)
    attrs = PREFILL.attrs(gate_mode=1, use_qk_l2norm=1)
    o64, s64 = call_prefill_ref(inp, **attrs)
    o, s, feeds = _run_prefill(inp, attrs)
    assert rel_err(o, o64) < FP32_TOL
    for n in range(len(seqlens)):
        assert rel_err(s[n], s64[n]) < FP32_TOL, n
    assert torch.equal(s[7], feeds[6][7])


# ---- body choice, decode ------------------------------------------------------------------------------
def _op_types(nodes) -> set[str]:
    out = set()
    for n in nodes:
        out.add(n.op_type)
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                out |= _op_types(g.node)
    return out


def test_body_choice_is_recorded_and_token_body_agrees(gen):
    inp = make_prefill_inputs(gen, [0, 40, 70], 1, 2, K=8, V=8, use_qk_l2norm=1)
    attrs = PREFILL.attrs(use_qk_l2norm=1)
    o64, s64 = call_prefill_ref(inp, **attrs)
    for body in ("chunked", "token"):
        model, feeds = single_node_model(PREFILL, attrs, cast_inputs(inp, torch.float32), torch.float32, body)
        assert function_body(model) == body
        assert [p.value for p in model.metadata_props if p.key == BODY_METADATA_KEY] == [body]
        assert body in model.functions[0].doc_string
        o, s = run_onnxruntime(model, feeds).values()
        assert rel_err(o, o64) < FP32_TOL and rel_err(s, s64) < FP32_TOL
    with pytest.raises(ValueError, match="body: expected one of chunked, token"):
        add_function_bodies(model, "scan")


def _loop_depth(nodes) -> int:
    """Deepest nesting of Loop/Scan nodes (If does not count)."""
    depth = 0
    for n in nodes:
        inner = max([_loop_depth(a.g.node) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH] or [0])
        depth = max(depth, inner + (n.op_type in ("Loop", "Scan")))
    return depth


def test_chunked_body_has_no_token_loop():
    """The chunked body's loops (a Scan over chunk steps, a Loop packing sequences into lanes) are never
    nested; the token body nests its Scan over tokens in a Loop over sequences."""
    chunked = make_function(PREFILL, PREFILL.attrs(), 20, "chunked")
    assert {"Scan", "Loop"} <= _op_types(chunked.node) and _loop_depth(chunked.node) == 1
    assert _loop_depth(make_function(PREFILL, PREFILL.attrs(), 20, "token").node) == 2


# ops of onnx-tensorrt's supported list (docs/operators.md) that the bodies may use: a TensorRT user
# without the plugin library gets the body
TENSORRT_PARSER_OPS = {
    "Add", "And", "ArgMin", "Cast", "CastLike", "Clip", "Concat", "Constant", "ConstantOfShape", "CumSum", "Div",
    "Equal", "Exp", "Expand", "Gather", "GatherND", "Greater", "GreaterOrEqual", "Identity", "If", "Less", "Loop",
    "MatMul", "Max", "Min", "Mod", "Mul", "Neg", "NonZero", "Not", "Range", "Reciprocal", "ReduceMax", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Scan", "ScatterElements", "ScatterND", "Shape", "Sigmoid", "Size", "Slice",
    "Softplus", "Split", "Sign", "Sqrt", "Squeeze", "Sub", "Transpose", "Unsqueeze", "Where"}


@pytest.mark.parametrize("gate_mode", [0, 1])
@pytest.mark.parametrize("use_qk_l2norm", [0, 1])
def test_bodies_use_ops_the_tensorrt_parser_imports(gate_mode, use_qk_l2norm):
    fn = make_function(PREFILL, PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm), 20, "chunked")
    assert _op_types(fn.node) <= TENSORRT_PARSER_OPS, _op_types(fn.node) - TENSORRT_PARSER_OPS
    for state_mode in (0, 1):
        attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, state_mode=state_mode)
        assert _op_types(make_function(DECODE, attrs, 20).node) <= TENSORRT_PARSER_OPS


@pytest.mark.parametrize("state_mode", [0, 1])
def test_decode_body_is_one_step(gen, state_mode):
    attrs = DECODE.attrs(gate_mode=1, use_qk_l2norm=1, state_mode=state_mode)
    assert not _op_types(make_function(DECODE, attrs, 20).node) & {"Loop", "Scan", "If"}
    inp = make_decode_inputs(gen, 4, 1, 2, K=16, V=8, gate_mode=1, use_qk_l2norm=1,
                             pool_size=6 if state_mode else None)
    io = cast_inputs(inp, torch.float32)
    o_ref, s_ref = call_decode_ref(inp, **attrs)
    model, feeds = single_node_model(DECODE, attrs, io, torch.float32)
    o, s = run_onnxruntime(model, feeds).values()
    assert rel_err(o, o_ref) < FP32_TOL and rel_err(s, s_ref) < FP32_TOL


def test_cuda_sessions_get_the_settings_our_files_need():
    """onnxruntime sessions made by the package: with the CUDA provider, TF32 off and ConstantFolding off (the
    chunked body fails under that provider's folding: runtimes.CUDA_DISABLED_OPTIMIZERS); CPU sessions unchanged."""
    from gdn_deploy.export.runtimes import session_settings
    assert session_settings(["CPUExecutionProvider"]) == {"providers": ["CPUExecutionProvider"]}
    kw = session_settings(["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert kw["providers"] == [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert kw["disabled_optimizers"] == ["ConstantFolding"]
    # a caller's CUDA options go over ours (here the arena strategy); ours stay where the caller says nothing
    kw = session_settings([("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"}),
                           "CPUExecutionProvider"])
    assert kw["providers"] == [("CUDAExecutionProvider", {"use_tf32": "0", "arena_extend_strategy":
                                                          "kSameAsRequested"}), "CPUExecutionProvider"]
    assert session_settings([("CUDAExecutionProvider", {"use_tf32": "1"})])["providers"] == \
        [("CUDAExecutionProvider", {"use_tf32": "1"})]
    # what the CPU build of onnxruntime does with those arguments: it runs, on the CPU (no silent failure)
    model, feeds = single_node_model(PREFILL, dict(gate_mode=0, use_qk_l2norm=0),
                                     cast_inputs(make_prefill_inputs(torch.Generator().manual_seed(0), [70, 0, 5]),
                                                 torch.float32), torch.float32)
    sess = ort.InferenceSession(model.SerializeToString(), **session_settings(["CPUExecutionProvider"]),
                                disabled_optimizers=["ConstantFolding"])
    o, s = run_onnxruntime(sess, feeds).values()
    ref_o, ref_s = call_prefill_ref(make_prefill_inputs(torch.Generator().manual_seed(0), [70, 0, 5]),
                                    gate_mode=0, use_qk_l2norm=0)
    assert rel_err(o, ref_o) <= FP32_TOL and rel_err(s, ref_s) <= FP32_TOL
