"""Op-level ONNX translation of the gdn torch ops (torch dynamo exporter).

- :func:`register_schemas`  the gdn OpSchemas (from the spec) in ``onnx.defs``
- :func:`translation_table` ``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``:
  each gdn torch op becomes ONE node ``gdn::GatedDeltaPrefill`` / ``gdn::GatedDeltaDecode`` (what
  TensorRT maps to its plugins), or with ``interop=`` onnxruntime's ``LinearAttention`` (see
  :mod:`gdn_deploy.export.interop`)
- :func:`add_function_bodies` model-local function bodies so onnxruntime runs the gdn nodes
- :func:`export_program` all of it: torch.export, pool-update rewrite, ONNX export, bodies, checker, save

``gdn::decode_pool_`` updates its pool in place. ``torch.export`` turns that into an
``auto_functionalized`` call that the ONNX exporter cannot translate, so :func:`export_program`
first rewrites it to the functional ``gdn_export::decode_pool`` (returns ``(o, new_pool)``),
which translates to ``GatedDeltaDecode(state_mode=1)`` with outputs ``(o, new pool)``. The
updated pool must be returned by ``forward`` (ONNX has no in-place update); otherwise the
export raises instead of silently dropping the update.
"""
from __future__ import annotations

import contextlib
import operator
import os
from typing import Any, Callable, Optional, Sequence

import onnx
import torch
from torch import Tensor

from .. import ops as _ops  # noqa: F401  (registers torch.ops.gdn.*)
from ..spec import COMMIT, DECODE, PREFILL, SPEC, STATE_POOL, VERIFY, contract_error
from .onnx_functions import BODIES, DEFAULT_BODY, MIN_OPSET, add_function_bodies
from .onnx_norm_form import rsqrt_mul_as_div
from .onnx_optimize import linear_multi_output_matching
from .onnx_schedule import leaves_walked_in_order
from ..onnx_nodes import gdn_nodes, stamp_plugin_attributes
from .onnx_schemas import register_schemas

__all__ = ["register_schemas", "translation_table", "add_function_bodies", "export_program",
           "functionalize_pool_updates", "gdn_nodes", "INTEROP_CHOICES"]

INTEROP_CHOICES = (None, "com.microsoft", "onnx")
_DD = DECODE.defaults


# --- functional stand-in for the in-place pool update (export only) ---------------------------------
@torch.library.custom_op("gdn_export::decode_pool", mutates_args=())
def decode_pool(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor, slots: Tensor,
                A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                gate_mode: int = _DD["gate_mode"], use_qk_l2norm: int = _DD["use_qk_l2norm"],
                scale: float = _DD["scale"], l2norm_eps: float = _DD["l2norm_eps"]) -> tuple[Tensor, Tensor]:
    """``gdn::decode_pool_`` without mutation: returns ``(o, updated copy of pool)``."""
    new = pool.clone()
    o = torch.ops.gdn.decode_pool_(q, k, v, g, beta, new, slots, A_log, dt_bias, gate_mode=gate_mode,
                                   use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps)
    return o, new


@decode_pool.register_fake
def _(q, k, v, g, beta, pool, slots, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0, scale=0.0,
      l2norm_eps=1e-6):
    return v.new_empty(v.shape), pool.new_empty(pool.shape)


# --- translations ---------------------------------------------------------------------------------
def _gdn_opset():
    import onnxscript
    register_schemas()
    return onnxscript.values.Opset(SPEC.domain, SPEC.opset_version)


def _present_inputs(op, attrs: dict[str, Any], given: dict[str, Any]) -> list:
    """Inputs in spec order with absent ones left out; checks presence against the attributes."""
    out = []
    for t in op.inputs:
        present, value = t.present(attrs), given.get(t.name)
        if present and value is None:
            raise contract_error("missing", name=t.name, condition=t.present_if or "always")
        if value is not None and not present:
            raise contract_error("unexpected", name=t.name, condition=t.present_if)
        if present:
            out.append(value)
    return out


