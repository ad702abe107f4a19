"""``gdn-build``: TensorRT engines from a ``gdn-export`` folder, with the gdn plugins.

Reads ``EXPORT_DIR/gdn_model.json`` (graphs and optimisation profiles), registers the gdn plugins in
TensorRT's plugin registry once per process (:func:`gdn_deploy.plugins.load_gdn_plugins`), parses each
graph's TensorRT-ready ONNX (``graphs.<g>.tensorrt_file``, e.g. ``prefill.trt.onnx``; for folders without
one the ONNX file prepared in memory by :func:`gdn_deploy.plugins.prepare_onnx_for_tensorrt`) with the
TensorRT ONNX parser, applies the profiles and writes ``<graph>.engine`` plus ``gdn_engines.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import EXIT_CODES_HELP, ExitCode, GdnError
from ..export.metadata import MetadataError, read_metadata
from ..onnx_nodes import write_tensorrt_onnx
from . import PLUGIN_LIB_ENV, find_plugin_library, plugin_library_candidates, prepare_onnx_for_tensorrt
from .loader import PluginLoadError, load_gdn_plugins

__all__ = ["main", "BuildError", "GraphJob", "load_jobs", "import_tensorrt", "MIN_TRT_VERSION",
           "EXIT_OK", "EXIT_USAGE", "EXIT_PLUGIN", "EXIT_PARSE", "EXIT_BUILD", "EXIT_NO_TENSORRT"]

SIDECAR = "gdn_model.json"
MIN_TRT_VERSION = (10, 3)   # IPluginV3OneBuildV2 (getAliasedInput) and the aliased plugin I/O preview feature
# the one exit-code table of every gdn-deploy command (gdn_deploy.errors)
EXIT_OK, EXIT_USAGE, EXIT_PLUGIN = ExitCode.OK, ExitCode.USAGE, ExitCode.PLUGIN
EXIT_PARSE = EXIT_BUILD = ExitCode.TENSORRT
EXIT_NO_TENSORRT = ExitCode.NO_TENSORRT
NO_TENSORRT_MESSAGE = (
    "TensorRT is not installed (the tensorrt Python module could not be imported); engines can be "
    "built on a machine with TensorRT >= {v} and a CUDA GPU (pip install tensorrt), or use --onnx-only to write "
    "TensorRT-ready ONNX files for trtexec --dynamicPlugins")


class BuildError(GdnError):
    """A failure with its exit code; the message is printed as one ``gdn-build: ...`` line."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = self.exit_code = code


Shapes = dict[str, tuple[list[int], list[int], list[int]]]


@dataclass
class GraphJob:
    name: str
    onnx_path: Path
    profiles: list[Shapes] = field(default_factory=list)   # one dict per optimisation profile
    trt_onnx_path: Path | None = None                       # the TensorRT-ready copy gdn-export wrote, if any

    @property
    def parse_path(self) -> Path:
        """The file TensorRT parses: the TensorRT-ready copy when there is one."""
        return self.trt_onnx_path or self.onnx_path


# ---------------------------------------------------------------- metadata
def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise BuildError(f"{where}: expected a list of ints, got {value!r}", ExitCode.LOAD)
    if any(d < 0 for d in value):
        raise BuildError(f"{where}: negative dimension in {value}", ExitCode.LOAD)
    return value


def _profile(raw: Any, where: str) -> Shapes:
    if not isinstance(raw, dict) or not raw:
        raise BuildError(f"{where}: expected an object mapping input names to {{min, opt, max}}", ExitCode.LOAD)
    out: Shapes = {}
    for name, levels in raw.items():
        w = f"{where}.{name}"
        if not isinstance(levels, dict) or not all(k in levels for k in ("min", "opt", "max")):
            raise BuildError(f"{w}: expected {{\"min\": [...], \"opt\": [...], \"max\": [...]}}, got {levels!r}", ExitCode.LOAD)
        mn, opt, mx = (_shape(levels[k], f"{w}.{k}") for k in ("min", "opt", "max"))
        if not len(mn) == len(opt) == len(mx):
            raise BuildError(f"{w}: min/opt/max have different ranks ({mn}, {opt}, {mx})", ExitCode.LOAD)
        if not all(a <= b <= c for a, b, c in zip(mn, opt, mx)):
            raise BuildError(f"{w}: needs min <= opt <= max in every dimension ({mn}, {opt}, {mx})", ExitCode.LOAD)
        out[name] = (mn, opt, mx)
    return out


