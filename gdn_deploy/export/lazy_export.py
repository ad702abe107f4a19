"""Export a model whose weights are not in memory (``load_hf_causal_lm(..., lazy=True)``): trace with placeholders,
then stream each initializer from the checkpoint, cast to the export precision, into the graph's external data.

A lazily loaded :class:`~gdn_deploy.lm.HybridLM` holds stride-0 placeholders (one zero viewed at each parameter's
shape and dtype) and ``model.lazy_weights``. ``torch.export`` only needs shapes and dtypes, so the trace is the same
as with real weights; the ONNX program is built without constant folding (folding would bake placeholder values
into new constants), every initializer that is a parameter becomes an ``onnx_ir.LazyTensor`` reading the
checkpoint, and only then is the program optimized (folding now reads real values) and saved tensor by tensor.
Peak memory: the largest parameter plus the traced program, not the model.

A float32 reference of such a model is what did not fit in memory in the first place: the export writes no
reference files and says NOT CHECKED (``not_checked`` in the sidecar).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Mapping

import torch

from .targets import PRECISIONS, ExportTarget

__all__ = ["is_lazy", "cast_lazy_target", "lazy_initializers", "attach_lazy_initializers", "lazy_tensor",
           "NOT_CHECKED_LAZY", "lazy_memory_limit"]

NOT_CHECKED_LAZY = ("NOT CHECKED: the weights were streamed from the checkpoint (model too large for a float32 "
                    "reference on this machine); no reference files were written")


def is_lazy(target: ExportTarget) -> bool:
    return getattr(target.module, "lazy_weights", None) is not None


def lazy_memory_limit() -> int:
    """Bytes of a float32 reference model above which ``gdn-export`` loads a HF folder lazily: half of the memory
    available now (``GDN_LAZY_BYTES`` overrides)."""
    env = os.environ.get("GDN_LAZY_BYTES")
    if env:
        return int(float(env))
    try:
        with open("/proc/meminfo") as fh:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
        return info.get("MemAvailable", info["MemTotal"]) // 2
    except (OSError, KeyError, ValueError, IndexError):
        return 8 << 30


def _placeholder(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros((), dtype=dtype if p.is_floating_point() else p.dtype).expand(p.shape)


def cast_lazy_target(target: ExportTarget, precision: str) -> ExportTarget:
    """The lazy target with placeholders of ``precision`` (casting a placeholder with ``.to`` would allocate it)."""
    dtype = PRECISIONS[precision]
    module = target.module
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if p.dtype != dtype and p.is_floating_point():
                setattr(mod, name, torch.nn.Parameter(_placeholder(p, dtype), requires_grad=False))
    return ExportTarget(module.eval(), target.kind, {**target.source, "precision": precision}, target.all_logits)


def lazy_initializers(plan_module: torch.nn.Module, target: ExportTarget) -> dict[str, Callable[[], torch.Tensor]]:
    """Initializer name (the parameter's name in ``plan_module``, as the ONNX exporter names it) -> a function
    returning its real value in the target's dtype."""
    lazy = target.module.lazy_weights
    own = {id(p): n for n, p in target.module.named_parameters(remove_duplicate=False)}
    out = {}
    for name, p in plan_module.named_parameters(remove_duplicate=False):
        model_name = own.get(id(p))
        if model_name is None:
            raise ValueError(f"lazy export: parameter {name!r} is not one of the model's")
        out[name] = functools.partial(lazy.load, model_name, p.dtype)
    return out


def lazy_tensor(name: str, fn: Callable[[], torch.Tensor], like: Any) -> Any:
    """An ``onnx_ir.LazyTensor`` named ``name`` with ``like``'s dtype and shape whose value is ``fn()`` (read when
    folded or saved); a checkpoint read (``lazy.load`` partial) is tagged so the weights file holds it once."""
    import onnx_ir as ir
    from torch.onnx._internal.exporter._core import TorchTensor

    from .stream_weights import SOURCE_KEY

    def value():
        return TorchTensor(fn().contiguous(), name=name)

    t = ir.LazyTensor(value, dtype=like.dtype, shape=like.shape, name=name)
    if isinstance(fn, functools.partial):   # lazy.load(checkpoint name, dtype): written once per export
        t.meta[SOURCE_KEY] = ("checkpoint", id(getattr(fn.func, "__self__", fn.func)), *map(str, fn.args))
    return t


def attach_lazy_initializers(ir_model: Any, loaders: Mapping[str, Callable[[], torch.Tensor]]) -> int:
    """Replace the initializers of an onnx_ir model named in ``loaders`` by ``onnx_ir.LazyTensor`` s that read the
    checkpoint when saved or folded. Any other initializer that is still a placeholder (stride 0) raises: its
    value would be a made-up zero. Returns the number replaced."""
    n = 0
    for name, v in ir_model.graph.initializers.items():
        const = v.const_value
        if name in loaders:
            v.const_value = lazy_tensor(name, loaders[name], const)
            n += 1
            continue
        raw = getattr(const, "raw", None)
        if isinstance(raw, torch.Tensor) and raw.numel() > 1 and all(s == 0 for s in raw.stride()):
            raise ValueError(f"lazy export: initializer {name!r} is a placeholder that no checkpoint tensor fills")
    return n
