"""The reference against gated-delta-rule implementations we did not write.

a) Hugging Face transformers (``transformers.models.qwen3_next.modeling_qwen3_next``):
   ``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule`` take ``[B, L, H, D]``
   inputs, precomputed log decay ``g`` and ``beta``, an optional ``initial_state [B, Hv, K, V]``
   (our layout), repeat_interleave q/k for GVA (our head mapping), always scale q by 1/sqrt(K)
   (our ``scale=0``) and L2-normalise with eps 1e-6 when ``use_qk_l2norm_in_kernel``. They cast
   every input to float32 internally, so they run in float32 and are compared with our float64
   reference at ``HF_TOL``. We call the undecorated PyTorch functions (``inspect.unwrap``), so an
   installed FLA/hub kernel cannot replace them. A tiny ``Qwen3NextGatedDeltaNet`` layer also checks
   our raw-gate mode (gate_mode 1: ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``)
   against what the layer itself feeds its kernel.

b) onnxruntime's contrib op ``com.microsoft::LinearAttention`` (opset 1; ONNX's own opset-27
   ``LinearAttention`` is newer than onnxruntime 1.31 loads) with ``update_rule="gated_delta"``:
     S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,  o_t = scale q_t^T S_t
   which is our recurrence (decay first, then the delta update with the decayed state). Differences:
   - layout: q/k/v are ``[B, T, H*D]`` (heads flattened into the last axis), decay/beta
     ``[B, T, H_kv]``; no varlen (one ``[B, T]`` batch of equal lengths: ragged batches run per sequence);
     state ``past_state``/``present_state`` ``[B, H_kv, d_k, d_v]`` = our ``[N, Hv, K, V]``.
   - decay is log-space (our ``g``), ``beta`` is already sigmoid-ed (our gate_mode 0); the raw-gate
     form is the separate op ``com.microsoft::LinearAttentionGate`` (decay = decay_scale *
     softplus(a + dt_bias), beta = sigmoid(b), decay_scale = -exp(A_log)), chained below.
   - no L2 norm inside: "key should be L2-normalized" is the caller's job, so it equals our
     ``use_qk_l2norm=0``; for our ``use_qk_l2norm=1`` the test normalises q and k itself (eps 1e-6).
   - ``scale`` multiplies the output (= scaling q); 0 means 1/sqrt(d_k), as ours.
   - heads: key and value share ``kv_num_heads``. Our GVA (Hv value heads, Hk < Hv q/k heads) maps
     to ``kv_num_heads=Hv`` with k repeat_interleaved to Hv heads and either q repeat_interleaved too
     (``q_num_heads=Hv``) or q left at Hk heads (``q_num_heads=Hk``, its "inverse GQA": kv head h
     reads q head h // (Hv/Hk), the same mapping as ours).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import call_decode_ref, call_prefill_ref, make_decode_inputs, make_prefill_inputs, rel_err

HF_TOL = 2e-5    # float32 implementations vs our float64 reference
ORT_TOL = 2e-5


# ----------------------------------------------------------------------------------------------- HF
@pytest.fixture(scope="module")
def hf():
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                              reason="transformers with Qwen3-Next is not installed")
    return mod


def pack(x: torch.Tensor) -> torch.Tensor:       # [B, L, ...] -> [B*L, ...]
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def batch_inputs(gen, B, L, Hk, Hv, K, V, use_qk_l2norm):
    inp = make_prefill_inputs(gen, [L] * B, Hk=Hk, Hv=Hv, K=K, V=V, use_qk_l2norm=use_qk_l2norm)
    unpack = lambda t: t.reshape(B, L, *t.shape[1:])
    return inp, {n: unpack(inp[n]) for n in ("q", "k", "v", "g", "beta")}


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
@pytest.mark.parametrize("use_qk_l2norm", [0, 1])
@pytest.mark.parametrize("ratio,with_state", [(1, True), (2, False), (2, True), (3, True)])
def test_hf_gated_delta_rule(hf, gen, form, use_qk_l2norm, ratio, with_state):
    B, L, Hk, K, V = 2, 70, 2, 16, 8
    Hv = Hk * ratio
    inp, bt = batch_inputs(gen, B, L, Hk, Hv, K, V, use_qk_l2norm)
    if not with_state:
        inp["initial_state"] = torch.zeros_like(inp["initial_state"])
    fn = inspect.unwrap(getattr(hf, f"torch_{form}_gated_delta_rule"))
    o_hf, s_hf = fn(bt["q"], bt["k"], bt["v"], g=bt["g"], beta=bt["beta"],
                    initial_state=inp["initial_state"] if with_state else None, output_final_state=True,
                    use_qk_l2norm_in_kernel=bool(use_qk_l2norm))
    assert s_hf.dtype == torch.float32        # HF computes in float32 whatever the input dtype
    o_ref, s_ref = call_prefill_ref(inp, form="chunked", use_qk_l2norm=use_qk_l2norm)
    assert rel_err(pack(o_hf), o_ref) < HF_TOL
    assert rel_err(s_hf, s_ref) < HF_TOL


def test_hf_chunk_other_chunk_size(hf, gen):
    inp, bt = batch_inputs(gen, 1, 50, 1, 2, 8, 8, 1)
    fn = inspect.unwrap(hf.torch_chunk_gated_delta_rule)
    o_hf, s_hf = fn(bt["q"], bt["k"], bt["v"], g=bt["g"], beta=bt["beta"], chunk_size=16,
                    initial_state=inp["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, s_ref = call_prefill_ref(inp, form="recurrent", use_qk_l2norm=1)
    assert rel_err(pack(o_hf), o_ref) < HF_TOL and rel_err(s_hf, s_ref) < HF_TOL


def test_hf_recurrent_single_token_is_decode(hf, gen):
    d = make_decode_inputs(gen, 3, Hk=2, Hv=4, K=16, V=8, use_qk_l2norm=1)
    fn = inspect.unwrap(hf.torch_recurrent_gated_delta_rule)
    o_hf, s_hf = fn(*(d[n][:, None] for n in ("q", "k", "v", "g", "beta")), initial_state=d["state"],
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, s_ref = call_decode_ref(d, use_qk_l2norm=1)
    assert rel_err(o_hf[:, 0], o_ref) < HF_TOL and rel_err(s_hf, s_ref) < HF_TOL


def test_hf_qwen3next_layer_raw_gates(hf, gen, monkeypatch):
    """Run a tiny Qwen3NextGatedDeltaNet layer; capture the q/k/v and raw a/b it produces and the
    core attention output of its kernel call; our gate_mode=1 reference on (q, k, v, a, b, A_log,
    dt_bias) with use_qk_l2norm=1 must give the same output."""
    from transformers import Qwen3NextConfig
    cfg = Qwen3NextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                          linear_value_head_dim=8, linear_conv_kernel_dim=4, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, num_hidden_layers=1, vocab_size=8)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    layer = hf.Qwen3NextGatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        layer.A_log.uniform_(-1, 1.5)
        layer.dt_bias.uniform_(-1, 1)
    seen = {}
    orig_fix = layer.fix_query_key_value_ordering

    def fix(*a):
        out = orig_fix(*a)
        seen["b"], seen["a"] = out[4], out[5]
        return out

    orig_kernel = inspect.unwrap(hf.torch_chunk_gated_delta_rule)

    def kernel(query, key, value, g, beta, **kw):
        kw.pop("cu_seqlens", None)
        o, s = orig_kernel(query, key, value, g=g, beta=beta, **kw)
        seen.update(q=query, k=key, v=value, o=o, kw=kw)
        return o, s

    monkeypatch.setattr(layer, "fix_query_key_value_ordering", fix)
    monkeypatch.setattr(hf, "torch_chunk_gated_delta_rule", kernel)
    B, L = 2, 67
    with torch.no_grad():
        layer(torch.randn(B, L, 32, generator=gen))
    assert seen["kw"]["use_qk_l2norm_in_kernel"] is True
    d = {n: pack(seen[n]).double() for n in ("q", "k", "v", "a", "b")}
    Hv = cfg.linear_num_value_heads
    o_ref, _ = call_prefill_ref(dict(q=d["q"], k=d["k"], v=d["v"], g=d["a"], beta=d["b"],
                                     cu_seqlens=torch.tensor([0, L, 2 * L], dtype=torch.int32),
                                     initial_state=torch.zeros(B, Hv, 16, 8, dtype=torch.float64),
                                     A_log=layer.A_log.detach().double(), dt_bias=layer.dt_bias.detach().double()),
                                form="chunked", gate_mode=1, use_qk_l2norm=1)
    assert rel_err(pack(seen["o"]), o_ref) < HF_TOL


# ----------------------------------------------------------------------------------------------- ORT
@pytest.fixture(scope="module")
def ort_mod():
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.capi import onnxruntime_pybind11_state as C
    if not any(s.name == "LinearAttention" and s.domain == "com.microsoft" for s in C.get_all_operator_schema()):
        pytest.skip(f"onnxruntime {ort.__version__} has no com.microsoft::LinearAttention")
    return ort


def la_session(ort, Hq, Hkv, dk, dv, *, past_state=True, scale=None, raw_gates=False):
    """One LinearAttention node (optionally fed by LinearAttentionGate) as an ORT CPU session."""
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    vi = lambda n, s: helper.make_tensor_value_info(n, f, s)
    attrs = dict(q_num_heads=Hq, kv_num_heads=Hkv, update_rule="gated_delta")
    if scale is not None:
        attrs["scale"] = float(scale)
    nodes, inputs = [], [vi("query", ["B", "T", Hq * dk]), vi("key", ["B", "T", Hkv * dk]),
                         vi("value", ["B", "T", Hkv * dv])]
    if past_state:
        inputs.append(vi("past_state", ["B", Hkv, dk, dv]))
    if raw_gates:
        inputs += [vi("a", ["B", "T", Hkv]), vi("b", ["B", "T", Hkv]), vi("dt_bias", [Hkv]), vi("decay_scale", [Hkv])]
        nodes.append(helper.make_node("LinearAttentionGate", ["a", "dt_bias", "decay_scale", "b"], ["decay", "beta"],
                                      domain="com.microsoft"))
    else:
        inputs += [vi("decay", ["B", "T", Hkv]), vi("beta", ["B", "T", Hkv])]
    nodes.append(helper.make_node("LinearAttention", ["query", "key", "value", "past_state" if past_state else "",
                                                      "decay", "beta"], ["output", "present_state"],
                                  domain="com.microsoft", **attrs))
    graph = helper.make_graph(nodes, "gdn_la", inputs, [vi("output", None), vi("present_state", None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def l2n(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def to_ort(x: torch.Tensor, B: int) -> np.ndarray:
    """Packed [B*T, H, D] (equal lengths) -> [B, T, H*D] float32; [B*T, H] -> [B, T, H]."""
    x = x.reshape(B, x.shape[0] // B, *x.shape[1:])
    if x.dim() == 4:
        x = x.reshape(*x.shape[:2], -1)
    return x.float().numpy()


@pytest.mark.parametrize("ratio,gva_form", [(1, "q_repeated"), (2, "q_repeated"), (2, "inverse_gqa"),
                                            (4, "q_repeated"), (4, "inverse_gqa")])
@pytest.mark.parametrize("use_qk_l2norm", [0, 1])
def test_ort_linear_attention_prefill(ort_mod, gen, gva_form, ratio, use_qk_l2norm):
    B, L, Hk, K, V = 2, 70, 2, 16, 8
    Hv = Hk * ratio
    inp = make_prefill_inputs(gen, [L] * B, Hk=Hk, Hv=Hv, K=K, V=V, use_qk_l2norm=use_qk_l2norm)
    q, k = (l2n(inp["q"]), l2n(inp["k"])) if use_qk_l2norm else (inp["q"], inp["k"])
    k = k.repeat_interleave(ratio, dim=1)
    Hq = Hk if gva_form == "inverse_gqa" else Hv
    if gva_form == "q_repeated":
        q = q.repeat_interleave(ratio, dim=1)
    sess = la_session(ort_mod, Hq, Hv, K, V)
    o, st = sess.run(None, dict(query=to_ort(q, B), key=to_ort(k, B), value=to_ort(inp["v"], B),
                                past_state=inp["initial_state"].float().numpy(),
                                decay=to_ort(inp["g"], B), beta=to_ort(inp["beta"], B)))
    assert o.shape == (B, L, Hv * V) and st.shape == (B, Hv, K, V)
    o_ref, s_ref = call_prefill_ref(inp, form="chunked", use_qk_l2norm=use_qk_l2norm)
    assert rel_err(torch.from_numpy(o).reshape(B * L, Hv, V), o_ref) < ORT_TOL
    assert rel_err(torch.from_numpy(st), s_ref) < ORT_TOL


def test_ort_keys_not_normalised_inside(ort_mod, gen):
    """Keys of norm 0.5: ORT equals our use_qk_l2norm=0 and differs from use_qk_l2norm=1."""
    B, L, H, K, V = 1, 40, 2, 16, 8
    inp = make_prefill_inputs(gen, [L], Hk=H, Hv=H, K=K, V=V, use_qk_l2norm=0)
    inp["k"] = 0.5 * inp["k"]
    sess = la_session(ort_mod, H, H, K, V, scale=0.25)
    o, _ = sess.run(None, dict(query=to_ort(inp["q"], B), key=to_ort(inp["k"], B), value=to_ort(inp["v"], B),
                               past_state=inp["initial_state"].float().numpy(), decay=to_ort(inp["g"], B),
                               beta=to_ort(inp["beta"], B)))
    o = torch.from_numpy(o).reshape(L, H, V)
    assert rel_err(o, call_prefill_ref(inp, scale=0.25)[0]) < ORT_TOL
    assert rel_err(o, call_prefill_ref(inp, scale=0.25, use_qk_l2norm=1)[0]) > 1e-2


def test_ort_ragged_batch_per_sequence_and_custom_scale(ort_mod, gen):
    """ORT has no varlen input: each sequence of a ragged pack runs alone, no past_state (zeros)."""
    lens, H, K, V, scale = [1, 64, 65, 130], 2, 16, 16, 0.7
    inp = make_prefill_inputs(gen, lens, Hk=H, Hv=H, K=K, V=V, initial_state=False)
    sess = la_session(ort_mod, H, H, K, V, past_state=False, scale=scale)
    o_ref, s_ref = call_prefill_ref(inp, form="chunked", scale=scale)
    cu = inp["cu_seqlens"].tolist()
    for n in range(len(lens)):
        sl = slice(cu[n], cu[n + 1])
        o, st = sess.run(None, dict(query=to_ort(inp["q"][sl], 1), key=to_ort(inp["k"][sl], 1),
                                    value=to_ort(inp["v"][sl], 1), decay=to_ort(inp["g"][sl], 1),
                                    beta=to_ort(inp["beta"][sl], 1)))
        assert rel_err(torch.from_numpy(o).reshape(lens[n], H, V), o_ref[sl]) < ORT_TOL
        assert rel_err(torch.from_numpy(st[0]), s_ref[n]) < ORT_TOL


def test_ort_decode_step(ort_mod, gen):
    """T = 1 (ORT's decode path) against decode_ref, GVA 2 through inverse GQA."""
    Bs, Hk, Hv, K, V = 5, 2, 4, 16, 8
    d = make_decode_inputs(gen, Bs, Hk=Hk, Hv=Hv, K=K, V=V, use_qk_l2norm=1)
    sess = la_session(ort_mod, Hk, Hv, K, V)
    o, st = sess.run(None, dict(query=l2n(d["q"]).reshape(Bs, 1, -1).float().numpy(),
                                key=l2n(d["k"]).repeat_interleave(2, 1).reshape(Bs, 1, -1).float().numpy(),
                                value=d["v"].reshape(Bs, 1, -1).float().numpy(), past_state=d["state"].float().numpy(),
                                decay=d["g"][:, None].float().numpy(), beta=d["beta"][:, None].float().numpy()))
    o_ref, s_ref = call_decode_ref(d, use_qk_l2norm=1)
    assert rel_err(torch.from_numpy(o).reshape(Bs, Hv, V), o_ref) < ORT_TOL
    assert rel_err(torch.from_numpy(st), s_ref) < ORT_TOL


def test_ort_raw_gates_through_linear_attention_gate(ort_mod, gen):
    """LinearAttentionGate -> LinearAttention equals our gate_mode=1 (raw a, b, A_log, dt_bias)."""
    B, L, H, K, V = 2, 33, 3, 16, 8
    inp = make_prefill_inputs(gen, [L] * B, Hk=H, Hv=H, K=K, V=V, gate_mode=1, use_qk_l2norm=0)
    sess = la_session(ort_mod, H, H, K, V, raw_gates=True)
    o, st = sess.run(None, dict(query=to_ort(inp["q"], B), key=to_ort(inp["k"], B), value=to_ort(inp["v"], B),
                                past_state=inp["initial_state"].float().numpy(), a=to_ort(inp["g"], B),
                                b=to_ort(inp["beta"], B), dt_bias=inp["dt_bias"].float().numpy(),
                                decay_scale=(-inp["A_log"].exp()).float().numpy()))
    o_ref, s_ref = call_prefill_ref(inp, gate_mode=1)
    assert rel_err(torch.from_numpy(o).reshape(B * L, H, V), o_ref) < ORT_TOL
    assert rel_err(torch.from_numpy(st), s_ref) < ORT_TOL