def load_jobs(export_dir: str | Path, graphs: Sequence[str] | None = None) -> list[GraphJob]:
    """The graphs to build, from ``export_dir/gdn_model.json``; raises :class:`BuildError` on any problem."""
    d = Path(export_dir)
    if not d.is_dir():
        raise BuildError(f"{d}: not a directory (expected a gdn-export output folder)")
    meta_path = d / SIDECAR
    try:
        meta = read_metadata(d)          # the one reader of the sidecar (format, version, required keys)
    except MetadataError as e:
        raise BuildError(str(e), e.exit_code) from None
    if "files" in meta:                  # gdn-export's folders: sizes, sidecar checksum, graph I/O (hand-made: none)
        from ..errors import LoadError
        from ..export.integrity import verify_folder
        try:
            verify_folder(d, meta, graphs=[g for g in graphs or meta["graphs"] if g in meta["graphs"]])
        except LoadError as e:
            raise BuildError(str(e), ExitCode.LOAD) from None
    gmap = meta.get("graphs")
    if not isinstance(gmap, dict) or not gmap:
        raise BuildError(f"{meta_path}: missing or empty 'graphs' (expected {{\"prefill\": {{\"file\": ...}}, ...}})",
                         ExitCode.LOAD)
    profiles = meta.get("profiles", {})
    if not isinstance(profiles, dict):
        raise BuildError(f"{meta_path}: 'profiles' must be an object keyed by graph name", ExitCode.LOAD)
    names = list(gmap) if not graphs else list(graphs)
    unknown = [g for g in names if g not in gmap]
    if unknown:
        raise BuildError(f"{meta_path}: no graph {', '.join(map(repr, unknown))} (available: {', '.join(gmap)})")
    jobs = []
    for g in names:
        info = gmap[g]
        if not isinstance(info, dict) or not isinstance(info.get("file"), str) or not info["file"]:
            raise BuildError(f"{meta_path}: graphs.{g} needs a 'file' (the ONNX file name)", ExitCode.LOAD)
        path = d / info["file"]
        if not path.is_file():
            raise BuildError(f"{meta_path}: graphs.{g}.file: {path} does not exist", ExitCode.LOAD)
        trt_path = None
        if info.get("tensorrt_file"):
            trt_path = d / str(info["tensorrt_file"])
            if not trt_path.is_file():
                raise BuildError(f"{meta_path}: graphs.{g}.tensorrt_file: {trt_path} does not exist; re-export, or "
                                 "write it with gdn-build EXPORT_DIR --onnx-only", ExitCode.LOAD)
        raw = profiles.get(g)
        plist = [] if raw is None else ([raw] if isinstance(raw, dict) else raw)
        if not isinstance(plist, list):
            raise BuildError(f"{meta_path}: profiles.{g} must be an object or a list of objects", ExitCode.LOAD)
        jobs.append(GraphJob(g, path, [_profile(p, f"profiles.{g}" + (f"[{i}]" if len(plist) > 1 else ""))
                                       for i, p in enumerate(plist)], trt_path))
    return jobs


# ---------------------------------------------------------------- TensorRT
def import_tensorrt():
    """The tensorrt module; :class:`BuildError` with exit code 6 when it cannot be imported."""
    try:
        import tensorrt as trt  # noqa: PLC0415
    except Exception:  # ImportError, or a broken install failing to load its libraries
        raise BuildError(NO_TENSORRT_MESSAGE.format(v=".".join(map(str, MIN_TRT_VERSION))),
                         EXIT_NO_TENSORRT) from None
    return trt


def _trt_version(trt) -> tuple[int, ...]:
    out = []
    for part in str(getattr(trt, "__version__", "0")).split(".")[:2]:
        out.append(int("".join(c for c in part if c.isdigit()) or 0))
    return tuple(out)


def load_plugins(trt, lib: Path, say: Callable[[str], None]) -> None:
    """Register every gdn creator (prefill, decode, verify, commit) in TensorRT's registry (once per process: a second call loads nothing)."""
    try:
        say(load_gdn_plugins(trt, lib))
    except PluginLoadError as e:
        raise BuildError(str(e), EXIT_PLUGIN) from None


