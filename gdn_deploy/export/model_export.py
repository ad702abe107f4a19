"""Export a GDNLM, a whole hybrid LM or a GDNBlock as ONNX graphs with flat tensor I/O, the sidecar and the check files.

:func:`export_model` writes, into one folder: the graphs of :mod:`.graphs` (``prefill.onnx``,
``decode.onnx``, optionally ``decode_pool.onnx``), ``gdn_model.json`` (:mod:`.metadata`), and per graph
a reference feed and its float32 PyTorch outputs (:mod:`.verify`), then checks the files with the same
function ``gdn-check`` uses.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..errors import ExportFailure, GdnError, MismatchError, NotChecked, UsageError, first_line
from ..onnx_nodes import write_tensorrt_onnx
from ..spec import SPEC
from . import metadata as md
from .graphs import GRAPHS, GraphPlan, example_feed, graph_plan
from .outdir import check_output_dir, staged_output
from .targets import DTYPE_NAMES, PRECISIONS, ExportTarget, cast_target
from .lazy_export import NOT_CHECKED_LAZY, cast_lazy_target, is_lazy, lazy_initializers
from .weights_file import WEIGHTS_FILE, WeightsWriter, share_weights
from .verify import check_folder, reference_feed, reference_outputs, write_reference

__all__ = ["ExportOptions", "ExportResult", "export_model", "config_hash", "EXTERNAL_DATA_BYTES"]

EXTERNAL_DATA_BYTES = 1_500_000_000     # protobuf cannot hold 2 GB: bigger weights leave the graph while exporting


def _weight_bytes(target: ExportTarget) -> int:
    return sum(p.numel() * p.element_size() for p in target.module.parameters())


@dataclass
class ExportOptions:
    precision: str = "fp32"
    graphs: tuple[str, ...] = ("prefill", "decode")
    opset: int | None = None
    interop: str | None = None
    gdn_body: str = "chunked"        # prefill function body onnxruntime runs: "chunked" or "token"
    max_tokens: int = 8192
    max_seqs: int = 64
    verify: bool = True
    external_data: bool = True         # each graph's weights streamed straight into the folder's weights.data as it
                                       # is saved (2.3x faster than inline graphs re-serialised at every step; same
                                       # files). False: inline graphs, then shared (forced on above 1.5 GB)
    max_context: int = 4096            # TensorRT profile: max KV-cache capacity S (hybrid models)
    all_logits: bool = False           # hybrid prefill returns every token's logits, not each sequence's last
    stamp: bool = True                 # hybrid prefill/decode: trace one layer of each kind, clone the rest
                                       # (layer_stamping.py; GDN_EXPORT_STAMP=0 traces every layer)


@dataclass
class ExportResult:
    outdir: Path
    files: list[Path]
    metadata: dict[str, Any]
    verification: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def config_hash(target: ExportTarget) -> str:
    """sha256 of the model's kind and config (canonical JSON): tells whether an export folder is of this model."""
    text = json.dumps({"kind": target.kind, "config": target.config.to_dict()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _dynamic_shapes(plan: GraphPlan):
    from torch.export import Dim
    big = 1 << 20
    # ("N" would clash with sympy's N() inside torch.export)
    dims = {"T": Dim("tokens", min=1, max=big), "N": Dim("seqs", min=1, max=big // 2),
            "B": Dim("batch", min=1, max=big // 2), "P": Dim("pool", min=1, max=big // 2),
            "S": Dim("cache", min=1, max=big // 2), "L": Dim("padded", min=1, max=big),
            "D": Dim("draft", min=1, max=SPEC.max_draft_tokens)}
    shapes = []
    for t in plan.inputs:
        spec = {}
        for i, d in enumerate(t["shape"]):
            if isinstance(d, str):
                spec[i] = dims["N"] + 1 if d == "N+1" else dims[d]
        shapes.append(spec)
    return tuple(shapes)


def _export_graph(plan: GraphPlan, target: ExportTarget, path: Path, opts: ExportOptions, *,
                  weights: WeightsWriter | None = None, progress: Any = None,
                  log: Callable[[str], None] = lambda s: None) -> int:
    from . import onnx_ops
    traced, transform = plan, None
    stamped = _stamping(plan, target, opts, log)
    if stamped is not None:
        traced, transform, target_traced = stamped
    else:
        target_traced = target
    feed = example_feed(target_traced, plan.name, tokens=12 if opts.interop else 11,
                        equal_lengths=bool(opts.interop))
    # states and pools go through *args: pass the dynamic shapes positionally
    shapes = _dynamic_shapes(traced)
    fixed = traced.fixed_inputs if traced.fixed_inputs is not None else len(shapes)
    dyn = (*shapes[:fixed], tuple(shapes[fixed:])) if fixed < len(shapes) else tuple(shapes)
    kw: dict[str, Any] = {"interop": opts.interop, "gdn_body": opts.gdn_body}
    if opts.opset is not None:
        kw["opset"] = opts.opset
    if is_lazy(target):     # weights streamed from the checkpoint (lazy_export.py)
        kw["lazy_initializers"] = lazy_initializers(traced.module, target)
    if transform is not None:
        from .layer_stamping import layer_end_translations, marked_layers
        kw.update(ir_transform=transform, extra_translations=layer_end_translations())
        marks = marked_layers(target_traced.module)
    else:
        marks = contextlib.nullcontext()
    from .layer_stamping import NotStampable
    try:
        with marks:
            onnx_ops.export_program(traced.module, tuple(feed.values()), str(path), kwargs=None,
                                    dynamic_shapes=dyn, input_names=traced.input_names,
                                    output_names=traced.output_names,
                                    external_data=opts.external_data or is_lazy(target), weights=weights,
                                    progress=progress, label=plan.name, **kw)
    except NotStampable as e:       # raised before anything is written
        log(f"  {plan.name}: tracing every layer ({e})")
        return _export_graph(plan, target, path, replace(opts, stamp=False), weights=weights, progress=progress,
                             log=log)
    return _rename_dims(path, plan)


def _stamping(plan: GraphPlan, target: ExportTarget, opts: ExportOptions, log: Callable[[str], None]):
    """(prefix plan, IR transform, prefix target) when ``plan``'s graph is built by layer stamping, else None
    (with a one-line reason in the log when the model has layers to stamp but does not fit)."""
    from .layer_stamping import NotStampable, stamp_setup, stamping_enabled
    if target.kind != "hybrid" or plan.name not in ("prefill", "decode") or opts.interop \
            or not stamping_enabled(opts.stamp):
        return None
    try:
        return stamp_setup(plan, target, graph_plan, log)
    except NotStampable as e:
        log(f"  {plan.name}: tracing every layer ({e})")
        return None


_DIM_RENAMES = {"tokens": "T", "seqs": "N", "seqs + 1": "N+1", "batch": "B", "pool": "P", "cache": "S",
                "padded": "L", "draft": "D"}


def _rename_dims(path: Path, plan: GraphPlan | None = None) -> int:
    """Give the graph I/O the sidecar's dim symbols (torch.export cannot name a Dim 'N': sympy's N()); with a
    plan, every graph input and output takes exactly its symbolic shape (a dim torch derived, e.g. N from
    cu_seqlens' N+1, would otherwise keep a name like 's39').

    Returns the model's default-domain opset."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in _DIM_RENAMES:
                d.dim_param = _DIM_RENAMES[d.dim_param]
    if plan is not None:
        spec = {t["name"]: t["shape"] for t in [*plan.inputs, *plan.outputs]}
        for v in [*model.graph.input, *model.graph.output]:
            shape = spec.get(v.name)
            dims = v.type.tensor_type.shape.dim
            if shape is None or len(shape) != len(dims):
                continue
            for d, want in zip(dims, shape):
                if isinstance(want, str):
                    d.dim_param = want
        from .onnx_cache_attention import fit_for_onnxruntime
        fit_for_onnxruntime(model, spec)
    onnx.save_model(model, str(path))
    return next(int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx"))


def _portable_source(source: dict[str, Any], outdir: Path) -> dict[str, Any]:
    """The source with a model path relative to the export folder (a copied folder stays checkable)."""
    out = dict(source)
    model = out.get("model")
    if model and model != "default" and os.path.isabs(str(model)):
        try:
            out["model"] = os.path.relpath(str(model), str(outdir.resolve()))
        except ValueError:   # another drive (Windows): keep it absolute
            pass
    return out


def export_model(target: ExportTarget, outdir: str | Path, opts: ExportOptions | None = None, *,
                 log: Callable[[str], None] = lambda s: None, progress: Any = None) -> ExportResult:
    """Export the graphs of ``opts.graphs`` into ``outdir``, write ``gdn_model.json`` and the check files.

    ``outdir`` is checked first (:func:`.outdir.check_output_dir`: new, empty or an earlier export); the files are
    written into a temporary sibling folder, the sidecar last, and moved into place at the end (an earlier export
    is replaced only then; an error or Ctrl-C leaves it as it was). ``target`` is cast to ``opts.precision`` first.
    With ``opts.verify`` the folder is then checked exactly as ``gdn-check OUTDIR`` does (onnxruntime against the
    stored float32 reference); ``progress`` (:class:`gdn_deploy.progress.Progress`) shows the long steps; a
    mismatch raises :class:`~gdn_deploy.errors.MismatchError` and a check no runtime
    here could run :class:`~gdn_deploy.errors.NotChecked`, both after the files are in place.
    """
    opts = opts or ExportOptions()
    for g in opts.graphs:
        if g not in GRAPHS:
            raise UsageError(f"unknown graph {g!r}: expected some of {', '.join(GRAPHS)}")
    if target.kind == "hybrid" and opts.interop:
        raise UsageError(f"--interop {opts.interop}: LinearAttention replaces the gdn ops of pure-GDN models and "
                         "blocks only; export this hybrid model without --interop")
    outdir = check_output_dir(outdir)
    with staged_output(outdir) as work:
        meta, verdict = _export_into(work, outdir, target, opts, log, _Steps(progress))
    result = ExportResult(outdir, [outdir / n for n in meta["files"]] + [outdir / md.SIDECAR_NAME], meta)
    if verdict is not None:
        checks, bad, unchecked = verdict
        result.verification = {c.graph: c.rows for c in checks}
        if bad:
            raise MismatchError(f"onnxruntime differs from the float32 PyTorch reference beyond the {opts.precision} "
                                f"tolerance in {', '.join(bad)} (files kept in {outdir})")
        if unchecked:
            raise NotChecked(f"{outdir}: written but not checked: {unchecked[0]}")
    return result


class _Steps:
    """``progress.step(label)`` when there is a progress, else nothing."""

    def __init__(self, progress: Any):
        self.progress = progress

    def __call__(self, label: str):
        return self.progress.step(label) if self.progress is not None else contextlib.nullcontext()


def _export_into(work: Path, outdir: Path, target: ExportTarget, opts: ExportOptions,
                 log: Callable[[str], None], step: _Steps):
    """Export into the staging folder ``work`` (moved to ``outdir`` afterwards); the sidecar is written last.
    Returns the sidecar and, with ``opts.verify``, (checks, failed outputs, reasons graphs went unchecked)."""
    lazy = is_lazy(target)
    tgt = cast_lazy_target(target, opts.precision) if lazy else cast_target(target, opts.precision)
    tgt.all_logits = tgt.all_logits or opts.all_logits
    if not opts.external_data and _weight_bytes(tgt) > EXTERNAL_DATA_BYTES:
        log(f"  weights {_weight_bytes(tgt) / 1e9:.2f} GB: graphs written with external data")
        opts = replace(opts, external_data=True)
    plans, opsets, trt_files, graph_files = {}, set(), {}, []
    # big weights: streamed once into the folder's weights.data while each graph is saved (stream_weights.py)
    writer = WeightsWriter(work / WEIGHTS_FILE) if opts.external_data or lazy else None
    try:
        shared = _export_graphs(work, outdir, tgt, opts, log, step, writer, plans, opsets, trt_files, graph_files)
    finally:
        if writer is not None:
            writer.close()
    log(f"  weights: {shared.file_bytes / 1e6:.1f} MB in {shared.path.name} ({shared.unique_tensors} tensors) "
        f"read by {len(shared.graphs)} graphs")
    return _finish(work, outdir, tgt, opts, log, step, plans, opsets, trt_files, lazy)


def _export_graphs(work, outdir, tgt, opts, log, step, writer, plans, opsets, trt_files, graph_files):
    for g in opts.graphs:
        plan = graph_plan(tgt, g)
        path = work / plan.file
        log(f"exporting graph {g} -> {outdir / plan.file}")
        t0 = time.perf_counter()
        try:
            with step(f"exporting {g}") as progress:
                opsets.add(_export_graph(plan, tgt, path, opts, weights=writer, progress=progress, log=log))
        except GdnError:
            raise
        except Exception as e:  # noqa: BLE001 (torch.export / onnx raise many kinds)
            raise ExportFailure(f"exporting {g} failed: {type(e).__name__}: {first_line(e)}") from e
        log(f"  {g}: {path.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f} s")
        trt_files[g] = write_tensorrt_onnx(path)   # <g>.trt.onnx for TensorRT; None without gdn nodes (interop)
        plans[g] = plan
        graph_files += [f for f in (path, trt_files[g]) if f]
    with step("sharing one weights file between the graphs"):
        return share_weights(work, graph_files, log=log, writer=writer)   # one weights file read by every graph


def _finish(work, outdir, tgt, opts, log, step, plans, opsets, trt_files, lazy):
    act = DTYPE_NAMES[tgt.dtype]
    graphs = {g: {"file": p.file, "tensorrt_file": trt_files[g].name if trt_files[g] else None,
                  "inputs": p.inputs, "outputs": p.outputs} for g, p in plans.items()}
    tol = SPEC.check_tolerance(act)
    for g in plans if not lazy else ():
        with step(f"float32 PyTorch reference of {g}"):
            feed = reference_feed(tgt, g, interop=opts.interop)
            entry = write_reference(work, g, feed, reference_outputs(tgt, g, feed))
        graphs[g]["check"] = {**entry, "tolerance": tol}
    if lazy:
        log(f"  {NOT_CHECKED_LAZY}")
    else:
        log(f"  reference feeds and float32 PyTorch outputs: "
            f"{', '.join(graphs[g]['check']['reference'] for g in plans)}")
    meta = md.build_metadata(
        kind=tgt.kind, config=tgt.config.to_dict(), heads=tgt.heads(), num_gdn_layers=len(tgt.blocks),
        precision=opts.precision, dtypes={"weights": act, "activations": act, "states": "float32"},
        graphs=graphs, source=_portable_source(tgt.source, outdir), opset=max(opsets) if opsets else opts.opset,
        interop=opts.interop, max_tokens=opts.max_tokens, max_seqs=opts.max_seqs, config_hash=config_hash(tgt),
        gdn_body=None if opts.interop else opts.gdn_body, max_context=opts.max_context)
    if tgt.kind == "hybrid":
        from .hybrid_export import hybrid_metadata
        meta = hybrid_metadata(meta, tgt, work, log)
    if opts.interop:
        meta["limits"] = {"equal_length_prefill": True,
                          "why": "--interop LinearAttention has no varlen: prefill sequences must have equal lengths"}
        log("  note: this --interop export takes prefill batches of equal-length sequences only "
            "(runners refuse ragged ones: gdn_deploy.export.interop.require_equal_lengths)")
    if lazy:
        meta["not_checked"] = NOT_CHECKED_LAZY
    log(f"writing {outdir / md.SIDECAR_NAME}")
    md.write_metadata(work, meta)
    if not opts.verify:
        return meta, None
    if lazy:
        return meta, ([], [], [NOT_CHECKED_LAZY])
    log("checking the files: onnxruntime against the float32 reference (what gdn-check runs)")
    with step("checking the graphs in onnxruntime"):
        checks = check_folder(work, meta, say=log)
    bad = [f"{c.graph}:{r['name']}" for c in checks for r in c.rows if not r["ok"]]
    unchecked = [c.skipped for c in checks if c.skipped]
    return meta, (checks, bad, unchecked)
