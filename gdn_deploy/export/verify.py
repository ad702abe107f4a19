"""Reference inputs and outputs of an export folder, and the one check gdn-export and gdn-check both run.

For every graph, ``gdn-export`` writes a small ragged random feed ``<graph>_inputs.json`` and the outputs
of the same model in **float32** PyTorch on it, ``<graph>_reference.json`` (Polygraphy's JSON formats,
so ``polygraphy run <graph>.onnx --onnxrt --load-inputs ... --load-outputs ...`` works on the folder).
The weights of the reference are the exported ones (rounded to the export precision) computed in float32,
so a check measures the runtime's arithmetic, not the rounding of the weights. The sidecar names the
files and the tolerance (``SPEC.check_tolerance`` of the export precision).

:func:`check_folder` runs a graph in onnxruntime on the stored feed and compares it with the stored
reference (:func:`~gdn_deploy.export.runtimes.compare_outputs`): the same inputs, the same reference
and the same verdict wherever it runs, and no need for the original model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import LoadError, RunFailure, first_line, missing_kernel
from ..spec import SPEC
from .graphs import example_feed, graph_plan
from .runtimes import compare_outputs, from_numpy, run_onnxruntime, run_torch, to_numpy
from .targets import ExportTarget, cast_target

__all__ = ["REFERENCE_SIZES", "reference_files", "reference_feed", "reference_outputs", "write_reference",
           "load_reference", "check_folder", "GraphCheck"]

REFERENCE_SIZES = {"tokens": 9, "seqs": 2, "batch": 3, "pool": 4}   # ragged prefill, a skipped pool slot


def reference_files(graph: str) -> tuple[str, str]:
    return f"{graph}_inputs.json", f"{graph}_reference.json"


def reference_feed(target: ExportTarget, graph: str, *, seed: int = 1, interop: str | None = None,
                   sizes: Mapping[str, int] | None = None) -> dict[str, Tensor]:
    """The feed a check uses: small, ragged (equal lengths for interop exports), model-dtype activations."""
    s = {**REFERENCE_SIZES, **(sizes or {})}
    return example_feed(target, graph, seed=seed, equal_lengths=bool(interop), **s)


def reference_outputs(target: ExportTarget, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Outputs of ``target`` (already in the export precision) computed in float32 on ``feed``."""
    ref = cast_target(target, "fp32")
    plan = graph_plan(ref, graph)
    f32 = {k: (v.float() if v.is_floating_point() else v) for k, v in feed.items()}
    return {k: v.float() for k, v in run_torch(plan, f32).items()}


def write_reference(outdir: Path, graph: str, feed: Mapping[str, Tensor], ref: Mapping[str, Tensor]) -> dict:
    """Save feed and reference in Polygraphy's formats; returns the sidecar's ``check`` entry (without tolerance).

    bfloat16 inputs are stored as float32 (Polygraphy's JSON has no bfloat16); :func:`load_reference`
    casts them back using the sidecar's input dtypes."""
    from polygraphy.comparator import RunResults
    from polygraphy.json import save_json
    inputs, reference = reference_files(graph)
    save_json([{k: to_numpy(v.float() if v.dtype == torch.bfloat16 else v) for k, v in feed.items()}],
              outdir / inputs)
    results = RunResults()
    results.add([{k: to_numpy(v) for k, v in ref.items()}], runner_name="pytorch-float32")
    save_json(results, outdir / reference)
    return {"inputs": inputs, "reference": reference, "reference_dtype": "float32"}