def _prepared_model(job: GraphJob):
    """The model TensorRT parses; preparing it is a no-op for a TensorRT-ready file."""
    import onnx  # noqa: PLC0415
    try:
        model = onnx.load(str(job.parse_path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError etc.
        raise BuildError(f"{job.parse_path}: not a readable ONNX model ({e})", EXIT_PARSE) from None
    return model, prepare_onnx_for_tensorrt(model)


def build_engine(trt, job: GraphJob, out_dir: Path, args: argparse.Namespace, logger, say) -> Path:
    model, stats = _prepared_model(job)
    say(f"{job.name}: parsing {job.parse_path.name} ({len(model.graph.node)} nodes, {stats['nodes']} gdn plugin nodes)")
    builder = trt.Builder(logger)
    flags = 0
    reduced = args.fp16 or args.bf16
    ntf = trt.NetworkDefinitionCreationFlag
    if not reduced and hasattr(ntf, "STRONGLY_TYPED"):
        flags |= 1 << int(ntf.STRONGLY_TYPED)
    network = builder.create_network(flags)
    # The gdn nodes carry plugin_namespace, so no parser flag is needed (ENABLE_PLUGIN_OVERRIDE would also let
    # plugins of the same name replace standard ONNX ops).
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString(), str(job.parse_path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)) or "no details"
        raise BuildError(f"{job.name}: the TensorRT ONNX parser failed on {job.parse_path}: {errs}", EXIT_PARSE)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(args.workspace_gb * (1 << 30)))
    alias = getattr(getattr(trt, "PreviewFeature", None), "ALIASED_PLUGIN_IO_10_03", None)
    if alias is not None:
        config.set_preview_feature(alias, True)   # decode pool updated in place (getAliasedInput)
    if reduced:
        flag = getattr(trt.BuilderFlag, "FP16" if args.fp16 else "BF16", None)
        if flag is None:
            say(f"{job.name}: note: this TensorRT has only strongly typed networks; --fp16/--bf16 ignored, "
                "the precision is the ONNX model's")
        else:
            config.set_flag(flag)
    inputs = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
    dynamic = sorted(n for n, s in inputs.items() if any(d < 0 for d in s))
    for k, shapes in enumerate(job.profiles or ([{}] if dynamic else [])):
        extra = sorted(set(shapes) - set(inputs))
        if extra:
            raise BuildError(f"{job.name}: profile {k} names {', '.join(extra)}, which the network does not have "
                             f"(inputs: {', '.join(inputs)})")
        uncovered = [n for n in dynamic if n not in shapes]
        if uncovered:
            raise BuildError(f"{job.name}: input(s) {', '.join(uncovered)} have dynamic shapes but "
                             f"{SIDECAR} profiles.{job.name} gives no min/opt/max for them")
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in shapes.items():
            if len(mn) != len(inputs[name]):
                raise BuildError(f"{job.name}: profile for {name} has rank {len(mn)}, the input is {inputs[name]}")
            profile.set_shape(name, mn, opt, mx)
        config.add_optimization_profile(profile)
    say(f"{job.name}: building ({len(job.profiles)} profile(s), workspace {args.workspace_gb:g} GiB"
        + (", fp16" if args.fp16 else ", bf16" if args.bf16 else ", strongly typed") + ") ...")
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildError(f"{job.name}: TensorRT could not build the engine (see the TensorRT log above)", EXIT_BUILD)
    path = out_dir / f"{job.name}.engine"
    with open(path, "wb") as f:
        f.write(serialized)
    say(f"{job.name}: wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - t0:.1f} s)")
    return path


def write_trt_onnx(job: GraphJob, say) -> Path:
    """Write the TensorRT-ready ``<stem>.trt.onnx`` beside the original (external data stays valid)."""
    try:
        path = write_tensorrt_onnx(job.onnx_path)
    except ValueError as e:
        raise BuildError(f"{job.onnx_path}: {e}", ExitCode.LOAD) from None
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError etc.
        raise BuildError(f"{job.onnx_path}: not a readable ONNX model ({e})", ExitCode.LOAD) from None
    if path is None:
        raise BuildError(f"{job.onnx_path}: has no gdn nodes (an --interop export?); nothing for the plugins",
                         ExitCode.LOAD)
    say(f"{job.name}: wrote {path} (gdn nodes -> plugins, onnxruntime function bodies removed)")
    job.trt_onnx_path = path
    return path


def _record_trt_files(export_dir: Path, jobs: Sequence[GraphJob], say) -> None:
    """Name the written copies in the sidecar (graphs.<g>.tensorrt_file), as gdn-export does."""
    path = export_dir / SIDECAR
    meta = json.loads(path.read_text())
    changed = False
    for job in jobs:
        name = job.trt_onnx_path.name if job.trt_onnx_path else None
        if name and meta["graphs"][job.name].get("tensorrt_file") != name:
            meta["graphs"][job.name]["tensorrt_file"] = name
            changed = True
    if changed and "files" in meta:      # gdn-export's folders: the file list and checksum follow the change
        from ..export.metadata import write_metadata
        write_metadata(export_dir, meta)
    elif changed:
        path.write_text(json.dumps(meta, indent=2) + "\n")
        say(f"recorded the TensorRT-ready files in {path}")


