"""``gdn-check``: compare an export against PyTorch with Polygraphy (onnxruntime, and TensorRT when present).

For every graph of an export folder (``gdn_model.json``) the PyTorch model the export came
from is rebuilt, run on a small random feed and saved as Polygraphy RunResults; the
onnxruntime runner of Polygraphy runs the ONNX file on the same feed and
``Comparator.compare_accuracy`` decides PASS/FAIL with the spec's per-dtype tolerances
(``SPEC.runtime_tolerance``). With the ``tensorrt`` module and the plugin library, a
TensorRT engine (plugins loaded) is compared with onnxruntime too.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Sequence

from .cli import EXIT_EXPORT, EXIT_MISMATCH, EXIT_OK, EXIT_USAGE

EPILOG = """\
Files written into the export folder (reusable with plain Polygraphy):
  inputs.json, torch_outputs.json                 prefill feed and PyTorch outputs
  <graph>_inputs.json, <graph>_torch_outputs.json  the same for decode / decode_pool

  polygraphy run OUT/prefill.onnx --onnxrt --load-inputs OUT/inputs.json \\
      --load-outputs OUT/torch_outputs.json --atol 1e-4 --rtol 1e-3
  # on a TensorRT machine, with the gdn plugin library (gdn-build / find_plugin_library()):
  polygraphy run OUT/prefill.onnx --trt --onnxrt --plugins build/plugins_cpp/libgdn_trt_plugins.so \\
      --load-inputs OUT/inputs.json --trt-min-shapes ... (or use gdn-check, which sets the profile)

examples:
  gdn-check gdn_onnx               # check an export folder made by gdn-export
  gdn-check model.pt               # export into a temporary folder, then check
  gdn-check default -o out --precision fp16

