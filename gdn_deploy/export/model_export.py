"""Export a GDNLM or a GDNBlock as ONNX graphs with flat tensor I/O, plus the metadata sidecar.

Graphs (``L`` = number of GDN layers, 1 for a block; ``X`` = ``input_ids [T]`` int64 for an LM,
``x [T, hidden]`` for a block; ``Y`` = ``logits [T, vocab]`` / ``y [T, hidden]``):

- ``prefill.onnx``:     X, cu_seqlens [N+1] int32, conv_state_i [N,conv_dim,W-1], rec_state_i [N,Hv,K,V]
                        -> Y, conv_state_out_i, rec_state_out_i          (i = 0..L-1, interleaved)
- ``decode.onnx``:      X with T -> B (one token per sequence), states [B, ...] -> Y [B, ...], states out
- ``decode_pool.onnx``: X [B], slots [B] int32 (-1 = skip), conv_pool_i [P,...], rec_pool_i [P,...]
                        -> Y, conv_pool_out_i, rec_pool_out_i (the pools with the used rows advanced)

States are float32 in every graph (the conv state holds model-dtype values, stored exactly in
fp32); weights and activations are fp32, fp16 or bf16 (``precision``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..model import GDNBlock, GDNConfig, GDNLM
from ..spec import SPEC
from . import metadata as md

__all__ = ["GRAPHS", "PRECISIONS", "ExportTarget", "ExportOptions", "ExportResult", "GraphPlan",
           "ExportError", "UsageError", "ModelLoadError", "ExportFailure", "VerificationError",
           "graph_plan", "example_feed", "run_torch", "run_onnxruntime", "compare_outputs",
           "export_model", "verify_export", "cast_target", "target_from_module", "load_targets"]

GRAPHS = ("prefill", "decode", "decode_pool")
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.int32: "int32", torch.int64: "int64"}


class ExportError(Exception):
    """Base of the errors the CLIs turn into one line and an exit code."""
    exit_code = 1


class UsageError(ExportError):
    exit_code = 2


class ModelLoadError(ExportError):
    exit_code = 3


class ExportFailure(ExportError):
    exit_code = 4


class VerificationError(ExportError):
    exit_code = 5


@dataclass
class ExportTarget:
    """What gets exported: a GDNLM (kind "lm") or one GDNBlock (kind "block"), and where it came from."""
    module: nn.Module
    kind: str
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> GDNConfig:
        return self.module.config

    @property
    def blocks(self) -> list[GDNBlock]:
        return [l.linear_attn for l in self.module.layers] if self.kind == "lm" else [self.module]

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].out_proj.weight.dtype

    def heads(self) -> dict[str, int]:
        b = self.blocks[0]
        return {"num_k_heads": b.num_k_heads, "num_v_heads": b.num_v_heads, "head_k_dim": b.head_k_dim,
                "head_v_dim": b.head_v_dim, "conv_dim": b.conv_dim, "conv_kernel_size": b.conv_kernel_size,
                "gva_ratio": b.num_v_heads // b.num_k_heads}


def target_from_module(module: nn.Module, source: dict[str, Any] | None = None) -> ExportTarget:
    if isinstance(module, GDNLM):
        return ExportTarget(module.eval(), "lm", dict(source or {}))
    if isinstance(module, GDNBlock):
        return ExportTarget(module.eval(), "block", dict(source or {}))
    raise ModelLoadError(f"cannot export a {type(module).__name__}: expected a GDNLM or a GDNBlock")


def cast_target(target: ExportTarget, precision: str) -> ExportTarget:
    """A copy of the target with weights in ``precision`` (A_log/dt_bias are cast back to fp32 in the op call)."""
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    import copy
    module = copy.deepcopy(target.module).to(PRECISIONS[precision]).eval()
    return ExportTarget(module, target.kind, {**target.source, "precision": precision})


# ---- wrappers with flat tensor I/O -----------------------------------------------------------------
class _Flat(nn.Module):
    def __init__(self, target: ExportTarget):
        super().__init__()
        self.net = target.module
        self.kind = target.kind
        self.num_layers = len(target.blocks)

    def _split(self, states: Sequence[Tensor]):
        return list(states[0::2]), list(states[1::2])

    @staticmethod
    def _join(convs, recs) -> list[Tensor]:
        out: list[Tensor] = []
        for c, r in zip(convs, recs):
            out += [c.float(), r.float()]
        return out


class PrefillGraph(_Flat):
    def forward(self, x: Tensor, cu_seqlens: Tensor, *states: Tensor):
        convs, recs = self._split(states)
        if self.kind == "lm":
            y, c, r = self.net.prefill(x, cu_seqlens, convs, recs)
        else:
            y, c, r = self.net.prefill(x, cu_seqlens, convs[0], recs[0])
            c, r = [c], [r]
        return (y, *self._join(c, r))


class DecodeGraph(_Flat):
    def forward(self, x: Tensor, *states: Tensor):
        convs, recs = self._split(states)
        if self.kind == "lm":
            y, c, r = self.net.decode(x, convs, recs)
        else:
            y, c, r = self.net.decode(x, convs[0], recs[0])
            c, r = [c], [r]
        return (y, *self._join(c, r))


class DecodePoolGraph(_Flat):
    def forward(self, x: Tensor, slots: Tensor, *pools: Tensor):
        convs, recs = self._split([p.clone() for p in pools])   # updated in place, returned as outputs
        if self.kind == "lm":
            y = self.net.decode_pool(x, convs, recs, slots)
        else:
            y = self.net.decode_pool(x, convs[0], recs[0], slots)
        return (y, *self._join(convs, recs))


# ---- graph plans: I/O names, symbolic shapes, dtypes -----------------------------------------------
@dataclass
class GraphPlan:
    name: str
    module: nn.Module
    inputs: list[dict[str, Any]]       # {"name", "shape", "dtype"}
    outputs: list[dict[str, Any]]

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"

    @property
    def input_names(self) -> list[str]:
        return [t["name"] for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t["name"] for t in self.outputs]


def graph_plan(target: ExportTarget, graph: str) -> GraphPlan:
    if graph not in GRAPHS:
        raise UsageError(f"unknown graph {graph!r}: expected some of {', '.join(GRAPHS)}")
    h = target.heads()
    act = _DTYPE_NAMES[target.dtype]
    rows = {"prefill": "T", "decode": "B", "decode_pool": "B"}[graph]
    srows = {"prefill": "N", "decode": "B", "decode_pool": "P"}[graph]
    if target.kind == "lm":
        x = {"name": "input_ids", "shape": [rows], "dtype": "int64"}
        y = {"name": "logits", "shape": [rows, target.config.vocab_size], "dtype": act}
    else:
        x = {"name": "x", "shape": [rows, target.config.hidden_size], "dtype": act}
        y = {"name": "y", "shape": [rows, target.config.hidden_size], "dtype": act}
    stem = "pool" if graph == "decode_pool" else "state"
    ins, outs = [x], [y]
    if graph == "prefill":
        ins.append({"name": "cu_seqlens", "shape": ["N+1"], "dtype": "int32"})
    if graph == "decode_pool":
        ins.append({"name": "slots", "shape": ["B"], "dtype": "int32"})
    conv_shape = [srows, h["conv_dim"], h["conv_kernel_size"] - 1]
    rec_shape = [srows, h["num_v_heads"], h["head_k_dim"], h["head_v_dim"]]
    for i in range(len(target.blocks)):
        ins += [{"name": f"conv_{stem}_{i}", "shape": conv_shape, "dtype": "float32"},
                {"name": f"rec_{stem}_{i}", "shape": rec_shape, "dtype": "float32"}]
        outs += [{"name": f"conv_{stem}_out_{i}", "shape": conv_shape, "dtype": "float32"},
                 {"name": f"rec_{stem}_out_{i}", "shape": rec_shape, "dtype": "float32"}]
    cls = {"prefill": PrefillGraph, "decode": DecodeGraph, "decode_pool": DecodePoolGraph}[graph]
    return GraphPlan(graph, cls(target).eval(), ins, outs)


def _random_cu_seqlens(tokens: int, seqs: int, gen: torch.Generator) -> Tensor:
    cuts = torch.sort(torch.randint(0, tokens + 1, (seqs - 1,), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([tokens])]).to(torch.int32)


def example_feed(target: ExportTarget, graph: str, *, tokens: int = 11, seqs: int = 3, batch: int = 3,
                 pool: int = 5, seed: int = 0, zero_states: bool = False,
                 equal_lengths: bool = False) -> dict[str, Tensor]:
    """Random inputs of a graph (ordered as the graph's inputs). Sizes must be >= 2 when used for export.

    ``equal_lengths``: prefill sequences of equal length (``tokens`` rounded down to a multiple of
    ``seqs``), what the interop ``LinearAttention`` export supports."""
    if equal_lengths and graph == "prefill":
        tokens = max(seqs, tokens - tokens % seqs)
    plan = graph_plan(target, graph)
    gen = torch.Generator().manual_seed(seed)
    sizes = {"T": tokens, "N": seqs, "B": batch, "P": pool}
    feed: dict[str, Tensor] = {}
    for t in plan.inputs:
        shape = [md.eval_dim(d, sizes) for d in t["shape"]]
        name = t["name"]
        if name == "input_ids":
            feed[name] = torch.randint(0, target.config.vocab_size, shape, generator=gen)
        elif name == "cu_seqlens":
            feed[name] = (torch.arange(seqs + 1, dtype=torch.int32) * (tokens // seqs) if equal_lengths
                          else _random_cu_seqlens(tokens, seqs, gen))
        elif name == "slots":
            perm = torch.randperm(pool, generator=gen)[:batch].to(torch.int32)
            if batch > 1:
                perm[batch // 2] = -1                     # one skipped sequence
            feed[name] = perm
        elif name == "x":
            feed[name] = torch.randn(shape, generator=gen).to(target.dtype)
        else:
            scale = 0.0 if zero_states else (0.5 if name.startswith("conv") else 0.1)
            feed[name] = torch.randn(shape, generator=gen) * scale
            if name.startswith("conv"):   # values the model dtype can hold exactly
                feed[name] = feed[name].to(target.dtype).float()
    return feed


def run_torch(plan: GraphPlan, feed: dict[str, Tensor]) -> dict[str, Tensor]:
    with torch.no_grad():
        outs = plan.module(*[feed[n] for n in plan.input_names])
    return dict(zip(plan.output_names, outs))


def _to_numpy(t: Tensor):
    import numpy as np
    if t.dtype == torch.bfloat16:   # numpy has no bfloat16: pass the bits as ml_dtypes if available
        import ml_dtypes  # noqa: F401  (onnxruntime/onnx depend on it)
        return t.view(torch.int16).numpy().view(np.dtype("bfloat16"))
    return t.numpy()


def run_onnxruntime(path: str | Path, feed: dict[str, Tensor]) -> dict[str, Tensor]:
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: _to_numpy(v) for k, v in feed.items()})
    return {n: torch.from_numpy(r.astype("float32") if r.dtype.name == "bfloat16" else r)
            for n, r in zip(names, res)}


def compare_outputs(ref: dict[str, Tensor], got: dict[str, Tensor], dtype: str) -> list[dict[str, Any]]:
    """Per output: max/mean abs and rel error and a pass flag (|a-b| <= atol + rtol*|b|, spec tolerances)."""
    atol, rtol = SPEC.runtime_tolerance(dtype)
    rows = []
    for name, b in ref.items():
        if name not in got:
            rows.append({"name": name, "ok": False, "why": "missing output"})
            continue
        a, b64 = got[name].double(), b.double()
        if tuple(a.shape) != tuple(b64.shape):
            rows.append({"name": name, "ok": False, "why": f"shape {tuple(a.shape)} != {tuple(b64.shape)}"})
            continue
        d = (a - b64).abs()
        rel = d / b64.abs().clamp_min(1e-12)
        finite = bool(torch.isfinite(a).all())
        ok = finite and bool((d <= atol + rtol * b64.abs()).all())
        rows.append({"name": name, "ok": ok, "max_abs": float(d.max()) if d.numel() else 0.0,
                     "mean_abs": float(d.mean()) if d.numel() else 0.0,
                     "max_rel": float(rel.max()) if d.numel() else 0.0, "atol": atol, "rtol": rtol,
                     **({} if finite else {"why": "non-finite values"})})
    return rows


# ---- export -----------------------------------------------------------------------------------------
@dataclass
class ExportOptions:
    precision: str = "fp32"
    graphs: tuple[str, ...] = ("prefill", "decode")
    opset: int | None = None
    interop: str | None = None
    max_tokens: int = 8192
    max_seqs: int = 64
    verify: bool = True
    external_data: bool = False


@dataclass
class ExportResult:
    outdir: Path
    files: list[Path]
    metadata: dict[str, Any]
    verification: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _dynamic_shapes(plan: GraphPlan):
    from torch.export import Dim
    big = 1 << 20
    # ("N" would clash with sympy's N() inside torch.export)
    dims = {"T": Dim("tokens", min=1, max=big), "N": Dim("seqs", min=1, max=big // 2),
            "B": Dim("batch", min=1, max=big // 2), "P": Dim("pool", min=1, max=big // 2)}
    shapes = []
    for t in plan.inputs:
        spec = {}
        for i, d in enumerate(t["shape"]):
            if isinstance(d, str):
                spec[i] = dims["N"] + 1 if d == "N+1" else dims[d]
        shapes.append(spec)
    return tuple(shapes)


def _export_graph(plan: GraphPlan, target: ExportTarget, path: Path, opts: ExportOptions) -> int:
    from . import onnx_ops
    feed = example_feed(target, plan.name, tokens=12 if opts.interop else 11, equal_lengths=bool(opts.interop))
    # states and pools go through *args: pass the dynamic shapes positionally
    shapes = _dynamic_shapes(plan)
    fixed = 2 if plan.name in ("prefill", "decode_pool") else 1
    dyn = (*shapes[:fixed], tuple(shapes[fixed:]))
    kw: dict[str, Any] = {"interop": opts.interop}
    if opts.opset is not None:
        kw["opset"] = opts.opset
    onnx_ops.export_program(plan.module, tuple(feed.values()), str(path), kwargs=None, dynamic_shapes=dyn,
                            input_names=plan.input_names, output_names=plan.output_names,
                            external_data=opts.external_data, **kw)
    return _rename_dims(path)


_DIM_RENAMES = {"tokens": "T", "seqs": "N", "seqs + 1": "N+1", "batch": "B", "pool": "P"}


def _rename_dims(path: Path) -> int:
    """Give the graph I/O the sidecar's dim symbols (torch.export cannot name a Dim 'N': sympy's N()).

    Returns the model's default-domain opset."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in _DIM_RENAMES:
                d.dim_param = _DIM_RENAMES[d.dim_param]
    onnx.save_model(model, str(path))
    return next(int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx"))


def export_model(target: ExportTarget, outdir: str | Path, opts: ExportOptions | None = None, *,
                 log: Callable[[str], None] = lambda s: None) -> ExportResult:
    """Export the graphs of ``opts.graphs`` into ``outdir`` and write ``gdn_model.json``.

    ``target`` is cast to ``opts.precision`` first. Verification (onnxruntime vs PyTorch on a
    small random input) runs when ``opts.verify``; a mismatch raises :class:`VerificationError`
    after the files are written.
    """
    opts = opts or ExportOptions()
    for g in opts.graphs:
        if g not in GRAPHS:
            raise UsageError(f"unknown graph {g!r}: expected some of {', '.join(GRAPHS)}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tgt = cast_target(target, opts.precision)
    plans, files, opsets = {}, [], set()
    for g in opts.graphs:
        plan = graph_plan(tgt, g)
        path = outdir / plan.file
        log(f"exporting graph {g} -> {path}")
        t0 = time.perf_counter()
        try:
            opsets.add(_export_graph(plan, tgt, path, opts))
        except ExportError:
            raise
        except Exception as e:  # noqa: BLE001 (torch.export / onnx raise many kinds)
            raise ExportFailure(f"exporting {g} failed: {type(e).__name__}: {_first_line(e)}") from e
        log(f"  {g}: {path.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f} s")
        plans[g], files = plan, files + [path]
    act = _DTYPE_NAMES[tgt.dtype]
    meta = md.build_metadata(
        kind=tgt.kind, config=tgt.config.to_dict(), heads=tgt.heads(), num_gdn_layers=len(tgt.blocks),
        precision=opts.precision, dtypes={"weights": act, "activations": act, "states": "float32"},
        graphs={g: {"file": p.file, "inputs": p.inputs, "outputs": p.outputs} for g, p in plans.items()},
        source=tgt.source, opset=max(opsets) if opsets else opts.opset, interop=opts.interop,
        max_tokens=opts.max_tokens, max_seqs=opts.max_seqs)
    log(f"writing {outdir / md.SIDECAR_NAME}")
    files.append(md.write_metadata(outdir, meta))
    result = ExportResult(outdir, files, meta)
    if opts.verify:
        log("checking onnxruntime vs PyTorch on a small random input")
        result.verification = verify_export(tgt, outdir, opts.graphs, precision=opts.precision,
                                            interop=opts.interop, log=log)
        bad = [f"{g}:{r['name']}" for g, rows in result.verification.items() for r in rows if not r["ok"]]
        if bad:
            raise VerificationError(f"onnxruntime differs from PyTorch beyond the {opts.precision} tolerance "
                                    f"in {', '.join(bad)} (files kept in {outdir})")
    return result


def verify_export(target: ExportTarget, outdir: str | Path, graphs: Sequence[str], *, precision: str,
                  seed: int = 1, interop: str | None = None,
                  log: Callable[[str], None] = lambda s: None) -> dict[str, list[dict[str, Any]]]:
    """onnxruntime vs PyTorch per graph on a small random input (sizes other than the export sample)."""
    dtype = _DTYPE_NAMES[PRECISIONS[precision]]
    report: dict[str, list[dict[str, Any]]] = {}
    if interop == "onnx":
        log("  verification skipped: onnxruntime has no kernel for the ONNX-standard LinearAttention (opset 27)")
        return {g: [] for g in graphs}
    for g in graphs:
        plan = graph_plan(target, g)
        feed = example_feed(target, g, tokens=8 if interop else 9, seqs=2, batch=2, pool=4, seed=seed,
                            equal_lengths=bool(interop))
        try:
            got = run_onnxruntime(Path(outdir) / plan.file, feed)
        except Exception as e:  # noqa: BLE001
            if precision == "bf16" and "NOT_IMPLEMENTED" in str(e):
                log(f"  {g}: verification skipped: onnxruntime's CPU provider has no bfloat16 kernel for part of "
                    f"the graph ({_first_line(e)[-120:]}); check it on a GPU runtime (gdn-check with TensorRT)")
                report[g] = []
                continue
            raise ExportFailure(f"onnxruntime could not run {plan.file}: {_first_line(e)}") from e
        rows = compare_outputs(run_torch(plan, feed), got, dtype)
        for r in rows:
            if "max_abs" in r:
                log(f"  {g}.{r['name']}: max abs {r['max_abs']:.2e} max rel {r['max_rel']:.2e} "
                    f"{'ok' if r['ok'] else 'MISMATCH'}")
            else:
                log(f"  {g}.{r['name']}: {r['why']}")
        report[g] = rows
    return report


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:400] if text else type(e).__name__


# ---- loading ----------------------------------------------------------------------------------------
def load_targets(model: str = "default", *, layer: int | None = None,
                 allow_pickle: bool = False) -> list[ExportTarget]:
    """Resolve a MODEL argument into export targets.

    ``default`` (the bundled tiny GDNLM), a gdn-deploy ``.pt`` / ``.safetensors`` checkpoint, a HF
    folder (config.json + safetensors; one block target per GDN layer), or, only with
    ``allow_pickle``, a ``.pt`` holding a whole pickled GDNLM/GDNBlock (unsafe for untrusted files).
    ``layer`` picks one GDN layer (its block) of an LM or HF folder.
    """
    from ..checkpoint import load_checkpoint
    if model == "default":
        from ..models import default_model_path
        path, source = default_model_path(), {"model": "default"}
    else:
        path = Path(model)
        source = {"model": str(path.resolve())}
        if not path.exists():
            raise UsageError(f"{model}: no such file or folder (give a model.pt, a .safetensors file, "
                             f"a Hugging Face model folder, or 'default')")
    if path.is_dir():
        from ..hf import load_hf_folder
        try:
            blocks = load_hf_folder(path)
        except (ValueError, OSError, KeyError) as e:
            raise ModelLoadError(f"{model}: cannot load the Hugging Face folder: {_first_line(e)}") from e
        if layer is not None:
            chosen = [(i, b) for i, b in blocks if i == layer]
            if not chosen:
                raise UsageError(f"--layer {layer}: not a Gated DeltaNet layer of {model} "
                                 f"(GDN layers: {[i for i, _ in blocks]})")
            blocks = chosen
        return [ExportTarget(b.eval(), "block", {**source, "format": "hf", "layer": i}) for i, b in blocks]
    try:
        module = load_checkpoint(path, allow_pickle=allow_pickle)
    except (ValueError, OSError, RuntimeError) as e:
        msg = _first_line(e)
        if "allow_pickle=True" in msg:
            msg = (f"{path}: holds pickled Python objects and cannot be loaded safely (weights_only). "
                   "If you trust this file, pass --allow-pickle (UNSAFE: unpickling runs code from the file)")
        raise ModelLoadError(msg) from e
    source = {**source, "format": "checkpoint", "layer": layer, "allow_pickle": bool(allow_pickle)}
    if layer is not None:
        if not isinstance(module, GDNLM):
            raise UsageError(f"--layer {layer}: {model} is a single GDNBlock; --layer selects a layer of a "
                             "GDNLM or a Hugging Face folder")
        if not 0 <= layer < len(module.layers):
            raise UsageError(f"--layer {layer}: the model has GDN layers 0..{len(module.layers) - 1}")
        return [ExportTarget(module.layers[layer].linear_attn.eval(), "block", source)]
    return [target_from_module(module, source)]
