"""Run a graph in PyTorch or onnxruntime on torch tensors, and compare outputs with the spec's tolerances.

- :func:`run_torch`        a :class:`~gdn_deploy.export.graphs.GraphPlan`'s module on a feed -> ``{name: tensor}``
- :func:`run_onnxruntime`  an ONNX file / ModelProto / session on a feed -> ``{name: tensor}`` (bfloat16 I/O too)
- :func:`compare_outputs`  per-output errors and the verdict of ``SPEC.check_tolerance``
- :func:`to_numpy`         a torch tensor as numpy (bfloat16 as ``ml_dtypes.bfloat16``)
- :func:`session_settings` the providers and disabled optimisers our files need in onnxruntime
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import torch
from torch import Tensor

__all__ = ["run_torch", "run_onnxruntime", "onnxruntime_session", "session_settings", "compare_outputs", "to_numpy",
           "from_numpy"]

# onnxruntime-gpu 1.31.1's CUDA provider (seen on an H100): with its ConstantFolding optimiser on, a session of a
# file with the chunked gdn body fails at run time ("ScatterElements ... Indices vs updates dimensions differs at
# position=0 1023 vs 1" at T=1024; a ScatterND form of the same scatter fails the same way); with it off, outputs
# match the float64 reference to 5e-7. The same nodes taken out of the function's If run with every optimiser on,
# so the fault is in that provider's folding inside the If (docs/onnx_bodies.md). TF32 off: fp32 MatMuls in fp32,
# as the spec's fp32 tolerance assumes.
CUDA_DISABLED_OPTIMIZERS = ("ConstantFolding",)
CUDA_PROVIDER_OPTIONS = {"use_tf32": "0"}


def run_torch(plan, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Run ``plan.module`` on ``feed`` (ordered by ``plan.input_names``); outputs by ``plan.output_names``."""
    with torch.no_grad():
        outs = plan.module(*[feed[n] for n in plan.input_names])
    return dict(zip(plan.output_names, outs))


def to_numpy(t: Tensor) -> np.ndarray:
    """A CPU tensor as numpy; bfloat16 becomes ``ml_dtypes.bfloat16`` (onnx and onnxruntime depend on it)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16")
        return t.view(torch.int16).numpy().view(np.dtype("bfloat16"))
    return t.numpy()


def from_numpy(a: Any) -> Tensor:
    """numpy (bfloat16 included) -> torch tensor."""
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def provider_names(providers: Sequence) -> list[str]:
    """The execution providers' names of ``providers`` (names, or (name, options) pairs), in order."""
    return [p if isinstance(p, str) else p[0] for p in providers]


def session_settings(providers: Sequence[str]) -> dict[str, Any]:
    """``InferenceSession`` keyword arguments for ``providers`` (names, or (name, options) pairs): with the CUDA
    provider, its options (CUDA_PROVIDER_OPTIONS under the caller's, e.g. ``("CUDAExecutionProvider",
    {"arena_extend_strategy": "kSameAsRequested"})``) and the optimisers our files need off there (see
    CUDA_DISABLED_OPTIMIZERS); nothing extra otherwise."""
    names = provider_names(providers)
    if "CUDAExecutionProvider" not in names:
        return {"providers": list(providers)}
    provs = [("CUDAExecutionProvider", {**CUDA_PROVIDER_OPTIONS, **(dict(p[1]) if not isinstance(p, str) else {})})
             if n == "CUDAExecutionProvider" else p for n, p in zip(names, providers)]
    return {"providers": provs, "disabled_optimizers": list(CUDA_DISABLED_OPTIMIZERS)}


