"""``gdn-check``: check an export folder against its float32 PyTorch reference (onnxruntime; TensorRT when present).

An export folder is self-contained: ``gdn-export`` wrote per graph a random feed and the model's float32
PyTorch outputs on it (``<graph>_inputs.json``, ``<graph>_reference.json``). ``gdn-check OUTDIR`` runs
every graph in onnxruntime (and TensorRT with the gdn plugins, when the ``tensorrt`` module and the
plugin library are there) on that feed and compares each output with the spec's tolerance of the export
precision: exactly the check ``gdn-export`` ran. The original model is not needed, so a copied folder is
checked on any machine. ``--from-model`` rebuilds the model the sidecar names and rewrites the reference
files first (a fresh feed with ``--seed``). TensorRT runs the TensorRT-ready file of each graph
(``graphs.<g>.tensorrt_file``, e.g. ``prefill.trt.onnx``) with the plugins registered once per process
(:func:`gdn_deploy.plugins.load_gdn_plugins`).
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..errors import EXIT_CODES_HELP, ExitCode, LoadError, PluginError, UsageError, quiet_warnings, run_cli

EPILOG = """\
Plain Polygraphy works on the same files:
  polygraphy run OUT/prefill.onnx --onnxrt --load-inputs OUT/prefill_inputs.json \\
      --load-outputs OUT/prefill_reference.json --atol 1e-4 --rtol 1e-3
  (the tolerance of an export's precision is in OUT/gdn_model.json: graphs.<graph>.check.tolerance)
  # on a TensorRT machine: the TensorRT-ready file and the self-registering plugin library
  polygraphy run OUT/prefill.trt.onnx --trt --plugins build/plugins_cpp/libgdn_trt_plugins_autoreg.so \\
      --load-inputs OUT/prefill_inputs.json --load-outputs OUT/prefill_reference.json \\
      --trt-min-shapes ... --trt-opt-shapes ... --trt-max-shapes ...   (gdn-check sets the profile itself)

Verdicts: PASS (exit 0), FAIL (exit 5), NOT CHECKED (exit 9: no runtime here could run a graph: a
missing kernel). bf16 graphs run on onnxruntime's CPU provider with float32 arithmetic (bf16 weights and I/O). Before running anything, every file's size and sha256 and each graph's
inputs/outputs are compared with gdn_model.json: a file that does not match is named, exit 3.

examples:
  gdn-check out                       # check an export folder (made by gdn-export, possibly copied here)
  gdn-check out --from-model          # rebuild the reference from the model the folder was exported from
  gdn-check model.pt                  # export into a temporary folder, then check
  gdn-check default -o out --precision fp16
  gdn-check out --device cuda         # onnxruntime-gpu's CUDA provider, in the export's precision

""" + EXIT_CODES_HELP


def build_parser() -> argparse.ArgumentParser:
    from ..cli_util import OneLineParser  # one-line usage errors, exit 2
    p = OneLineParser(prog="gdn-check", description="Check exported gdn graphs against the model's float32 "
                                "PyTorch outputs (onnxruntime; TensorRT with the plugin library when available).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="OUTDIR_OR_MODEL", help="a gdn-export folder, or a MODEL as for gdn-export")
    p.add_argument("-o", "--output", default=None, metavar="OUTDIR",
                   help="where to export when a MODEL is given (default: a temporary folder)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="precision when a MODEL is exported (default: fp32)")
    p.add_argument("--graphs", default=None, metavar="LIST", help="graphs to check (default: all in the folder)")
    p.add_argument("--layer", type=int, default=None, metavar="I", help="as for gdn-export, when a MODEL is given")
    p.add_argument("--from-model", action="store_true",
                   help="rebuild the model named in gdn_model.json (path relative to the folder) and rewrite the "
                        "reference files from it before checking")
    p.add_argument("--seed", type=int, default=1, help="seed of the feed --from-model draws (default: 1)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow loading a pickled .pt model (UNSAFE for untrusted files)")
    p.add_argument("--plugins", default=None, metavar="LIB",
                   help="TensorRT plugin library (default: gdn_deploy.plugins.find_plugin_library())")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where onnxruntime runs the graphs: cpu (default; bf16 graphs with float32 arithmetic), or "
                        "cuda: onnxruntime-gpu's CUDA provider, the sessions loaded as the runtime loads them "
                        "(decode_loop --backend onnxruntime --device cuda), in the export's own precision")
    p.add_argument("-q", "--quiet", action="store_true", help="only the verdict lines")
    return p


def _onnxruntime_cuda(outdir: Path):
    """fn(graph, onnx_path, feed) -> outputs of the folder's graphs on onnxruntime's CUDA provider, loaded by the
    runtime's backend (its in-memory forms of attention and the gdn prefill body: runtime/ort_attention.py); the
    sessions are opened on first use and kept for the folder's other graphs."""
    from ..runtime.backends import OnnxRuntimeBackend, onnxruntime_providers
    from ..runtime.folder import ExportFolder
    providers = onnxruntime_providers("cuda")
    backend = None

    def run(graph: str, path: Path, feed: dict) -> dict[str, Any]:
        nonlocal backend
        if backend is None:
            backend = OnnxRuntimeBackend(ExportFolder(outdir), providers=providers)
        return backend.run(graph, feed)
    return run


def _trt_runner(onnx_path: Path, trt_path: Path | None, profile_shapes: dict[str, dict[str, list[int]]]):
    import onnx
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, NetworkFromOnnxBytes, NetworkFromOnnxPath,
                                        Profile, TrtRunner)

    from ..onnx_nodes import prepare_onnx_for_tensorrt
    prof = Profile()
    for name, s in profile_shapes.items():
        prof.add(name, min=s["min"], opt=s["opt"], max=s["max"])
    if trt_path is not None:
        network = NetworkFromOnnxPath(str(trt_path), strongly_typed=True)
    else:  # a folder exported before gdn-export wrote TensorRT-ready files: prepare in memory, as gdn-build does
        model = onnx.load(str(onnx_path))
        prepare_onnx_for_tensorrt(model)
        network = NetworkFromOnnxBytes(model.SerializeToString(), strongly_typed=True)
    return TrtRunner(EngineFromNetwork(network, config=CreateConfig(profiles=[prof])), name="tensorrt")