exit codes: 0 all outputs within tolerance, 2 usage / bad input, 3 model could not be loaded,
4 a runtime could not run the graph, 5 mismatch. GDN_DEBUG=1 prints tracebacks.
"""


class CheckFailure(Exception):
    exit_code = EXIT_EXPORT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gdn-check", description="Compare exported gdn graphs with PyTorch through "
                                "Polygraphy (onnxruntime; TensorRT with the plugin library when available).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="OUTDIR_OR_MODEL", help="a gdn-export folder, or a MODEL as for gdn-export")
    p.add_argument("-o", "--output", default=None, metavar="OUTDIR",
                   help="where to export when a MODEL is given (default: a temporary folder)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="precision when a MODEL is exported (default: fp32)")
    p.add_argument("--graphs", default=None, metavar="LIST", help="graphs to check (default: all in the folder)")
    p.add_argument("--layer", type=int, default=None, metavar="I", help="as for gdn-export, when a MODEL is given")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow loading a pickled .pt model (UNSAFE for untrusted files)")
    p.add_argument("--plugins", default=None, metavar="LIB",
                   help="TensorRT plugin library (default: gdn_deploy.plugins.find_plugin_library())")
    p.add_argument("--seed", type=int, default=0, help="seed of the random feed (default: 0)")
    return p


def _np_feed(feed) -> dict[str, Any]:
    from .model_export import _to_numpy
    return {k: _to_numpy(v.contiguous()) for k, v in feed.items()}


def _sizes(meta: dict) -> dict[str, int]:
    lim = meta.get("profile_limits", {})
    mt, ms = int(lim.get("max_tokens", 9)), int(lim.get("max_seqs", 4))
    return {"tokens": min(9, mt), "seqs": min(2, ms), "batch": min(3, ms), "pool": min(4, ms)}


def _stats(a, b) -> tuple[float, float, float]:
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = np.abs(a - b)
    if d.size == 0:
        return 0.0, 0.0, 0.0
    return float(d.max()), float(d.mean()), float((d / np.maximum(np.abs(b), 1e-12)).max())


def _compare(results, atol: float, rtol: float, names: list[str], say) -> bool:
    """Polygraphy accuracy comparison of the first two runners; prints one line per output."""
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.logger import G_LOGGER
    old = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.CRITICAL   # our own report below
    try:
        acc = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol))
    finally:
        G_LOGGER.module_severity = old
    (r0, iters0), (r1, iters1) = results[0], results[1]
    out0, out1 = iters0[0], iters1[0]
    first = acc[0] if hasattr(acc, "output_names") else acc   # AccuracyResults (polygraphy >= 0.50) or AccuracyResult
    verdicts = first[(r0, r1)][0]
    ok_all = bool(acc)
    for n in names:
        if n not in out1:
            say(f"    {n:<22} missing in {r1}  FAIL")
            ok_all = False
            continue
        mx, mean, rel = _stats(out1[n], out0[n])
        ok = bool(verdicts.get(n, False))
        say(f"    {n:<22} max abs {mx:9.2e}  mean abs {mean:9.2e}  max rel {rel:9.2e}  {'PASS' if ok else 'FAIL'}")
    return ok_all


def _trt_runner(path: Path, lib: Path, profile_shapes: dict[str, dict[str, list[int]]], fp_mode: str):
    import onnx
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, LoadPlugins, NetworkFromOnnxBytes,
                                        Profile, TrtRunner)

    from ..onnx_nodes import prepare_onnx_for_tensorrt
    prof = Profile()
    for name, s in profile_shapes.items():
        prof.add(name, min=s["min"], opt=s["opt"], max=s["max"])
    # Same preparation as gdn-build: gdn nodes -> plugins, onnxruntime function bodies dropped.
    model = onnx.load(str(path))
    prepare_onnx_for_tensorrt(model)
    network = NetworkFromOnnxBytes(LoadPlugins(plugins=[str(lib)], obj=model.SerializeToString()),
                                   strongly_typed=True)
    return TrtRunner(EngineFromNetwork(network, config=CreateConfig(profiles=[prof])), name="tensorrt")


def check_folder(outdir: Path, args: argparse.Namespace, say) -> bool:
    import numpy as np
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import RunResults
    from polygraphy.json import save_json

    from ..spec import SPEC
    from . import metadata as md
    from .model_export import cast_target, example_feed, graph_plan, load_targets, run_torch

    meta = md.read_metadata(outdir)
    src = meta.get("source", {})
    if "model" not in src:
        raise md.MetadataError(f"{outdir}: the sidecar does not say which model was exported (source.model)")
    say(f"{outdir}: {meta['model']['kind']} exported from {src['model']}"
        + (f" (layer {src['layer']})" if src.get("layer") is not None else "") + f", precision {meta['precision']}")
    targets = load_targets(src["model"], layer=src.get("layer"), allow_pickle=args.allow_pickle)
    target = cast_target(targets[0], meta["precision"])
    act = meta["dtypes"]["activations"]
    atol, rtol = SPEC.runtime_tolerance(act)
    say(f"  tolerance ({act}): atol {atol:g}, rtol {rtol:g} (Polygraphy elementwise)")
    graphs = list(meta["graphs"]) if not args.graphs else [g.strip() for g in args.graphs.split(",") if g.strip()]
    trt_ok, lib, trt_note = _tensorrt_available(args)
    if not trt_ok:
        say(f"  TensorRT: skipped ({trt_note})")
    sizes = _sizes(meta)
    passed = True
    for g in graphs:
        if g not in meta["graphs"]:
            raise md.MetadataError(f"--graphs: {g!r} is not in {outdir} (has {', '.join(meta['graphs'])})")
        info = meta["graphs"][g]
        plan = graph_plan(target, g)
        if plan.input_names != [t["name"] for t in info["inputs"]]:
            raise md.MetadataError(f"{g}: the sidecar's inputs do not match the model's graph; re-export")
        feed = example_feed(target, g, seed=args.seed, equal_lengths=bool(meta.get("interop")), **sizes)
        npfeed = _np_feed(feed)
        torch_out = {k: _to_np_out(v) for k, v in run_torch(plan, feed).items()}
        torch_results = RunResults()
        torch_results.add([torch_out], runner_name="pytorch")
        stem = "" if g == "prefill" else f"{g}_"
        onnx_path = outdir / info["file"]
        say(f"  {g} ({info['file']}): feed {stem}inputs.json, PyTorch outputs {stem}torch_outputs.json")
        save_json([npfeed], outdir / f"{stem}inputs.json")
        save_json(torch_results, outdir / f"{stem}torch_outputs.json")
        try:
            ort = OnnxrtRunner(SessionFromOnnx(str(onnx_path)), name="onnxruntime")
            with ort:
                ort_out = ort.infer(npfeed)
        except Exception as e:  # noqa: BLE001
            hint = (" (onnxruntime's CPU provider lacks bfloat16 kernels: check bf16 exports with TensorRT)"
                    if meta["precision"] == "bf16" else "")
            raise CheckFailure(f"onnxruntime could not run {onnx_path}: {str(e).strip().splitlines()[0]}{hint}") from e
        ort_results = RunResults()
        ort_results.add([{k: np.asarray(v) for k, v in ort_out.items()}], runner_name="onnxruntime")
        say("   onnxruntime vs pytorch")
        both = RunResults()
        both.extend(torch_results)
        both.extend(ort_results)
        passed &= _compare(both, atol, rtol, plan.output_names, say)
        if trt_ok:
            say("   tensorrt vs onnxruntime")
            prof = {k: v for k, v in meta["profiles"][g].items()}
            try:
                trt = _trt_runner(onnx_path, lib, prof, meta["precision"])
                with trt:
                    trt_out = trt.infer(npfeed)
            except Exception as e:  # noqa: BLE001
                raise CheckFailure(f"TensorRT could not run {onnx_path}: {str(e).strip().splitlines()[0]}") from e
            trt_results = RunResults()
            trt_results.add([{k: np.asarray(v) for k, v in trt_out.items()}], runner_name="tensorrt")
            pair = RunResults()
            pair.extend(ort_results)
            pair.extend(trt_results)
            passed &= _compare(pair, atol, rtol, plan.output_names, say)
    return passed


def _to_np_out(t):
    import torch
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _tensorrt_available(args) -> tuple[bool, Path | None, str]:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False, None, "the tensorrt Python module is not installed"
    lib = Path(args.plugins) if args.plugins else None
    if lib is None:
        try:
            from ..plugins import find_plugin_library
            lib = find_plugin_library()
        except ImportError:
            lib = None
    if lib is None or not Path(lib).is_file():
        return False, None, "the gdn TensorRT plugin library was not found; build it (gdn-build) or pass --plugins"
    return True, Path(lib), ""


def _export_dirs(target: str) -> list[Path]:
    from . import metadata as md
    p = Path(target)
    if md.find_sidecar(p) is not None:
        return [p if p.is_dir() else p.parent]
    if p.is_dir():
        subs = sorted(d for d in p.iterdir() if d.is_dir() and (d / md.SIDECAR_NAME).is_file())
        if subs:
            return subs
    return []


def run(args: argparse.Namespace) -> int:
    from polygraphy.logger import G_LOGGER
    G_LOGGER.module_severity = G_LOGGER.ERROR     # our own report; Polygraphy's INFO lines are noise here
    say = lambda s: print(s, flush=True)  # noqa: E731
    dirs = _export_dirs(args.target)
    tmp = None
    if not dirs:  # a MODEL: export it first
        from .cli import _parse_graphs
        from .model_export import ExportOptions, export_model, load_targets
        root = Path(args.output) if args.output else Path(tmp := tempfile.mkdtemp(prefix="gdn_check_"))
        targets = load_targets(args.target, layer=args.layer, allow_pickle=args.allow_pickle)
        graphs = _parse_graphs(args.graphs or "prefill,decode")
        for t in targets:
            d = root / f"layer_{t.source['layer']}" if len(targets) > 1 else root
            say(f"exporting {args.target} -> {d}")
            export_model(t, d, ExportOptions(precision=args.precision, graphs=graphs, verify=False))
            dirs.append(d)
    ok = all([check_folder(d, args, say) for d in dirs])
    say(f"gdn-check: {'PASS' if ok else 'FAIL'}" + (f" (files in {tmp})" if tmp else ""))
    return EXIT_OK if ok else EXIT_MISMATCH


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except Exception as e:  # noqa: BLE001
        from .metadata import MetadataError
        from .model_export import ExportError
        if os.environ.get("GDN_DEBUG") == "1":
            traceback.print_exc()
        if isinstance(e, ExportError):
            code = e.exit_code
        elif isinstance(e, MetadataError):
            code = EXIT_USAGE
        elif isinstance(e, CheckFailure):
            code = e.exit_code
        else:
            code = EXIT_EXPORT
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"gdn-check: error: {msg}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
