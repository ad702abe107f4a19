"""Shared test helpers for gdn-deploy (generic: any test module may use them).

Random inputs come from a fresh seed per test: the session base seed is random unless
``GDN_TEST_SEED`` is set, it is printed in the pytest header, and each test derives its own
seed from it and its node id, so a failure is reproduced with ``GDN_TEST_SEED=<base> pytest <id>``.

Helpers:
- ``rel_err(a, b)``: ||a - b|| / ||b|| in float64 (0 when both are zero).
- ``make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, ...)`` / ``make_decode_inputs(gen, B, ...)``:
  argument dicts for :func:`gdn_deploy.reference.prefill_ref` / ``decode_ref`` (positional tensors
  under their spec names, attributes separate), in any dtype.
- fixtures ``seed`` (int) and ``gen`` (a ``torch.Generator`` seeded with it).
- ``single_node_model(op, attrs, inp, dtype, body, opset)``: an ONNX model of one gdn node with its function bodies.
"""
from __future__ import annotations

import os
import random
import sys
import zlib
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

_BASE_SEED = int(os.environ.get("GDN_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"gdn-deploy: GDN_TEST_SEED={_BASE_SEED} (set it to reproduce the random inputs)"


def seed_for(nodeid: str) -> int:
    """The seed of one test: the session base seed mixed with the test's node id."""
    return (_BASE_SEED * 1_000_003 + zlib.crc32(nodeid.encode())) % (2**31)


@pytest.fixture
def seed(request) -> int:
    s = seed_for(request.node.nodeid)
    request.node.user_properties.append(("seed", s))
    return s


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| computed in float64; 0 when both are exactly zero, inf when only b is."""
    a, b = torch.as_tensor(a).detach().double().cpu(), torch.as_tensor(b).detach().double().cpu()
    assert a.shape == b.shape, f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}"
    num, den = float((a - b).norm()), float(b.norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def assert_each_sequence_close(o, s, o_ref, s_ref, cu_seqlens, tol: float) -> None:
    """Every sequence's final state and (non-empty) output rows within ``tol`` of the reference on their own, not
    only the batch's norm."""
    cu = [int(x) for x in cu_seqlens]
    for n in range(len(cu) - 1):
        assert rel_err(s[n], s_ref[n]) < tol, (n, rel_err(s[n], s_ref[n]))
        if cu[n + 1] > cu[n]:
            assert rel_err(o[cu[n]:cu[n + 1]], o_ref[cu[n]:cu[n + 1]]) < tol, (n, rel_err(o[cu[n]:cu[n + 1]],
                                                                                          o_ref[cu[n]:cu[n + 1]]))


def prefill_then_continue(folder, backend, holder, first, more, capacity: int):
    """Prefill ``first`` (token lists) into ``holder``'s states, then continue with ``more``: (the second call's
    logits, a copy of every state after it)."""
    from gdn_deploy.runtime.conversation import prefill
    _, st = prefill(folder, backend, first, capacity=capacity, holder=holder)
    logits, st = prefill(folder, backend, more, {k: v.clone() for k, v in st.items()}, [len(t) for t in first],
                         holder=holder)
    return logits, {k: v.clone() for k, v in st.items()}


def assert_folder_states_close(folder, got: dict, ref: dict, lengths, tol: float) -> None:
    """Every state of an exported folder's prefill outputs within ``tol`` (attention caches on each sequence's
    written slots ``lengths``, GDN states whole)."""
    for s in folder.states:
        a, b = got[s.prefill_input], ref[s.prefill_input]
        if s.kind == "attention":
            for i, n in enumerate(lengths):
                assert rel_err(a[i, :, :n], b[i, :, :n]) <= tol, s.prefill_input
        else:
            assert rel_err(a, b) <= tol, s.prefill_input


def _randn(gen, shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _rand(gen, shape, lo, hi, dtype=torch.float64):
    return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)).to(dtype)


def make_gates(gen, rows: int, Hv: int, *, gate_mode: int = 0, g_range=(-1.0, -0.01),
               beta_range=(0.0, 1.0), dtype=torch.float64) -> dict[str, Any]:
    """g/beta (and A_log/dt_bias in raw mode) for ``rows`` tokens. Precomputed: g uniform in
    ``g_range`` (log decay <= 0), beta uniform in ``beta_range``. Raw: a, b ~ N(0, 1) and
    A_log ~ U(-1, 1), dt_bias ~ U(-1, 1) (float32 or float64 as ``dtype``)."""
    if gate_mode == 0:
        return dict(g=_rand(gen, (rows, Hv), *g_range, dtype), beta=_rand(gen, (rows, Hv), *beta_range, dtype))
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return dict(g=_randn(gen, (rows, Hv), dtype), beta=_randn(gen, (rows, Hv), dtype),
                A_log=_rand(gen, (Hv,), -1.0, 1.0, wide), dt_bias=_rand(gen, (Hv,), -1.0, 1.0, wide))


def _qk(gen, rows, Hk, K, dtype, use_qk_l2norm):
    # Without the in-op L2 norm the delta rule is only stable for beta*|k|^2 <= 2: give unit-scale keys.
    q = _randn(gen, (rows, Hk, K))
    k = _randn(gen, (rows, Hk, K))
    if not use_qk_l2norm:
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-3)
    return q.to(dtype), k.to(dtype)