# ---------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    from ..cli_util import OneLineParser  # one-line usage errors, exit 2
    p = OneLineParser(
        prog="gdn-build",
        description="Build TensorRT engines (<graph>.engine) from a gdn-export folder, using the gdn TensorRT "
                    "plugins (GatedDeltaPrefill / GatedDeltaDecode, namespace gdn).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"plugin library: --plugin-lib, else ${PLUGIN_LIB_ENV}, else build/plugins_cpp/libgdn_trt_plugins.so\n"
               "(registered once per process: calling gdn-build again in the same process loads nothing);\n"
               f"needs TensorRT >= {'.'.join(map(str, MIN_TRT_VERSION))}.\n\n" + EXIT_CODES_HELP)
    p.add_argument("export_dir", metavar="EXPORT_DIR", help="folder written by gdn-export (has gdn_model.json)")
    p.add_argument("--graphs", default=None, help="comma-separated graph names to build (default: all in the metadata)")
    p.add_argument("--plugin-lib", type=Path, default=None,
                   help="path of libgdn_trt_plugins.so (or libgdn_trt_plugins_autoreg.so)")
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--fp16", action="store_true",
                      help="weakly typed build allowing fp16 (TensorRT 10 only; default: strongly typed, the ONNX dtypes)")
    prec.add_argument("--bf16", action="store_true", help="like --fp16 with bf16")
    p.add_argument("--workspace-gb", type=float, default=4.0, help="builder workspace limit in GiB (default 4)")
    p.add_argument("-o", "--output-dir", type=Path, default=None, help="where engines go (default: EXPORT_DIR)")
    p.add_argument("--write-onnx", action="store_true",
                   help="also (re)write <graph>.trt.onnx (TensorRT-ready: gdn nodes -> plugins, no onnxruntime "
                        "bodies) beside each ONNX file; gdn-export already writes them")
    p.add_argument("--onnx-only", action="store_true",
                   help="only (re)write the <graph>.trt.onnx files (no TensorRT needed), e.g. for an export folder "
                        "made before gdn-export wrote them")
    p.add_argument("-v", "--verbose", action="store_true", help="TensorRT INFO log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import run_cli
    return run_cli("gdn-build", lambda: _main(argv), command=argv is None)


def _main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def say(msg: str) -> None:
        print(f"gdn-build: {msg}", flush=True)

    try:
        if args.workspace_gb <= 0:
            raise BuildError(f"--workspace-gb must be > 0, got {args.workspace_gb}")
        graphs = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else None
        jobs = load_jobs(args.export_dir, graphs)
        if args.write_onnx or args.onnx_only:
            for job in jobs:
                write_trt_onnx(job, say)
            _record_trt_files(Path(args.export_dir), jobs, say)
            if args.onnx_only:
                return EXIT_OK
        trt = import_tensorrt()
        if _trt_version(trt) < MIN_TRT_VERSION:
            raise BuildError(f"TensorRT {trt.__version__} is too old: the gdn plugins need TensorRT >= "
                             f"{'.'.join(map(str, MIN_TRT_VERSION))} (IPluginV3OneBuildV2)", EXIT_NO_TENSORRT)
        lib = args.plugin_lib or find_plugin_library()
        if lib is None or not Path(lib).is_file():
            looked = [str(args.plugin_lib)] if args.plugin_lib else [str(c) for c in plugin_library_candidates()]
            raise BuildError("plugin library not found (looked at: " + ", ".join(looked) + "); build it with "
                             "`cmake -S . -B build -DTensorRT_ROOT=... && cmake --build build` or pass --plugin-lib",
                             EXIT_PLUGIN)
        logger = trt.Logger(trt.Logger.INFO if args.verbose else trt.Logger.WARNING)
        load_plugins(trt, Path(lib), say)
        out_dir = args.output_dir or Path(args.export_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        engines = {}
        for job in jobs:
            path = build_engine(trt, job, out_dir, args, logger, say)
            engines[job.name] = {"file": path.name, "onnx": str(job.parse_path),
                                 "profiles": [{n: {"min": s[0], "opt": s[1], "max": s[2]} for n, s in p.items()}
                                              for p in job.profiles]}
        summary = out_dir / "gdn_engines.json"
        summary.write_text(json.dumps({"tensorrt_version": str(trt.__version__), "plugin_library": str(lib),
                                       "engines": engines}, indent=2) + "\n")
        say(f"done: {len(engines)} engine(s), summary in {summary}")
        return EXIT_OK
    except BuildError as e:
        print(f"gdn-build: {e}", file=sys.stderr, flush=True)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
