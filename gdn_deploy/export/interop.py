"""Interop export: the gdn torch ops as ``LinearAttention`` (update_rule "gated_delta") for onnxruntime-only users.

``interop="com.microsoft"``: onnxruntime's contrib op ``com.microsoft::LinearAttention`` (CPU kernel:
float32 only, so I/O is cast to float32 around it) with ``com.microsoft::LinearAttentionGate`` for
raw gates. ``interop="onnx"``: the ONNX-standard opset-27 ``LinearAttention`` (model opset >= 27);
onnxruntime 1.31 has no kernel for it (see ``README`` notes in the report / tests).

What the op expects and what we emit around it:
- layout ``[B, T, H*D]`` (heads packed last) and state ``[B, H_kv, d_k, d_v]`` (= gdn's NHKV state),
  so prefill tokens ``[T, H, D]`` of N equal-length sequences become ``[N, T/N, H*D]`` and decode
  ``[B, H, D]`` becomes ``[B, 1, H*D]``;
- no varlen: one sequence or equal lengths only. Checked at export time (ValueError) from the
  example inputs (:func:`check_interop_limits`) and from static shapes; at run time unequal
  lengths make ``o`` NaN instead of silently wrong numbers;
- gated_delta: ``S = exp(g) S + beta k (v - exp(g) S^T k)^T``, ``o = scale q^T S`` = the gdn rule;
  keys are NOT normalised by the op: with ``use_qk_l2norm=1`` we emit the L2 norm of q and k;
- heads: the op's GQA shares kv heads among q heads; gdn shares q/k heads among v heads (GVA), so
  q and k are repeated to Hv heads (q_num_heads = kv_num_heads = Hv, static at export);
- raw gates: ``-exp(A_log) * softplus(a + dt_bias)`` and ``sigmoid(b)`` computed before the op;
- pool decode: rows of slots >= 0 are gathered, updated by the op and scattered back (ScatterND).
"""
from __future__ import annotations

from typing import Any, Sequence

import onnx
import torch
from onnx import TensorProto
from onnx.defs import OpSchema
from torch.utils._python_dispatch import TorchDispatchMode

from ..spec import GATE_RAW

__all__ = ["interop_translations", "check_interop_limits", "linear_attention_schema", "INTEROP_DOMAINS",
           "to_standard_linear_attention", "require_equal_lengths"]

INTEROP_DOMAINS = {"com.microsoft": ("com.microsoft", 1), "onnx": ("", 27)}
_T = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def linear_attention_schema(domain: str = "com.microsoft", version: int = 1) -> OpSchema:
    """OpSchema of ``LinearAttention`` (for onnxscript; the ONNX-standard one comes from onnx.defs)."""
    if domain == "":
        return onnx.defs.get_schema("LinearAttention", version, "")
    FP, Opt = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    ins = [FP("query", "T"), FP("key", "T"), FP("value", "T"), FP("past_state", "S", param_option=Opt),
           FP("decay", "T", param_option=Opt), FP("beta", "T", param_option=Opt)]
    attrs = [OpSchema.Attribute("q_num_heads", OpSchema.AttrType.INT, "", required=True),
             OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, "", required=True),
             OpSchema.Attribute("update_rule", onnx.helper.make_attribute("update_rule", "gated_delta"), ""),
             OpSchema.Attribute("scale", onnx.helper.make_attribute("scale", 0.0), ""),
             OpSchema.Attribute("chunk_size", onnx.helper.make_attribute("chunk_size", 64), "")]
    return OpSchema("LinearAttention", domain, version, "onnxruntime contrib LinearAttention", inputs=ins,
                    outputs=[FP("output", "T"), FP("present_state", "S")],
                    type_constraints=[("T", _T, ""), ("S", _T, "")], attributes=attrs)


def _ops(interop: str):
    import onnxscript
    from onnxscript.onnx_opset import opset18 as op
    # The torch exporter builds at its torchlib opset and version-converts afterwards, which has no
    # adapter for LinearAttention; so "onnx" is emitted as the contrib op and converted afterwards
    # by to_standard_linear_attention (export_program does that).
    domain, version = INTEROP_DOMAINS["com.microsoft"]
    la = onnxscript.values.Op(onnxscript.values.Opset(domain, version), "LinearAttention",
                              linear_attention_schema(domain, version))
    return op, la


def _static(dim: Any, what: str) -> int:
    if not isinstance(dim, int):
        raise ValueError(f"interop LinearAttention: {what} must be static at export time (it becomes the "
                         f"q_num_heads/kv_num_heads attribute), got symbolic {dim}")
    return dim