def load_reference(outdir: Path, graph: str, info: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The stored feed (as torch tensors in the graph's input dtypes) and reference outputs (numpy) of a graph."""
    from polygraphy.json import load_json
    check = info.get("check") or {}
    names = [check.get("inputs"), check.get("reference")]
    missing = [n for n in names if not n or not (outdir / n).is_file()]
    if missing:
        raise LoadError(f"{outdir}: the reference files of graph {graph!r} are missing ({', '.join(map(str, missing))});"
                        " re-export the model with gdn-export, or run gdn-check with --from-model")
    try:
        feed_np = load_json(outdir / check["inputs"])[0]
        results = load_json(outdir / check["reference"])
        ref = dict(results[0][1][0])
    except Exception as e:  # noqa: BLE001  (Polygraphy raises several kinds on a bad file)
        raise LoadError(f"{outdir}: the reference files of graph {graph!r} are unreadable: {first_line(e)}") from None
    dtypes = {t["name"]: t["dtype"] for t in info["inputs"]}
    feed = {}
    for k, v in feed_np.items():
        t = from_numpy(v)
        if dtypes.get(k) == "bfloat16":
            t = t.to(torch.bfloat16)
        feed[k] = t
    return feed, ref


class GraphCheck:
    """Outcome of one graph's check: per-output rows, or why it was skipped."""

    def __init__(self, graph: str, runtime: str, rows: list[dict[str, Any]], skipped: str = ""):
        self.graph, self.runtime, self.rows, self.skipped = graph, runtime, rows, skipped

    @property
    def ok(self) -> bool:
        """No output differs (a skipped check has none: see :attr:`checked`)."""
        return bool(self.skipped) or all(r["ok"] for r in self.rows)

    @property
    def checked(self) -> bool:
        return not self.skipped


def _say_rows(check: GraphCheck, say: Callable[[str], None]) -> None:
    if check.skipped:
        say(f"    skipped: {check.skipped}")
        return
    for r in check.rows:
        if "max_abs" not in r:
            say(f"    {r['name']:<24} {r['why']}  FAIL")
            continue
        verdict = "PASS" if r["ok"] else f"FAIL ({r['why']})"
        say(f"    {r['name']:<24} max abs {r['max_abs']:9.2e}  mean abs {r['mean_abs']:9.2e}  "
            f"max rel {r['max_rel']:9.2e}  norm rel {r['rel']:9.2e}  {verdict}")


def check_folder(outdir: str | Path, meta: Mapping[str, Any], graphs: Sequence[str] | None = None, *,
                 say: Callable[[str], None] = lambda s: None,
                 extra_runtimes: Mapping[str, Callable[[str, Path, dict], dict]] | None = None,
                 onnxruntime_run: Callable[[str, Path, dict], dict] | None = None,
                 onnxruntime_note: str = "") -> list[GraphCheck]:
    """Run each graph of an export folder in onnxruntime (and ``extra_runtimes``, e.g. TensorRT) on its stored
    feed and compare with its stored float32 reference. ``extra_runtimes``: name -> fn(graph, onnx_path, feed)
    returning outputs by name; ``onnxruntime_run`` (same signature, with ``onnxruntime_note`` said beside it)
    replaces the CPU provider's run, e.g. by the CUDA provider's. Returns one :class:`GraphCheck` per graph and
    runtime."""
    outdir = Path(outdir)
    precision_dtype = meta["dtypes"]["activations"]
    tol = SPEC.check_tolerance(precision_dtype)
    out: list[GraphCheck] = []
    for g in graphs or list(meta["graphs"]):
        info = meta["graphs"][g]
        feed, ref = load_reference(outdir, g, info)
        path = outdir / info["file"]
        say(f"  {g} ({info['file']}): inputs {info['check']['inputs']}, float32 reference {info['check']['reference']}")
        ort_run, ort_note = lambda graph, p, f: run_onnxruntime(p, f), ""
        if onnxruntime_run is not None:
            ort_run, ort_note = onnxruntime_run, onnxruntime_note
        elif precision_dtype == "bfloat16":      # onnxruntime's CPU provider has no bf16 arithmetic kernels
            from .bf16_cpu import cpu_session
            ort_run = lambda graph, p, f: run_onnxruntime(cpu_session(p, fold_weights=False), f)  # noqa: E731
            ort_note = " [bf16 weights and I/O, float32 arithmetic: see gdn_deploy/export/bf16_cpu.py]"
        runtimes = {"onnxruntime": ort_run, **(extra_runtimes or {})}
        for name, run in runtimes.items():
            say(f"   {name} vs PyTorch float32 (atol {tol['atol']:g}, rtol {tol['rtol']:g}, norm rel {tol['rel']:g})"
                + (ort_note if name == "onnxruntime" else ""))
            try:
                got = run(g, path, feed)
            except Exception as e:  # noqa: BLE001
                missing = missing_kernel(str(e))
                if name == "onnxruntime" and precision_dtype != "float32" and missing is not None:
                    where, other = ("CPU provider", "") if onnxruntime_run is None else ("provider", " or --device cpu")
                    c = GraphCheck(g, name, [], f"onnxruntime's {where} lacks a {precision_dtype} kernel of "
                                   f"this graph ({missing}); check it with gdn-check on a TensorRT machine{other}")
                    _say_rows(c, say)
                    out.append(c)
                    continue
                raise RunFailure(f"{name} could not run {path}: {first_line(e)}") from e
            c = GraphCheck(g, name, compare_outputs(ref, got, tol))
            _say_rows(c, say)
            out.append(c)
    return out