def _tensorrt_available(args) -> tuple[bool, Path | None, str]:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False, None, "the tensorrt Python module is not installed"
    from ..plugins import find_plugin_library
    lib = Path(args.plugins) if args.plugins else find_plugin_library()
    if lib is None or not Path(lib).is_file():
        return False, None, "the gdn TensorRT plugin library was not found; build it (gdn-build) or pass --plugins"
    return True, Path(lib), ""


def _tensorrt_runtime(meta: dict, lib: Path):
    """fn(graph, onnx_path, feed) -> outputs through a TensorRT engine of the graph's TensorRT-ready file, with the
    gdn plugins registered (once per process: a second gdn-check in the same process loads nothing)."""
    import numpy as np
    import tensorrt

    from ..plugins import PluginLoadError, load_gdn_plugins
    from .runtimes import to_numpy
    try:
        load_gdn_plugins(tensorrt, lib)
    except PluginLoadError as e:
        raise PluginError(str(e)) from None

    def run(graph: str, path: Path, feed: dict) -> dict[str, Any]:
        trt_file = meta["graphs"][graph].get("tensorrt_file")
        trt = _trt_runner(path, path.with_name(trt_file) if trt_file else None, dict(meta["profiles"][graph]))
        with trt:
            out = trt.infer({k: to_numpy(v) for k, v in feed.items()})
        return {k: np.asarray(v) for k, v in out.items()}
    return run