def _onnx_attrs(op, attrs: dict[str, Any]) -> dict[str, Any]:
    return {a: (float(attrs[a]) if SPEC.attributes[a]["type"] == "float" else int(attrs[a])) for a in op.attributes}


def _prefill_translation(q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None,
                         gate_mode=0, use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6):
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps)
    ins = _present_inputs(PREFILL, attrs, dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                                               initial_state=initial_state, A_log=A_log, dt_bias=dt_bias))
    return _gdn_opset().GatedDeltaPrefill(*ins, **_onnx_attrs(PREFILL, attrs))


def _decode(state_mode: int, q, k, v, g, beta, state, slots, A_log, dt_bias, gate_mode, use_qk_l2norm, scale,
            l2norm_eps):
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                         state_mode=state_mode)
    ins = _present_inputs(DECODE, attrs, dict(q=q, k=k, v=v, g=g, beta=beta, state=state, slots=slots,
                                              A_log=A_log, dt_bias=dt_bias))
    return _gdn_opset().GatedDeltaDecode(*ins, **_onnx_attrs(DECODE, attrs))


def _decode_translation(q, k, v, g, beta, state, A_log=None, dt_bias=None, gate_mode=0, use_qk_l2norm=0,
                        scale=0.0, l2norm_eps=1e-6):
    return _decode(0, q, k, v, g, beta, state, None, A_log, dt_bias, gate_mode, use_qk_l2norm, scale, l2norm_eps)


def _decode_pool_translation(q, k, v, g, beta, pool, slots, A_log=None, dt_bias=None, gate_mode=0,
                             use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6):
    """Pool decode -> GatedDeltaDecode(state_mode=1) with outputs (o, updated pool)."""
    return _decode(STATE_POOL, q, k, v, g, beta, pool, slots, A_log, dt_bias, gate_mode, use_qk_l2norm, scale,
                   l2norm_eps)


def _verify_translation(q, k, v, g, beta, cu_seqlens, state, slots=None, A_log=None, dt_bias=None, gate_mode=0,
                        use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6, state_mode=0):
    """gdn::verify -> GatedDeltaVerify (outputs o, commit_k, commit_delta, commit_g)."""
    attrs = VERIFY.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                         state_mode=state_mode)
    ins = _present_inputs(VERIFY, attrs, dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state=state,
                                              slots=slots, A_log=A_log, dt_bias=dt_bias))
    return _gdn_opset().GatedDeltaVerify(*ins, **_onnx_attrs(VERIFY, attrs))


def _commit_translation(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None, state_mode=0):
    """gdn::commit (the functional form) -> GatedDeltaCommit (output: the new state)."""
    attrs = COMMIT.attrs(state_mode=state_mode)
    ins = _present_inputs(COMMIT, attrs, dict(state=state, commit_k=commit_k, commit_delta=commit_delta,
                                              commit_g=commit_g, cu_seqlens=cu_seqlens, accepted=accepted,
                                              slots=slots))
    return _gdn_opset().GatedDeltaCommit(*ins, **_onnx_attrs(COMMIT, attrs))


def translation_table(interop: str | None = None) -> dict:
    """``custom_translation_table`` for the gdn torch ops.

    ``interop=None``: gdn nodes (TensorRT plugins; onnxruntime through :func:`add_function_bodies`).
    ``interop="com.microsoft"``: onnxruntime's contrib ``LinearAttention`` (no varlen, see interop.py).
    ``interop="onnx"``: the same contrib node; :func:`export_program` then converts it to the
    ONNX-standard opset-27 ``LinearAttention`` (interop.to_standard_linear_attention).
    """
    if interop not in INTEROP_CHOICES:
        raise ValueError(f"interop: expected one of {INTEROP_CHOICES}, got {interop!r}")
    if interop is not None:
        from .interop import interop_translations
        fns = interop_translations(interop)
    else:
        register_schemas()
        fns = dict(prefill=_prefill_translation, decode=_decode_translation, decode_pool=_decode_pool_translation)
    from ..lm.cache_attention import cache_attention  # noqa: F401  (registers torch.ops.gdn_export.cache_attention)
    from ..lm.moe_op import moe  # noqa: F401  (registers torch.ops.gdn_export.moe)
    from .onnx_cache_attention import cache_attention_translation
    from .onnx_moe import moe_translation
    table = {torch.ops.gdn.prefill.default: fns["prefill"], torch.ops.gdn.decode.default: fns["decode"],
             torch.ops.gdn.decode_pool_.default: fns["decode_pool"],
             torch.ops.gdn_export.decode_pool.default: fns["decode_pool"],
             torch.ops.gdn_export.cache_attention.default: cache_attention_translation,
             torch.ops.gdn_export.moe.default: moe_translation}
    if interop is None:     # the speculative ops have gdn nodes only (no LinearAttention form)
        table.update({torch.ops.gdn.verify.default: _verify_translation,
                      torch.ops.gdn.commit.default: _commit_translation})
    return table


