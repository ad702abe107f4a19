"""Export a model whose weights are not in memory (``load_hf_causal_lm(..., lazy=True)``): trace with placeholders,
then stream each initializer from the checkpoint, cast to the export precision, into the graph's external data.

A lazily loaded :class:`~gdn_deploy.lm.HybridLM` holds stride-0 placeholders (one zero viewed at each parameter's
shape and dtype) and ``model.lazy_weights``. ``torch.export`` only needs shapes and dtypes, so the trace is the same
as with real weights; the ONNX program is built without constant folding (folding would bake placeholder values
into new constants), every initializer that is a parameter becomes an ``onnx_ir.LazyTensor`` reading the
checkpoint, and only then is the program optimized (folding now reads real values) and saved tensor by tensor.
Peak memory: the largest parameter plus the traced program, not the model.

A float32 reference of such a model is what did not fit in memory in the first place: the export writes no
reference files and says NOT CHECKED (``not_checked`` in the sidecar). ``gdn-check --from-model`` computes it later
with :func:`streamed_reference_outputs`: each module's weights read from the checkpoint just before the module runs
and dropped after it, so the peak is the largest module's float32 weights, not the model's.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Mapping

import torch

from .targets import PRECISIONS, ExportTarget

__all__ = ["is_lazy", "cast_lazy_target", "lazy_initializers", "attach_lazy_initializers", "lazy_tensor",
           "NOT_CHECKED_LAZY", "lazy_memory_limit", "streamed_reference_outputs"]

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


def _load_units(root: torch.nn.Module) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """(units, holders): each unit is a module whose parameters (its whole subtree's) are read when it runs: every
    layer of a ModuleList and every other module beside them that holds no ModuleList; ``holders`` are the modules
    above them, whose own parameters (if any) are read for the whole call."""
    units, holders = [], []

    def split(mod):
        if isinstance(mod, torch.nn.ModuleList):
            units.extend(mod.children())
        elif any(isinstance(m, torch.nn.ModuleList) for m in mod.modules()):
            holders.append(mod)
            for c in mod.children():
                split(c)
        else:
            units.append(mod)
    split(root)
    return units, holders


def _loading(fn: Callable, entries, depth: list, load: Callable, drop: Callable) -> Callable:
    """``fn`` with the unit's weights loaded around its outermost call (``depth`` counts nested calls)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if depth[0] == 0:
            load(entries)
        depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                drop(entries)
    return call


def streamed_reference_outputs(target: ExportTarget, graph: str, feed: Mapping[str, torch.Tensor],
                               precision: str) -> dict[str, torch.Tensor]:
    """Outputs of graph ``graph`` of a lazily loaded ``target`` computed in float32 on ``feed`` from its weights
    rounded to ``precision`` (what :func:`.verify.reference_outputs` gives for the model in memory), without the
    model in memory: each layer (and the embedding, final norm, head) reads its weights (``lazy_weights.load`` in
    ``precision``, then float32) when its ``forward`` / ``prefill`` / ``decode`` is called and drops them when it
    returns: the peak is one layer's float32 weights (with a tied head, plus the embedding, kept loaded). Outside
    that window the parameters are NaN placeholders, so a weight read elsewhere gives non-finite outputs, which
    raise ValueError instead of giving a wrong reference."""
    from .graphs import graph_plan
    from .runtimes import run_torch
    dtype = PRECISIONS[precision]
    lazy = target.module.lazy_weights
    ref = cast_lazy_target(target, "fp32")
    own = {id(p): n for n, p in ref.module.named_parameters(remove_duplicate=False)}
    plan = graph_plan(ref, graph)
    units, holders = _load_units(plan.module)
    loaded: set[str] = set()

    def params(mod, recurse):
        out = []
        for full, p in mod.named_parameters(recurse=recurse, remove_duplicate=False):
            if id(p) not in own:
                raise ValueError(f"streamed reference: parameter {full!r} of {type(mod).__name__} is not one of the "
                                 "model's")
            owner = mod.get_submodule(full.rsplit(".", 1)[0]) if "." in full else mod
            out.append((owner, full.rsplit(".", 1)[-1], own[id(p)]))
        return out

    def load(entries):
        for owner, attr, name in entries:
            setattr(owner, attr, torch.nn.Parameter(lazy.load(name, dtype).float(), requires_grad=False))
            loaded.add(name)

    def drop(entries):
        for owner, attr, _ in entries:
            p = getattr(owner, attr)
            nan = torch.full((), float("nan"), dtype=torch.float32).expand(p.shape)
            setattr(owner, attr, torch.nn.Parameter(nan, requires_grad=False))
    # a tied head reads the embedding's weight outside the embedding: embeddings of such models stay loaded
    tied = bool(getattr(lazy, "aliases", None)) or \
        any(getattr(m, "lm_head", False) is None for m in plan.module.modules())     # HybridLM without a head
    held = [e for h in holders for e in params(h, False)]
    held += [e for u in units if tied and isinstance(u, torch.nn.Embedding) for e in params(u, True)]
    units = [u for u in units if not (tied and isinstance(u, torch.nn.Embedding))]
    unit_params = [params(u, True) for u in units]
    for entries in unit_params:
        drop(entries)
    wrapped = []
    for u, entries in zip(units, unit_params):      # layers run through forward, prefill or decode (not __call__)
        depth = [0]
        for meth in ("forward", "prefill", "decode", "verify"):
            if callable(getattr(type(u), meth, None)):
                wrapped.append((u, meth))
                setattr(u, meth, _loading(getattr(u, meth), entries, depth, load, drop))
    load(held)
    try:
        f32 = {k: (v.float() if v.is_floating_point() else v) for k, v in feed.items()}
        with torch.no_grad():
            out = {k: v.float() for k, v in run_torch(plan, f32).items()}
    finally:
        for u, meth in wrapped:
            delattr(u, meth)
        for entries in [held, *unit_params]:
            for owner, attr, _ in entries:
                p = getattr(owner, attr)
                setattr(owner, attr, torch.nn.Parameter(_placeholder(p, torch.float32), requires_grad=False))
    bad = [k for k, v in out.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"streamed reference of {graph}: outputs {', '.join(bad)} are not finite (a weight was read "
                         f"outside its layer's forward, or the model overflows); {len(loaded)} weights were read")
    return out