def session_options():
    """onnxruntime ``SessionOptions`` the package's sessions start from: nodes run in the file's order where the
    graph allows (``ExecutionOrder.PRIORITY_BASED``, Kahn by node index), so that each layer's per-token
    temporaries are freed inside the layer (export/onnx_schedule.py; the default walk may run side chains late)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return options


def onnxruntime_session(model, providers: Sequence[str] = ("CPUExecutionProvider",), options=None,
                        disabled_optimizers: Sequence[str] = ()):
    """An onnxruntime session of a path or ModelProto (a session is returned as it is); ``options`` default to
    :func:`session_options`; ``disabled_optimizers``: onnxruntime graph optimizers left out (by name)."""
    import onnxruntime as ort
    if isinstance(model, ort.InferenceSession):
        return model
    if options is None:
        options = session_options()
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    settings = session_settings(providers)
    if disabled_optimizers:                   # beside the CUDA provider's own (session_settings)
        settings["disabled_optimizers"] = list(dict.fromkeys([*settings.get("disabled_optimizers", []),
                                                              *disabled_optimizers]))
    return ort.InferenceSession(src, options, **settings)


def run_onnxruntime(model, inputs: Mapping[str, Tensor] | Sequence[Tensor],
                    providers: Sequence[str] = ("CPUExecutionProvider",)) -> dict[str, Tensor]:
    """Run an ONNX model (path, ModelProto or InferenceSession) in onnxruntime on torch tensors.

    ``inputs`` is a dict by input name or a sequence in the session's input order. Tensors go through
    ``OrtValue``s, so bfloat16 inputs and outputs work (onnxruntime's numpy interface has no bfloat16).
    Returns CPU tensors by output name, in the session's output order.
    """
    import onnxruntime as ort
    sess = onnxruntime_session(model, providers)
    binding, keep = sess.io_binding(), []
    if not isinstance(inputs, Mapping):
        inputs = dict(zip([i.name for i in sess.get_inputs()], inputs, strict=True))
    for name, t in inputs.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            ov = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.view(torch.int16).numpy().view(np.uint16),
                                                                 onnx.TensorProto.BFLOAT16)
        else:
            ov = ort.OrtValue.ortvalue_from_numpy(t.numpy())
        keep.append(ov)
        binding.bind_ortvalue_input(name, ov)
    names = [o.name for o in sess.get_outputs()]
    for name in names:
        binding.bind_output(name, "cpu")
    sess.run_with_iobinding(binding)
    results = {}
    for name, ov in zip(names, binding.get_outputs()):
        if ov.data_type() == "tensor(bfloat16)":
            t = torch.empty(ov.shape(), dtype=torch.bfloat16)
            if t.numel():
                ctypes.memmove(t.data_ptr(), ov.data_ptr(), t.numel() * t.element_size())
        else:
            t = torch.from_numpy(np.array(ov.numpy(), copy=True))
        results[name] = t
    return results


def compare_outputs(ref: Mapping[str, Any], got: Mapping[str, Any], tol: Mapping[str, float]) -> list[dict[str, Any]]:
    """Per output of ``ref``: errors of ``got`` and the verdict of ``tol`` (``SPEC.check_tolerance``).

    An output passes when it is finite, every element has ``|a-b| <= atol + rtol*|b|`` and
    ``||a-b|| / ||b|| <= rel``. Rows: ``{name, ok, max_abs, mean_abs, max_rel, rel, atol, rtol, rel_tol[, why]}``.
    """
    rows = []
    atol, rtol, rel_tol = float(tol["atol"]), float(tol["rtol"]), float(tol["rel"])
    for name, b in ref.items():
        if name not in got:
            rows.append({"name": name, "ok": False, "why": "missing output"})
            continue
        a64 = np.asarray(to_numpy(got[name]) if isinstance(got[name], Tensor) else got[name], dtype=np.float64)
        b64 = np.asarray(to_numpy(b) if isinstance(b, Tensor) else b, dtype=np.float64)
        if a64.shape != b64.shape:
            rows.append({"name": name, "ok": False, "why": f"shape {a64.shape} != {b64.shape}"})
            continue
        d = np.abs(a64 - b64)
        finite = bool(np.isfinite(a64).all())
        nb = float(np.linalg.norm(b64))
        rel = float(np.linalg.norm(a64 - b64) / nb) if nb else (0.0 if not d.any() else float("inf"))
        elementwise = bool((d <= atol + rtol * np.abs(b64)).all())
        ok = finite and elementwise and rel <= rel_tol
        row = {"name": name, "ok": ok, "max_abs": float(d.max()) if d.size else 0.0,
               "mean_abs": float(d.mean()) if d.size else 0.0,
               "max_rel": float((d / np.maximum(np.abs(b64), 1e-12)).max()) if d.size else 0.0,
               "rel": rel, "atol": atol, "rtol": rtol, "rel_tol": rel_tol}
        if not finite:
            row["why"] = "non-finite values"
        elif not elementwise:
            row["why"] = f"elementwise |a-b| > {atol:g} + {rtol:g}|b|"
        elif rel > rel_tol:
            row["why"] = f"norm-relative error {rel:.2e} > {rel_tol:g}"
        rows.append(row)
    return rows