def _rewrite_reference(outdir: Path, meta: dict, graphs: Sequence[str], args, say) -> None:
    from . import metadata as md
    from .loading import load_targets
    from .targets import cast_target
    from .verify import reference_feed, reference_outputs, write_reference
    src = meta.get("source", {})
    if "model" not in src:
        raise LoadError(f"{outdir}: the sidecar does not say which model was exported (source.model)")
    model = src["model"]
    if model != "default" and not Path(model).is_absolute():
        model = str((outdir / model).resolve())
    if model != "default" and not Path(model).exists():
        raise LoadError(f"{outdir}: --from-model needs the model it was exported from, {model}, which does not exist "
                        "(check without --from-model: the folder holds its reference)")
    say(f"  --from-model: rebuilding {model}" + (f" (layer {src['layer']})" if src.get("layer") is not None else ""))
    from .lazy_export import cast_lazy_target, is_lazy, streamed_reference_outputs
    # a model whose float32 copy would not fit in memory is loaded lazily: its reference is computed layer by
    # layer, each layer's weights read from the checkpoint as it runs (lazy_export.streamed_reference_outputs)
    target = load_targets(model, layer=src.get("layer"), allow_pickle=args.allow_pickle, lazy=None)[0]
    streamed = is_lazy(target)
    target = (cast_lazy_target if streamed else cast_target)(target, meta["precision"])
    if streamed:
        say("  --from-model: the model's float32 copy would not fit in memory: reference computed layer by layer, "
            "weights read from the checkpoint as each layer runs")
    from .model_export import config_hash
    if meta.get("config_hash") and meta["config_hash"] != config_hash(target):
        raise LoadError(f"{outdir}: was exported from another model than {model} (config hash differs); re-export")
    for g in graphs:
        feed = reference_feed(target, g, seed=args.seed, interop=meta.get("interop"))
        ref = streamed_reference_outputs(target, g, feed, meta["precision"]) if streamed else \
            reference_outputs(target, g, feed)
        meta["graphs"][g].setdefault("check", {}).update(write_reference(outdir, g, feed, ref))
    meta.pop("not_checked", None)          # a lazily exported folder now has a reference
    md.write_metadata(outdir, meta)


def check_export_dir(outdir: Path, args: argparse.Namespace, say) -> str:
    """Check one export folder: its files against the sidecar, then every graph against its reference.
    Returns the verdict: "PASS", "FAIL" or "NOT CHECKED" (no runtime here could run a graph)."""
    from . import metadata as md
    from .integrity import verify_folder
    from .verify import check_folder
    meta = md.read_metadata(outdir)
    progress = getattr(args, "progress", None)
    with progress.step(f"verifying the files of {outdir} (sizes, sha256)") if progress else contextlib.nullcontext():
        n = verify_folder(outdir, meta, hashes=True, skip_references=args.from_model)
    src = meta.get("source", {})
    say(f"{outdir}: {meta['model']['kind']} exported from {src.get('model', '?')}"
        + (f" (layer {src['layer']})" if src.get("layer") is not None else "") + f", precision {meta['precision']}")
    say(f"  files: {n} files and the graphs' inputs/outputs match {md.SIDECAR_NAME} (sizes, sha256)")
    graphs = list(meta["graphs"]) if not args.graphs else [g.strip() for g in args.graphs.split(",") if g.strip()]
    for g in graphs:
        if g not in meta["graphs"]:
            raise UsageError(f"--graphs: {g!r} is not in {outdir} (has {', '.join(meta['graphs'])})")
    if meta.get("not_checked") and not args.from_model:
        say(f"  {meta['not_checked']} (gdn-check --from-model rebuilds the float32 model from the "
            "checkpoint and checks the graphs, where it fits in memory)")
        return "NOT CHECKED"
    progress = getattr(args, "progress", None)
    if args.from_model:
        with progress.step("float32 reference from the model") if progress else contextlib.nullcontext():
            _rewrite_reference(outdir, meta, graphs, args, say)
    trt_ok, lib, trt_note = _tensorrt_available(args)
    if not trt_ok:
        say(f"  TensorRT: skipped ({trt_note})")
    extra = {"tensorrt": _tensorrt_runtime(meta, lib)} if trt_ok else None
    ort = {}
    if getattr(args, "device", "cpu") == "cuda":
        ort = dict(onnxruntime_run=_onnxruntime_cuda(outdir), onnxruntime_note=" [CUDA provider, as the runtime "
                   "loads the graphs]")
    checks = []
    for g in graphs:
        with progress.step(f"checking {g}") if progress else contextlib.nullcontext():
            checks += check_folder(outdir, meta, [g], say=say, extra_runtimes=extra, **ort)
    if not all(c.ok for c in checks):
        return "FAIL"
    unchecked = [g for g in graphs if not any(c.checked for c in checks if c.graph == g)]
    if unchecked:
        say(f"  NOT CHECKED: no runtime here could run {', '.join(unchecked)}")
        return "NOT CHECKED"
    return "PASS"