def _prepare(op, q, k, v, g, beta, A_log, dt_bias, gate_mode, use_qk_l2norm, l2norm_eps):
    """float32 q/k repeated to Hv heads (L2-normalised if asked), v, log-decay g and beta."""
    F = TensorProto.FLOAT
    qf, kf, vf, gf, bf = (op.Cast(x, to=F) for x in (q, k, v, g, beta))
    if int(gate_mode) == GATE_RAW:
        gf = op.Mul(op.Neg(op.Exp(op.Cast(A_log, to=F))), op.Softplus(op.Add(gf, op.Cast(dt_bias, to=F))))
        bf = op.Sigmoid(bf)
    if int(use_qk_l2norm):
        eps = op.Constant(value=onnx.helper.make_tensor("eps", F, [], [float(l2norm_eps)]))
        qf, kf = (op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(x, x), op.Constant(
            value_ints=[-1]), keepdims=1), eps)))) for x in (qf, kf))
    hk = _static(q.shape[1], "Hk (q/k heads)")
    hv = _static(v.shape[1], "Hv (value heads)")
    kd, vd = _static(q.shape[2], "K"), _static(v.shape[2], "V")
    if hk == 0 or hv % hk:
        raise ValueError(f"heads: Hv={hv} is not a multiple of Hk={hk}")
    rep = hv // hk
    if rep > 1:
        rows = op.Shape(q, start=0, end=1)
        exp_to = op.Concat(rows, op.Constant(value_ints=[hk, rep, kd]), axis=0)
        tgt = op.Concat(rows, op.Constant(value_ints=[hv, kd]), axis=0)
        qf, kf = (op.Reshape(op.Expand(op.Unsqueeze(x, op.Constant(value_ints=[2])), exp_to), tgt)
                  for x in (qf, kf))
    return qf, kf, vf, gf, bf, hv, kd, vd


def _run_la(op, la, q3, k3, v3, state, g3, b3, hv, scale):
    return la(q3, k3, v3, state, g3, b3, q_num_heads=hv, kv_num_heads=hv, update_rule="gated_delta",
              scale=float(scale))


def interop_translations(interop: str) -> dict:
    """Translation functions (prefill, decode, decode_pool) emitting LinearAttention."""
    if interop not in INTEROP_DOMAINS:
        raise ValueError(f"interop: expected one of {sorted(INTEROP_DOMAINS)}, got {interop!r}")
    op, la = _ops(interop)
    F = TensorProto.FLOAT

    def prefill(q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None, gate_mode=0,
                use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6):
        n1, t = cu_seqlens.shape[0], q.shape[0]
        if isinstance(n1, int) and isinstance(t, int) and (n1 < 2 or t % (n1 - 1)):
            raise ValueError(f"interop LinearAttention has no varlen: T={t} tokens cannot be {n1 - 1} "
                             "equal-length sequences")
        qf, kf, vf, gf, bf, hv, kd, vd = _prepare(op, q, k, v, g, beta, A_log, dt_bias, gate_mode,
                                                  use_qk_l2norm, l2norm_eps)
        cu = op.Cast(cu_seqlens, to=TensorProto.INT64)
        n = op.Sub(op.Shape(cu), op.Constant(value_ints=[1]))
        length = op.Div(op.Shape(q, start=0, end=1), n)                       # T / N
        q3, k3, v3, g3, b3 = (op.Reshape(x, op.Concat(n, length, op.Constant(value_ints=[w]), axis=0))
                              for x, w in ((qf, hv * kd), (kf, hv * kd), (vf, hv * vd), (gf, hv), (bf, hv)))
        out, state = _run_la(op, la, q3, k3, v3, op.Cast(initial_state, to=F), g3, b3, hv, scale)
        o = op.Reshape(out, op.Shape(v))
        # Run-time guard: unequal sequence lengths -> NaN output rather than wrong numbers.
        ends, starts = op.Slice(cu, [1], [2 ** 62], [0]), op.Slice(cu, [0], [-1], [0])
        equal = op.Equal(op.Sub(ends, starts), length)
        ok = op.ReduceMin(op.Cast(equal, to=F), keepdims=0)
        nan = op.Constant(value=onnx.helper.make_tensor("nan", F, [], [float("nan")]))
        o = op.Where(op.Cast(ok, to=TensorProto.BOOL), o, nan)
        return op.CastLike(o, q), state

    def decode(q, k, v, g, beta, state, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0, scale=0.0,
               l2norm_eps=1e-6):
        qf, kf, vf, gf, bf, hv, kd, vd = _prepare(op, q, k, v, g, beta, A_log, dt_bias, gate_mode,
                                                  use_qk_l2norm, l2norm_eps)
        q3, k3, v3, g3, b3 = (op.Reshape(x, op.Constant(value_ints=[0, 1, w]))   # [B, 1, H*D]
                              for x, w in ((qf, hv * kd), (kf, hv * kd), (vf, hv * vd), (gf, hv), (bf, hv)))
        out, new = _run_la(op, la, q3, k3, v3, op.Cast(state, to=F), g3, b3, hv, scale)
        return op.CastLike(op.Reshape(out, op.Shape(v)), q), new

    def decode_pool(q, k, v, g, beta, pool, slots, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0,
                    scale=0.0, l2norm_eps=1e-6):
        qf, kf, vf, gf, bf, hv, kd, vd = _prepare(op, q, k, v, g, beta, A_log, dt_bias, gate_mode,
                                                  use_qk_l2norm, l2norm_eps)
        valid = op.GreaterOrEqual(slots, op.Constant(value=onnx.helper.make_tensor("z", TensorProto.INT32, [], [0])))
        pos = op.Squeeze(op.NonZero(valid), op.Constant(value_ints=[0]))
        rows = op.Cast(op.Gather(slots, pos, axis=0), to=TensorProto.INT64)
        picked = [op.Gather(x, pos, axis=0) for x in (qf, kf, vf, gf, bf)]
        q3, k3, v3 = (op.Reshape(x, op.Concat(op.Shape(pos), op.Constant(value_ints=[1, w]), axis=0))
                      for x, w in zip(picked[:3], (hv * kd, hv * kd, hv * vd)))
        g3, b3 = (op.Unsqueeze(x, op.Constant(value_ints=[1])) for x in picked[3:])
        pool_f = op.Cast(pool, to=F)
        out, new_rows = _run_la(op, la, q3, k3, v3, op.Gather(pool_f, rows, axis=0), g3, b3, hv, scale)
        o_rows = op.Reshape(out, op.Concat(op.Shape(pos), op.Constant(value_ints=[hv, vd]), axis=0))
        zeros = op.ConstantOfShape(op.Shape(vf), value=onnx.helper.make_tensor("z", F, [1], [0.0]))
        o = op.ScatterND(zeros, op.Unsqueeze(pos, op.Constant(value_ints=[1])), o_rows)
        new_pool = op.ScatterND(pool_f, op.Unsqueeze(rows, op.Constant(value_ints=[1])), new_rows)
        return op.CastLike(o, q), new_pool

    return dict(prefill=prefill, decode=decode, decode_pool=decode_pool)


