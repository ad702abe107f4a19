"""Backends that run an export folder's graphs on torch tensors: ``run(graph, feed) -> {output name: tensor}``.

- ``torch``:       the model the folder was exported from (sidecar ``source``; its config hash must match), in the
                   export precision, through the same graph wrappers as the export (MoE layers routed), on a device;
- ``onnxruntime``: the ``<graph>.onnx`` files (gdn nodes run their function bodies);
- ``tensorrt``:    the ``<graph>.trt.onnx`` files (or ``<graph>.engine`` from gdn-build) with the gdn plugins.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from torch import Tensor

from ..errors import LoadError, PluginError, TensorRTMissing, UsageError, first_line, missing_kernel
from .folder import ExportFolder

__all__ = ["BACKENDS", "make_backend", "TorchBackend", "OnnxRuntimeBackend", "TensorRTBackend"]

BACKENDS = ("torch", "onnxruntime", "tensorrt")


class TorchBackend:
    name = "torch"

    def __init__(self, folder: ExportFolder, device: str = "cpu", allow_pickle: bool = False):
        from ..export.graphs import graph_plan
        from ..export.loading import load_targets
        from ..export.model_export import config_hash
        from ..export.targets import cast_target
        src = folder.meta.get("source", {})
        model = src.get("model")
        if not model:
            raise LoadError(f"{folder.path}: the sidecar does not say which model was exported (source.model)")
        if model != "default" and not Path(model).is_absolute():
            model = str((folder.path / model).resolve())
        if model != "default" and not Path(model).exists():
            raise LoadError(f"{folder.path}: the torch backend runs the model the folder was exported from, {model}, "
                            "which does not exist here; use --backend onnxruntime or tensorrt")
        target = load_targets(model, layer=src.get("layer"), allow_pickle=allow_pickle)[0]
        target = cast_target(target, folder.meta["precision"])
        if folder.meta.get("config_hash") and folder.meta["config_hash"] != config_hash(target):
            raise LoadError(f"{folder.path}: was exported from another model than {model} (config hash differs); "
                            "re-export it")
        target.all_logits = folder.meta.get("generation", {}).get("prefill_logits") == "all"
        self.device = torch.device(device)
        self.plans = {}
        for g in ("prefill", "decode"):
            plan = graph_plan(target, g)
            if hasattr(plan.module, "moe_impl"):
                plan.module.moe_impl = "routed"
            if hasattr(plan.module, "attention"):
                plan.module.attention = "spans"
            plan.module.to(self.device)
            self.plans[g] = plan
        self.model = target.module

    def run(self, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        plan = self.plans[graph]
        with torch.no_grad():
            outs = plan.module(*[feed[n].to(self.device) for n in plan.input_names])
        return dict(zip(plan.output_names, outs))


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, folder: ExportFolder, providers=("CPUExecutionProvider",), threads: int | None = None,
                 bind_states: bool = True, attention_form: str | None = None, prefill_body: str | None = None):
        """``attention_form``: the form every graph's GroupQueryAttention loads in (:mod:`.ort_attention`:
        "exported", "host_total", "expanded"); default: as exported, rewritten on the CUDA provider.
        ``prefill_body``: the gdn prefill body ("exported", "linear_attention"); default: linear_attention on the
        CUDA provider (:func:`.ort_attention.default_prefill_body`)."""
        from ..export.runtimes import provider_names, session_options

        # onnxruntime's CPU provider has no bf16 arithmetic kernels: bf16 graphs run with float32 arithmetic there
        bf16_cpu = folder.meta.get("dtypes", {}).get("activations") == "bfloat16" and \
            set(providers) <= {"CPUExecutionProvider"}
        opts = session_options()
        if threads:
            opts.intra_op_num_threads, opts.inter_op_num_threads = int(threads), 1
        self.folder, self.providers, self.options, self.bf16_cpu = folder, providers, opts, bf16_cpu
        self.attention_form, self.prefill_body = attention_form, prefill_body
        self.forms: dict[str, str] = {}           # graph -> the attention form its session was loaded in
        self.prefill_bodies: dict[str, str] = {}  # graph -> the gdn prefill body its session was loaded with
        self.sessions = {}
        for g in ("prefill", "decode"):
            self._open(g)
        self.device = torch.device("cpu")
        # generation keeps the states on this device, bound in place where the graphs allow it (ort_binding.py)
        self.bind_states = bool(bind_states)
        self.in_place_graphs: dict[str, bool] = {}
        self.in_place_recurrent: dict[str, frozenset] = {}
        self.state_device = torch.device("cuda" if "CUDAExecutionProvider" in provider_names(providers) else "cpu")

    def _open(self, g: str):
        """The session of graph ``g`` (prefill and decode at start; others, e.g. verify, on first use)."""
        from .ort_attention import default_form, default_prefill_body, graph_session
        if g not in self.sessions:
            path = self.folder.graph_file(g)
            try:
                if self.bf16_cpu:
                    from ..export.bf16_cpu import cpu_session
                    self.sessions[g], self.forms[g] = cpu_session(path, self.options), "exported"
                    self.prefill_bodies[g] = "exported"
                else:
                    form = self.attention_form or default_form(self.providers, g)
                    body = self.prefill_body or default_prefill_body(self.providers)
                    self.sessions[g], self.forms[g], self.prefill_bodies[g] = graph_session(
                        path, self.providers, self.options, form, body)
            except Exception as e:  # noqa: BLE001  (onnxruntime raises its own error types on a bad file)
                raise LoadError(f"{path}: onnxruntime cannot load it: {missing_kernel(str(e)) or first_line(e)}") \
                    from None
        return self.sessions[g]

    def run(self, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        from ..export.runtimes import run_onnxruntime
        sess = self._open(graph)
        feed = self.graph_feed(graph, feed)
        return run_onnxruntime(sess, {i.name: feed[i.name].cpu() for i in sess.get_inputs()})

    def graph_feed(self, graph: str, feed: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        """``feed`` plus the inputs the session's attention form adds (host_total: the total sequence length,
        computed on the host)."""
        if self.forms.get(graph) != "host_total":
            return feed
        from .ort_attention import TOTAL_INPUT, host_total
        return {**feed, TOTAL_INPUT: host_total(feed)}


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self, folder: ExportFolder, plugin_lib: str | None = None):
        try:
            import tensorrt
        except ImportError:
            raise TensorRTMissing("the tensorrt Python module is not installed; use --backend onnxruntime or "
                                  "torch") from None
        from polygraphy.backend.trt import (BytesFromPath, CreateConfig, EngineFromBytes, EngineFromNetwork,
                                            NetworkFromOnnxPath, Profile, TrtRunner)

        from ..plugins import find_plugin_library
        from ..plugins.loader import PluginLoadError, load_gdn_plugins
        lib = Path(plugin_lib) if plugin_lib else find_plugin_library()
        if lib is None or not Path(lib).is_file():
            raise PluginError("the gdn TensorRT plugin library was not found: build it (scripts/build_kernels.sh "
                              "--all) or pass --plugins LIB")
        try:
            load_gdn_plugins(tensorrt, lib)
        except PluginLoadError as e:
            raise PluginError(str(e)) from None
        self.profiles = folder.meta["profiles"]
        self.runners = {}
        for g in ("prefill", "decode"):
            engine = folder.path / f"{g}.engine"
            if engine.is_file():
                loader = EngineFromBytes(BytesFromPath(str(engine)))
            else:
                prof = Profile()
                for name, s in self.profiles[g].items():
                    prof.add(name, min=s["min"], opt=s["opt"], max=s["max"])
                net = NetworkFromOnnxPath(str(folder.graph_file(g, tensorrt=True)), strongly_typed=True)
                loader = EngineFromNetwork(net, config=CreateConfig(profiles=[prof]))
            runner = TrtRunner(loader, name=f"tensorrt-{g}")
            runner.activate()
            self.runners[g] = runner
        self.device = torch.device("cpu")

    def run(self, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        from ..export.runtimes import from_numpy, to_numpy
        for name, t in feed.items():
            top = self.profiles[graph].get(name, {}).get("max")
            if top and any(int(d) > int(m) for d, m in zip(t.shape, top)):
                raise UsageError(f"tensorrt: {graph} input {name} has shape {list(t.shape)}, beyond the engine's "
                                 f"profile max {top}; re-export with larger --max-tokens/--max-seqs/--max-context")
        out = self.runners[graph].infer({k: to_numpy(v.cpu()) for k, v in feed.items()})
        return {k: from_numpy(v) for k, v in out.items()}


def onnxruntime_providers(device: str) -> tuple[str, ...]:
    """onnxruntime's execution providers for ``device`` ("cpu", "cuda"); UsageError (one line) when this
    onnxruntime has no CUDA provider."""
    dev = str(device)
    if dev == "cpu":
        return ("CPUExecutionProvider",)
    if dev.split(":")[0] != "cuda":
        raise UsageError(f"--device {dev}: onnxruntime runs on cpu or cuda")
    import onnxruntime as ort
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UsageError(f"--device {dev}: this onnxruntime ({ort.__version__}) has no CUDAExecutionProvider; "
                         "install onnxruntime-gpu")
    return ("CUDAExecutionProvider", "CPUExecutionProvider")


def make_backend(name: str, folder: ExportFolder, *, device: str = "cpu", plugin_lib: str | None = None,
                 allow_pickle: bool = False, threads: int | None = None, bind_states: bool = True):
    """A backend by name; ``threads`` sets onnxruntime's intra-op threads (default: onnxruntime's choice);
    ``bind_states=False`` makes onnxruntime generation pass states in and out as tensors (no in-place caches).
    onnxruntime with ``device`` "cuda" runs on its CUDA provider (onnxruntime-gpu), the states kept on the GPU."""
    if name == "torch":
        return TorchBackend(folder, device=device, allow_pickle=allow_pickle)
    if name == "onnxruntime":
        return OnnxRuntimeBackend(folder, providers=onnxruntime_providers(device), threads=threads,
                                  bind_states=bind_states)
    if name == "tensorrt":
        return TensorRTBackend(folder, plugin_lib)
    raise UsageError(f"--backend {name!r}: expected one of {', '.join(BACKENDS)}")