def make_prefill_inputs(gen, seqlens: Sequence[int], Hk: int = 2, Hv: int = 4, K: int = 16, V: int = 8, *,
                        dtype=torch.float64, gate_mode: int = 0, use_qk_l2norm: int = 0,
                        initial_state: bool = True, **gate_kw) -> dict[str, Any]:
    """Tensors for prefill_ref / gdn::prefill, by spec name; sequences have lengths ``seqlens``."""
    T, N = int(sum(seqlens)), len(seqlens)
    q, k = _qk(gen, T, Hk, K, dtype, use_qk_l2norm)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    cu = torch.tensor([0] + list(torch.tensor(list(seqlens), dtype=torch.int64).cumsum(0).tolist()), dtype=torch.int32)
    h0 = 0.5 * _randn(gen, (N, Hv, K, V), sd) if initial_state else torch.zeros(N, Hv, K, V, dtype=sd)
    d = dict(q=q, k=k, v=_randn(gen, (T, Hv, V), dtype), cu_seqlens=cu, initial_state=h0)
    d.update(make_gates(gen, T, Hv, gate_mode=gate_mode, dtype=dtype, **gate_kw))
    return d


def make_decode_inputs(gen, B: int, Hk: int = 2, Hv: int = 4, K: int = 16, V: int = 8, *, dtype=torch.float64,
                       gate_mode: int = 0, use_qk_l2norm: int = 0, pool_size: int | None = None,
                       **gate_kw) -> dict[str, Any]:
    """Tensors for decode_ref / gdn::decode(_pool_). With ``pool_size`` P, ``state`` is a [P,...] pool
    and ``slots`` a random injective map of the B sequences into it (no -1; set some yourself)."""
    q, k = _qk(gen, B, Hk, K, dtype, use_qk_l2norm)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    rows = B if pool_size is None else pool_size
    d = dict(q=q, k=k, v=_randn(gen, (B, Hv, V), dtype), state=0.5 * _randn(gen, (rows, Hv, K, V), sd))
    if pool_size is not None:
        assert pool_size >= B
        d["slots"] = torch.randperm(pool_size, generator=gen)[:B].to(torch.int32)
    d.update(make_gates(gen, B, Hv, gate_mode=gate_mode, dtype=dtype, **gate_kw))
    return d


PREFILL_ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
DECODE_ORDER = ("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias")


def call_prefill_ref(inp: dict[str, Any], **kw):
    """prefill_ref with a make_prefill_inputs dict (missing optional tensors passed as None)."""
    from gdn_deploy.reference import prefill_ref
    return prefill_ref(*(inp.get(n) for n in PREFILL_ORDER), **kw)


def call_decode_ref(inp: dict[str, Any], **kw):
    """decode_ref with a make_decode_inputs dict (missing optional tensors passed as None)."""
    from gdn_deploy.reference import decode_ref
    return decode_ref(*(inp.get(n) for n in DECODE_ORDER), **kw)


def cast_inputs(inp: dict[str, Any], dtype: torch.dtype, state_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Copy of an input dict with floating I/O tensors in ``dtype`` and states/A_log/dt_bias in ``state_dtype``."""
    out = {}
    for n, t in inp.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            out[n] = t
        elif n in ("initial_state", "state", "A_log", "dt_bias"):
            out[n] = t.to(state_dtype)
        else:
            out[n] = t.to(dtype)
    return out


def ordered_args(inp: dict[str, Any], order: Sequence[str]) -> tuple:
    """The tensors of an input dict in the op's input order (absent optional inputs left out)."""
    return tuple(inp[n] for n in order if n in inp)


def ordered_dynamic_shapes(inp: dict[str, Any], order: Sequence[str], dims: dict[str, Any]) -> tuple:
    """torch.export dynamic_shapes matching :func:`ordered_args`: dim 0 of input n is ``dims[n]`` (or static)."""
    return tuple({0: dims[n]} if n in dims else None for n in order if n in inp)


class PrefillOp(torch.nn.Module):
    """``torch.ops.gdn.prefill`` as a module (for torch.export / ONNX export tests); attributes fixed at init."""

    def __init__(self, **attrs):
        super().__init__()
        self.attrs = attrs

    def forward(self, q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None):
        return torch.ops.gdn.prefill(q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias, **self.attrs)


class DecodeOp(torch.nn.Module):
    """``torch.ops.gdn.decode`` (dense state, default attributes) as a module."""

    def forward(self, q, k, v, g, beta, state):
        return torch.ops.gdn.decode(q, k, v, g, beta, state)


def single_node_model(op, attrs, inp: dict[str, Any], dtype: torch.dtype, body: str = "chunked", opset: int = 20,
                      decode_body: str | None = None, static_shapes: bool = False):
    """An ONNX model of one gdn node (inputs compacted as the spec says) with its function bodies (``body`` for
    prefill, ``decode_body`` for a dense decode: None = the default), checked; returns ``(model, feeds in input
    order)``. ``static_shapes``: the graph inputs carry the feeds' shapes (else every dim is unknown)."""
    import onnx
    from onnx import TensorProto, helper

    from gdn_deploy.export.onnx_functions import add_function_bodies
    from gdn_deploy.spec import SPEC
    elem = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
            torch.bfloat16: TensorProto.BFLOAT16, torch.int32: TensorProto.INT32}
    names = op.input_names(attrs)
    feeds = [inp[n] for n in names]
    ins = [helper.make_tensor_value_info(n, elem[t.dtype], list(t.shape) if static_shapes else [None] * t.dim())
           for n, t in zip(names, feeds)]
    outs = [helper.make_tensor_value_info(op.outputs[0].name, elem[dtype], [None] * 3),
            helper.make_tensor_value_info(op.outputs[1].name, TensorProto.FLOAT, [None] * 4)]
    node = helper.make_node(op.name, names, [o.name for o in outs], domain=SPEC.domain, **attrs)
    model = helper.make_model(helper.make_graph([node], "one_gdn_node", ins, outs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(SPEC.domain, 1)])
    add_function_bodies(model, body, decode_body)
    onnx.checker.check_model(model, full_check=True)
    return model, feeds

