"""cache_attention (gdn_deploy.lm.cache_attention) against a float64 per-token reference, and its two ONNX forms:
onnxruntime's GroupQueryAttention (prefill.onnx / decode.onnx) and the ScatterND + ONNX Attention expansion of the
TensorRT copies (run here by onnxruntime's CPU provider, opset 23)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from gdn_deploy.export.onnx_cache_attention import ATTENTION_OPSET, expand_cache_attention
from gdn_deploy.export.onnx_ops import export_program
from gdn_deploy.export.op_allowlist import graph_op_problems
from gdn_deploy.lm.cache_attention import cache_attention, cache_attention_ref

ort = pytest.importorskip("onnxruntime")
H, HKV, D = 4, 2, 16


def _ref64(q, k, v, kc, vc, _past_t, past, lens):
    """float64 loop: write rows, then each valid query attends to slots 0..past+i."""
    N, L = q.shape[:2]
    q, k, v = (x.double().reshape(N, L, -1, D) for x in (q, k, v))
    kc, vc = kc.double().clone(), vc.double().clone()
    for n in range(N):
        for i in range(L):
            kc[n, :, past[n] + i], vc[n, :, past[n] + i] = k[n, i], v[n, i]
    o = torch.zeros(N, L, H, D, dtype=torch.float64)
    for n in range(N):
        for i in range(lens[n]):
            p = past[n] + i
            for h in range(H):
                s = kc[n, h // (H // HKV), :p + 1] @ q[n, i, h] * D ** -0.5
                o[n, i, h] = torch.softmax(s, 0) @ vc[n, h // (H // HKV), :p + 1]
    return o, kc, vc


CASES = [([0], [1]), ([0, 0, 0], [5, 3, 1]), ([4, 0, 7], [5, 3, 1]), ([6, 2, 9], [1, 1, 1]), ([3], [6]),
         ([0, 0], [64, 63]), ([1, 0], [65, 2])]


def _inputs(gen, past, lens, S, dtype=torch.float32):
    N, L = len(past), max(lens)
    r = lambda *s: torch.randn(*s, generator=gen).to(dtype)                  # noqa: E731
    return (r(N, L, H * D), r(N, L, HKV * D), r(N, L, HKV * D), r(N, HKV, S, D), r(N, HKV, S, D),
            torch.tensor(past, dtype=torch.long))


def _close(a, b, tol):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)) < tol


@pytest.mark.parametrize("past,lens", CASES)
def test_eager_matches_float64(past, lens):
    gen = torch.Generator().manual_seed(len(past) * 10 + max(lens))
    S = max(past) + max(lens) + 3
    ins = _inputs(gen, past, lens, S)
    o, kc, vc = cache_attention(*ins, H, HKV, D ** -0.5)
    ro, rk, rv = _ref64(*ins, past, lens)
    for n, m in enumerate(lens):
        assert _close(o.reshape(len(past), -1, H, D)[n, :m], ro[n, :m], 1e-5)
    assert torch.equal(kc.double(), rk) and torch.equal(vc.double(), rv)


def test_eager_refuses_position_beyond_capacity():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="beyond the KV-cache capacity 6"):
        cache_attention_ref(*_inputs(gen, [4], [3], 6), H, HKV, D ** -0.5)


class _Mod(torch.nn.Module):
    def forward(self, q, k, v, kc, vc, past):
        return cache_attention(q, k, v, kc, vc, past, H, HKV, D ** -0.5)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    from torch.export import Dim
    d = tmp_path_factory.mktemp("cache_attention")
    gen = torch.Generator().manual_seed(1)
    ins = _inputs(gen, [2, 0], [3, 2], 8)
    N, L, S = Dim("N", min=1, max=1024), Dim("L", min=1, max=1 << 16), Dim("S", min=2, max=1 << 16)
    dyn = ({0: N, 1: L}, {0: N, 1: L}, {0: N, 1: L}, {0: N, 2: S}, {0: N, 2: S}, {0: N})
    names = ["q", "k", "v", "k_cache", "v_cache", "past"]
    model = export_program(_Mod(), ins, str(d / "ca.onnx"), dynamic_shapes=dyn, input_names=names,
                           output_names=["o", "k_out", "v_out"])
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") in ops
    trt = onnx.load(str(d / "ca.onnx"))
    assert expand_cache_attention(trt) == 1
    assert graph_op_problems(trt) == []
    assert max(o.version for o in trt.opset_import if o.domain in ("", "ai.onnx")) == ATTENTION_OPSET
    onnx.checker.check_model(trt, full_check=True)
    onnx.save(trt, str(d / "ca.trt.onnx"))
    return {f: ort.InferenceSession(str(d / f"ca.{f}onnx".replace("..", ".")), providers=["CPUExecutionProvider"])
            for f in ("", "trt.")}


@pytest.mark.parametrize("form", ["", "trt."])
@pytest.mark.parametrize("past,lens", CASES)
def test_onnx_forms_match_float64(graphs, form, past, lens):
    if form == "" and len(past) > 1 and max(lens) > 1 and max(past) > 0:
        pytest.skip("onnxruntime's GroupQueryAttention refuses batched continued prompts (runtimes split them)")
    gen = torch.Generator().manual_seed(7 + len(past) + max(lens))
    S = max(past) + max(lens) + 2
    ins = _inputs(gen, past, lens, S)
    feed = {n: x.numpy() for n, x in zip(["q", "k", "v", "k_cache", "v_cache", "past"], ins)}
    o, kc, vc = (torch.from_numpy(np.asarray(x)) for x in graphs[form].run(None, feed))
    ro, rk, rv = _ref64(*ins, past, lens)
    for n, m in enumerate(lens):
        assert _close(o.reshape(len(past), -1, H, D)[n, :m], ro[n, :m], 1e-5)
        assert torch.equal(kc[n, :, :past[n] + m].double(), rk[n, :, :past[n] + m])
        assert torch.equal(vc[n, :, :past[n] + m].double(), rv[n, :, :past[n] + m])


def test_bf16_graph_runs_on_onnxruntime_cpu(tmp_path):
    """A bf16 cache_attention graph (GroupQueryAttention has no bf16 CPU kernel) runs through bf16_cpu's float32
    compute and equals the eager float32 result of the same bf16 inputs."""
    from torch.export import Dim

    from gdn_deploy.export.bf16_cpu import cpu_session
    gen = torch.Generator().manual_seed(3)
    ins = _inputs(gen, [0, 0], [4, 2], 7, torch.bfloat16)
    N, L, S = Dim("N", min=1, max=64), Dim("L", min=1, max=1 << 12), Dim("S", min=2, max=1 << 12)
    dyn = ({0: N, 1: L}, {0: N, 1: L}, {0: N, 1: L}, {0: N, 2: S}, {0: N, 2: S}, {0: N})
    names = ["q", "k", "v", "k_cache", "v_cache", "past"]
    export_program(_Mod(), ins, str(tmp_path / "bf.onnx"), dynamic_shapes=dyn, input_names=names,
                   output_names=["o", "k_out", "v_out"])
    from gdn_deploy.export.runtimes import run_onnxruntime
    got = run_onnxruntime(cpu_session(str(tmp_path / "bf.onnx")), dict(zip(names, ins)))
    assert got["o"].dtype == torch.bfloat16
    o = got["o"].float()
    want = cache_attention_ref(*(x.float() if x.is_floating_point() else x for x in ins), H, HKV, D ** -0.5)[0]
    for n, m in enumerate([4, 2]):
        assert _close(o.reshape(2, 4, H, D)[n, :m], want.reshape(2, 4, H, D)[n, :m], 1e-2)
