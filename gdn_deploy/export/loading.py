"""Resolve a MODEL argument (``default``, a checkpoint, a Hugging Face folder) into export targets."""
from __future__ import annotations

from pathlib import Path

from ..errors import LoadError, UsageError, first_line
from ..model import GDNLM
from .targets import ExportTarget, target_from_module

__all__ = ["load_targets"]


def load_targets(model: str = "default", *, layer: int | None = None, allow_pickle: bool = False,
                 blocks: bool = False, lazy: bool | None = False) -> list[ExportTarget]:
    """Resolve a MODEL argument into export targets.

    ``default`` (the bundled tiny GDNLM), a gdn-deploy ``.pt`` / ``.safetensors`` checkpoint, a HF
    folder (config.json + safetensors: the whole causal LM, kind "hybrid"; with ``blocks`` one block
    target per GDN layer), or, only with ``allow_pickle``, a ``.pt`` holding a whole pickled
    GDNLM/GDNBlock (unsafe for untrusted files). ``layer`` picks one GDN layer (its block) of an LM
    or HF folder. ``lazy`` (whole HF models): read no weights now, stream them at export (lazy_export.py);
    None: lazily when a float32 copy of the weights would exceed ``lazy_memory_limit()``.
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
        from ..lm.hf_folder import load_hf_causal_lm
        whole = layer is None and not blocks
        if lazy is None:
            from ..lm.hf_folder import hf_weight_files
            from .lazy_export import lazy_memory_limit
            try:
                ckpt = sum(f.stat().st_size for f in set(hf_weight_files(path).values()))
            except (ValueError, OSError):
                ckpt = 0          # the load below reports the problem
            lazy = 2 * ckpt > lazy_memory_limit()      # bf16 checkpoints: float32 is twice the files
        try:
            lm = load_hf_causal_lm(path, lazy=bool(lazy) and whole)
        except (ValueError, OSError, KeyError) as e:
            raise LoadError(f"cannot load the Hugging Face folder: {first_line(e)}") from e
        source = {**source, "format": "hf"}
        if layer is None and not blocks:
            return [ExportTarget(lm, "hybrid", {**source, "layer": None})]
        gdn = [(i, l.linear_attn) for i, l in enumerate(lm.layers) if l.layer_type == "linear_attention"]
        if layer is not None:
            chosen = [(i, b) for i, b in gdn if i == layer]
            if not chosen:
                raise UsageError(f"--layer {layer}: not a Gated DeltaNet layer of {model} "
                                 f"(GDN layers: {[i for i, _ in gdn]})")
            gdn = chosen
        return [ExportTarget(b.eval(), "block", {**source, "layer": i}) for i, b in gdn]
    try:
        module = load_checkpoint(path, allow_pickle=allow_pickle)
    except (ValueError, OSError, RuntimeError) as e:
        msg = first_line(e)
        if "allow_pickle=True" in msg:
            msg = (f"{path}: holds pickled Python objects and cannot be loaded safely (weights_only). "
                   "If you trust this file, pass --allow-pickle (UNSAFE: unpickling runs code from the file)")
        raise LoadError(msg) from e
    source = {**source, "format": "checkpoint", "layer": layer, "allow_pickle": bool(allow_pickle)}
    if layer is not None:
        if not isinstance(module, GDNLM):
            raise UsageError(f"--layer {layer}: {model} is a single GDNBlock; --layer selects a layer of a "
                             "GDNLM or a Hugging Face folder")
        if not 0 <= layer < len(module.layers):
            raise UsageError(f"--layer {layer}: the model has GDN layers 0..{len(module.layers) - 1}")
        return [ExportTarget(module.layers[layer].linear_attn.eval(), "block", source)]
    return [target_from_module(module, source)]