def _looks_like_model(p: Path) -> bool:
    return p.name == "default" or p.is_file() or (p.is_dir() and (p / "config.json").is_file())


def run(args: argparse.Namespace) -> int:
    from polygraphy.logger import G_LOGGER

    from . import metadata as md
    G_LOGGER.module_severity = G_LOGGER.ERROR     # our own report; Polygraphy's INFO lines are noise here
    from ..progress import Progress
    args.progress = Progress("gdn-check", enabled=not args.quiet)

    def say(s: str) -> None:
        if not args.quiet:
            args.progress.clear()
            print(s, flush=True)
    if args.device == "cuda":                     # before any work: no CUDA provider is exit 2 at once
        from ..runtime.backends import onnxruntime_providers
        onnxruntime_providers("cuda")
    target = Path(args.target)
    dirs: list[Path] = []
    if md.find_sidecar(target) is not None:
        dirs = [target if target.is_dir() else target.parent]
    elif target.is_dir() and not _looks_like_model(target):
        dirs = sorted(d for d in target.iterdir() if d.is_dir() and (d / md.SIDECAR_NAME).is_file())
        if not dirs:
            raise md.NotAnExport(f"{target}: not an export folder (no {md.SIDECAR_NAME}) and not a model (no "
                                 "config.json); give a gdn-export output folder, a model.pt / .safetensors file, "
                                 "a Hugging Face folder or 'default'")
    tmp = None
    if not dirs:  # a MODEL: export it first (the export's own check is the one run below)
        from .cli import parse_graphs
        from .loading import load_targets
        from .model_export import ExportOptions, export_model
        if args.from_model:
            raise UsageError("--from-model applies to an export folder, not to a MODEL")
        if args.output:
            from .outdir import check_output_dir
            check_output_dir(args.output)        # before any work: a bad -o is exit 2 at once
        root = Path(args.output) if args.output else Path(tmp := tempfile.mkdtemp(prefix="gdn_check_"))
        targets = load_targets(args.target, layer=args.layer, allow_pickle=args.allow_pickle)
        graphs = parse_graphs(args.graphs or "prefill,decode")
        for t in targets:
            d = root / f"layer_{t.source['layer']}" if len(targets) > 1 else root
            say(f"exporting {args.target} -> {d}")
            export_model(t, d, ExportOptions(precision=args.precision, graphs=graphs, verify=False))
            dirs.append(d)
    verdicts = [check_export_dir(d, args, say) for d in dirs]
    verdict = next((v for v in ("FAIL", "NOT CHECKED") if v in verdicts), "PASS")
    note = " (nothing was compared: see the skipped lines above)" if verdict == "NOT CHECKED" else ""
    print(f"gdn-check: {verdict}{note}" + (f" (files in {tmp})" if tmp else ""), flush=True)
    return {"PASS": ExitCode.OK, "FAIL": ExitCode.MISMATCH, "NOT CHECKED": ExitCode.NOT_CHECKED}[verdict]


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        quiet_warnings(args.quiet)
        return run(args)
    return run_cli("gdn-check", body, command=argv is None)


__all__ = ["main", "build_parser", "run", "check_export_dir"]


if __name__ == "__main__":
    import sys
    sys.exit(main())