class _InteropLimits(TorchDispatchMode):
    """Checks the example inputs of every gdn.prefill call against the interop limits."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.gdn.prefill.default:
            cu = kwargs.get("cu_seqlens", args[5] if len(args) > 5 else None)
            lengths = (cu[1:] - cu[:-1]).tolist() if cu is not None else []
            if not lengths:
                raise ValueError("interop LinearAttention: gdn.prefill needs at least one sequence "
                                 "(cu_seqlens has N+1 >= 2 entries)")
            if len(set(lengths)) > 1:
                raise ValueError(
                    f"interop LinearAttention has no varlen: gdn.prefill got sequence lengths {lengths[:16]} "
                    "(cu_seqlens); it needs one sequence or equal lengths. Export without interop (gdn nodes "
                    "with function bodies) for packed varlen batches.")
        return func(*args, **kwargs)


def require_equal_lengths(cu_seqlens, where: str = "prefill") -> None:
    """Refuse a ragged batch for an interop (LinearAttention) export with one clear line (UsageError).

    The op has no varlen: unequal lengths would give NaN outputs. Runners of interop exports call this."""
    from ..errors import UsageError
    cu = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)]
    lens = [b - a for a, b in zip(cu, cu[1:])]
    if len(set(lens)) > 1:
        shown = ", ".join(map(str, lens[:8])) + (", ..." if len(lens) > 8 else "")
        raise UsageError(f"{where}: this is an --interop (LinearAttention) export, which needs sequences of equal "
                         f"length; got lengths {shown}. Pad the prompts to one length, or use an export without "
                         "--interop (gdn nodes take ragged batches)")


def check_interop_limits(module, args: Sequence[Any], kwargs: dict | None = None) -> None:
    """Run ``module`` eagerly on the example inputs and raise ValueError where the interop op cannot follow."""
    with torch.no_grad(), _InteropLimits():
        module(*args, **(kwargs or {}))


def to_standard_linear_attention(model: onnx.ModelProto, opset: int = 27) -> onnx.ModelProto:
    """Turn an interop model's ``com.microsoft::LinearAttention`` nodes into ONNX-standard opset-``opset``
    ``LinearAttention`` (same inputs/attributes) and convert the rest of the graph to that opset."""
    if opset < 27:
        raise ValueError(f"the ONNX-standard LinearAttention needs opset >= 27, got {opset}")
    from onnx import version_converter
    model = version_converter.convert_version(model, opset)
    for node in model.graph.node:
        if node.op_type == "LinearAttention" and node.domain == "com.microsoft":
            node.domain = ""
    if not any(n.domain == "com.microsoft" for n in model.graph.node):
        keep = [i for i in model.opset_import if i.domain != "com.microsoft"]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return model