# --- export ---------------------------------------------------------------------------------------
_POOL_VIEW_KEYS = ("_pool_size", "_pool_stride", "_pool_storage_offset", "_pool_slice_dim")


def functionalize_pool_updates(ep: "torch.export.ExportedProgram") -> list[str]:
    """Rewrite ``auto_functionalized(gdn.decode_pool_)`` nodes of a decomposed program to the functional
    ``gdn_export::decode_pool`` (in place). Returns the FX names of the updated-pool values."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2
    graph = ep.graph_module.graph
    new_pools = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (auto_functionalized, auto_functionalized_v2):
            continue
        if node.args[0] is not torch.ops.gdn.decode_pool_.default:
            continue
        kw = dict(node.kwargs)
        if node.target is auto_functionalized_v2:
            if any(key in kw for key in _POOL_VIEW_KEYS):
                raise ValueError("gdn.decode_pool_: the pool is a view of a larger tensor; pass the whole pool "
                                 "tensor (a graph input) so its update can become an ONNX output")
            bases = kw.pop("_all_bases")
            kw["pool"] = bases[kw.pop("_pool_base_index")]
        with graph.inserting_before(node):
            new = graph.call_function(torch.ops.gdn_export.decode_pool.default, kwargs=kw)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        new_pools += [u.name for u in new.users if u.target is operator.getitem and u.args[1] == 1]
    graph.lint()
    ep.graph_module.recompile()
    return new_pools


def _check_pool_outputs(ep, new_pools: list[str]) -> None:
    from torch.export.graph_signature import OutputKind
    user = {s.arg.name for s in ep.graph_signature.output_specs
            if s.kind == OutputKind.USER_OUTPUT and hasattr(s.arg, "name")}
    for s in ep.graph_signature.output_specs:
        if s.kind != OutputKind.USER_OUTPUT and getattr(s.arg, "name", None) in new_pools and s.arg.name not in user:
            raise ValueError(
                f"gdn.decode_pool_ updates {s.target!r} in place, but forward() does not return it. ONNX has no "
                "in-place update: return the pool from forward() so the updated pool becomes a graph output "
                "(and make it a forward() input, not a module buffer).")


def _export_dims(dynamic_shapes):
    """String axis names (as torch.onnx.export takes them) -> torch.export dims; the ONNX export renames them."""
    try:
        from torch.onnx._internal.exporter._dynamic_shapes import convert_str_to_export_dim
    except ImportError:  # pragma: no cover - other torch versions
        return dynamic_shapes
    return convert_str_to_export_dim(dynamic_shapes)[0]


_TORCHLIB_CACHE: dict[int, Any] = {}


@contextlib.contextmanager
def _reuse_torchlib_registry():
    """Build torch.onnx's torchlib registry once per opset instead of once per export (~4 s each).

    ``ONNXRegistry.from_torchlib`` re-parses ~500 onnxscript functions on every call; while this
    context is active it returns a fresh registry whose function lists are copied from a cached
    one (custom translations are then registered on the copy as usual). Falls back to the
    original behaviour when the private API is not there.
    """
    try:
        from torch.onnx._internal.exporter import _registration
        cls = _registration.ONNXRegistry
        original = cls.__dict__["from_torchlib"]
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def cached(klass, opset_version=None):
        key = opset_version if opset_version is not None else -1
        if key not in _TORCHLIB_CACHE:
            _TORCHLIB_CACHE[key] = (original.__func__(klass) if opset_version is None
                                    else original.__func__(klass, opset_version))
        base = _TORCHLIB_CACHE[key]
        reg = klass()
        reg._opset_version = base._opset_version
        reg.functions = {k: list(v) for k, v in base.functions.items()}
        return reg

    cls.from_torchlib = classmethod(cached)
    try:
        yield
    finally:
        cls.from_torchlib = original


def _short(e: BaseException, limit: int = 1500) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + " ..."


def export_program(module, args: Sequence[Any], path: str | os.PathLike | None, *, kwargs: dict | None = None,
                   dynamic_shapes=None, input_names: Sequence[str] | None = None,
                   output_names: Sequence[str] | None = None, opset: int = 20, external_data: bool = False,
                   interop: str | None = None, check_interop: bool = True, gdn_body: str = DEFAULT_BODY,
                   decode_body: str | None = None, extra_translations: dict[Callable, Callable] | None = None,
                   lazy_initializers: dict[str, Callable[[], torch.Tensor]] | None = None,
                   weights: Any = None, progress: Any = None, label: str = "graph",
                   ir_transform: Callable[[Any], Any] | None = None) -> onnx.ModelProto:
    """Export ``module`` (an ``nn.Module`` or ``ExportedProgram``) calling gdn ops to ONNX and save it to ``path``.

    Steps: ``torch.export`` (non-strict) -> functionalize in-place pool updates ->
    ``torch.onnx.export(dynamo=True, custom_translation_table=translation_table(interop))`` -> RMS norms in the
    form onnxruntime fuses (:func:`.onnx_norm_form.rsqrt_mul_as_div`) -> leaf nodes last, so that onnxruntime's
    default order runs state side chains inside their layer (:func:`.onnx_schedule.leaves_walked_in_order`) ->
    function bodies (interop None;
    ``gdn_body`` "chunked" or "token" picks the prefill body, ``decode_body`` "linear_attention" or "ops" the
    dense-state decode body, None: the default of :func:`add_function_bodies`) ->
    ``onnx.checker`` -> save (``external_data``: weights streamed to ``<path>.data`` one tensor at a time, never
    held as a second in-memory copy). Returns the ModelProto (without external weights loaded when saved externally).
    With ``interop``, ``check_interop`` first runs ``module`` eagerly on ``args`` to check the
    interop limits (equal-length sequences) with a clear ValueError.
    ``lazy_initializers`` (initializer name -> function returning its value; :mod:`.lazy_export`): the module
    holds placeholders; the program is built unoptimized, those initializers then read their real values when
    folded or saved (needs ``external_data`` and a ``path``).
    ``weights`` (a :class:`~.weights_file.WeightsWriter` in ``path``'s folder, with ``external_data``): the big
    initializers go straight into that shared file (:func:`.stream_weights.save_streamed`), not ``<path>.data``.
    ``progress`` (:class:`gdn_deploy.progress.Progress`) is told each stage, ``label`` naming the graph.
    ``ir_transform`` is called on the translated ``onnx_ir`` model before it is optimized (:mod:`.layer_stamping`).
    """
    if opset < MIN_OPSET:
        raise ValueError(f"opset: the gdn export needs ONNX opset >= {MIN_OPSET}, got {opset}")
    if interop not in INTEROP_CHOICES:
        raise ValueError(f"interop: expected one of {INTEROP_CHOICES}, got {interop!r}")
    if gdn_body not in BODIES:
        raise ValueError(f"gdn_body: expected one of {', '.join(BODIES)}, got {gdn_body!r}")
    if interop == "onnx" and opset < 27:
        raise ValueError(f"interop='onnx' emits the opset-27 LinearAttention; pass opset >= 27 (got {opset})")
    args, kwargs = tuple(args), dict(kwargs or {})
    register_schemas()
    if interop is not None and check_interop and not isinstance(module, torch.export.ExportedProgram):
        from .interop import check_interop_limits
        check_interop_limits(module, args, kwargs)
    stage = progress.begin if progress is not None else (lambda text: None)
    stage(f"tracing {label} (torch.export)")
    try:
        if isinstance(module, torch.export.ExportedProgram):
            ep = module
        else:
            if isinstance(module, torch.nn.Module):
                module = module.eval()
            ep = torch.export.export(module, args, kwargs=kwargs or None,
                                     dynamic_shapes=_export_dims(dynamic_shapes), strict=False)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"gdn export: torch.export failed ({type(e).__name__}): {_short(e)}") from e
    if any(n.target is torch.ops.gdn.decode_pool_.default for n in ep.graph.nodes):
        ep = ep.run_decompositions({})      # functionalization only; the ONNX exporter decomposes later
    _check_pool_outputs(ep, functionalize_pool_updates(ep))
    table = translation_table(interop)
    table.update(extra_translations or {})
    if weights is not None and (path is None or not external_data):
        raise ValueError("weights: a shared weights file needs a path and external_data=True")
    if lazy_initializers is not None and (path is None or not external_data):
        raise ValueError("lazy_initializers: the weights are streamed to disk; pass a path and external_data=True")
    stage(f"translating {label} to ONNX")
    optimize_now = lazy_initializers is None and ir_transform is None
    try:
        with _reuse_torchlib_registry(), linear_multi_output_matching():
            prog = torch.onnx.export(ep, args, kwargs=kwargs or None, dynamo=True, custom_translation_table=table,
                                     dynamic_shapes=dynamic_shapes, input_names=input_names,
                                     output_names=output_names, opset_version=opset,
                                     verbose=False, optimize=optimize_now)
            if lazy_initializers is not None:
                from .lazy_export import attach_lazy_initializers
                attach_lazy_initializers(prog.model, lazy_initializers)
            if ir_transform is not None:
                ir_transform(prog.model)
            if not optimize_now:
                stage(f"optimizing {label} (constant folding)")
                prog.optimize()              # constant folding now reads the real (small) values
    except Exception as e:  # noqa: BLE001
        if ir_transform is not None and getattr(e, "stamping_refused", False):
            raise
        raise RuntimeError(f"gdn export: ONNX translation failed ({type(e).__name__}): {_short(e)}") from e
    streamed = external_data and path is not None
    if streamed:
        # the weights go to <path>.data tensor by tensor, straight from the module's parameters (no in-memory
        # ModelProto holding a second copy of every weight); the graph is then finished on the weight-less proto
        path = os.fspath(path)
        if weights is not None:
            from .stream_weights import save_streamed
            save_streamed(prog.model, path, weights, progress=progress, label=f"writing weights of {label}")
        else:
            prog.save(path, external_data=True)
        stage(f"finishing {label} (function bodies, checker)")
        model = onnx.load(path, load_external_data=False)
    else:
        model = prog.model_proto
    rsqrt_mul_as_div(model.graph)          # RMS norms in the form onnxruntime fuses (onnx_norm_form.py)
    leaves_walked_in_order(model.graph)    # state side chains run inside their layer (onnx_schedule.py)
    if interop is None:
        add_function_bodies(model, gdn_body, decode_body)
        stamp_plugin_attributes(model)     # TensorRT: node -> plugin (gdn namespace); onnxruntime ignores them
    elif interop == "onnx":
        from .interop import to_standard_linear_attention
        model = to_standard_linear_attention(model, opset)
    if path is None:
        onnx.checker.check_model(model, full_check=True)
        return model
    path = os.fspath(path)
    if streamed:
        onnx.save_model(model, path)       # keeps the external-data entries of <path>.data
        onnx.checker.check_model(path, full_check=True)
    else:
        onnx.checker.check_model(model, full_check=True)
        onnx.save_model(model, path)
    return model
