"""gdn-deploy checkpoint format (``gdn-deploy/1``).

A ``.pt`` checkpoint is ``torch.save({"format": "gdn-deploy/1", "kind": "GDNLM" | "GDNBlock",
"config": GDNConfig.to_dict(), "state_dict": {...}})``, loaded with ``torch.load(weights_only=True)`` (tensors
and plain containers only; no code runs). A ``.safetensors`` checkpoint holds the state dict with metadata
``{"format": "gdn-deploy/1", "kind": ..., "gdn_config": <config JSON>}``. The model takes the floating dtype of
the stored weights.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .model import GDNBlock, GDNConfig, GDNLM, check_state_dict

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint", "model_from_state"]

FORMAT = "gdn-deploy/1"
_KINDS = {"GDNLM": GDNLM, "GDNBlock": GDNBlock}


def _kind_of(model: nn.Module) -> str:
    for name, cls in _KINDS.items():
        if type(model) is cls:
            return name
    raise ValueError(f"save_checkpoint: expected a GDNLM or GDNBlock, got {type(model).__name__}")


def save_checkpoint(model: nn.Module, path: str | Path) -> Path:
    """Write ``model`` (GDNLM or GDNBlock) to ``path``: safetensors when it ends in ``.safetensors``,
    else a ``torch.save`` dict readable with ``weights_only=True``."""
    kind = _kind_of(model)
    path = Path(path)
    sd = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    cfg = model.config.to_dict()
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file(sd, str(path), metadata={"format": FORMAT, "kind": kind, "gdn_config": json.dumps(cfg)})
    else:
        torch.save({"format": FORMAT, "kind": kind, "config": cfg, "state_dict": sd}, path)
    return path


def model_from_state(kind: str, config: dict, state_dict: dict, where: str = "checkpoint") -> nn.Module:
    """Build a ``kind`` model from a config dict and load ``state_dict`` strictly (ValueError on mismatch)."""
    if kind not in _KINDS:
        raise ValueError(f"{where}: kind {kind!r} is not one of {sorted(_KINDS)}")
    try:
        cfg = GDNConfig.from_dict(config)
        model = _KINDS[kind](cfg)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: bad config: {e}") from e
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{where}: state_dict must be a dict of tensors")
    check_state_dict(model, state_dict, f"{where}: state_dict does not match {kind}")
    dtypes = {t.dtype for t in state_dict.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model = model.to(dtypes.pop())
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _check_header(obj: Any, where: str) -> None:
    if not isinstance(obj, dict) or "format" not in obj:
        raise ValueError(f"{where}: not a gdn-deploy checkpoint (expected a dict with format={FORMAT!r}, "
                         f"got {type(obj).__name__}{' without a format key' if isinstance(obj, dict) else ''})")
    if obj["format"] != FORMAT:
        raise ValueError(f"{where}: unsupported format {obj['format']!r} (this version reads {FORMAT!r})")
    for k in ("kind", "config", "state_dict"):
        if k not in obj:
            raise ValueError(f"{where}: missing entry {k!r}")


def _load_safetensors(path: Path) -> nn.Module:
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            sd = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{path}: not a readable safetensors file: {e}") from e
    if "gdn_config" not in meta:
        raise ValueError(f"{path}: safetensors metadata has no 'gdn_config' (JSON GDNConfig); a HF model folder "
                         "is loaded with gdn_deploy.hf.load_hf_folder instead")
    if meta.get("format", FORMAT) != FORMAT:
        raise ValueError(f"{path}: unsupported format {meta['format']!r} (this version reads {FORMAT!r})")
    try:
        cfg = json.loads(meta["gdn_config"])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: metadata 'gdn_config' is not valid JSON: {e}") from e
    kind = meta.get("kind") or ("GDNLM" if GDNConfig.from_dict(cfg).is_lm else "GDNBlock")
    return model_from_state(kind, cfg, sd, str(path))


def _unpickler_reason(e: BaseException) -> str:
    """The informative line of torch's weights_only error (it wraps it in a long advice text)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "Unsupported" in ln or "load key" in ln:
            return ln.replace("WeightsUnpickler error: ", "")[:300]
    return (lines[0] if lines else type(e).__name__)[:300]


def load_checkpoint(path: str | Path, *, allow_pickle: bool = False) -> nn.Module:
    """Load a GDNLM / GDNBlock from a gdn-deploy checkpoint (``.pt`` or ``.safetensors``) on the CPU.

    ``.pt`` files are read with ``torch.load(weights_only=True)``. A file holding a whole pickled module is
    refused unless ``allow_pickle=True``. WARNING: ``allow_pickle=True`` is unsafe for files you do not trust:
    unpickling executes arbitrary code from the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: checkpoint file does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty (0 bytes): not a checkpoint (an interrupted save or copy?)")
    if path.suffix == ".safetensors":
        return _load_safetensors(path)
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e):   # not objects refused by weights_only: a corrupt/foreign file
            raise ValueError(f"{path}: not a readable torch checkpoint (corrupt, truncated or not a torch.save "
                             f"file: {_unpickler_reason(e)})") from e
        if not allow_pickle:
            raise ValueError(
                f"{path}: cannot be loaded with weights_only=True (it pickles Python objects, e.g. a whole "
                "nn.Module). If you trust this file, pass allow_pickle=True (gdn_deploy.checkpoint.load_checkpoint"
                "(path, allow_pickle=True)); unpickling runs arbitrary code from the file. Better: re-save it "
                f"with save_checkpoint. ({_unpickler_reason(e)})") from e
        try:
            obj = torch.load(path, weights_only=False, map_location="cpu")
        except Exception as e2:  # noqa: BLE001  (the unpickler raises anything the file's code raises)
            raise ValueError(f"{path}: unpickling failed ({type(e2).__name__}: {e2})") from e2
        if isinstance(obj, nn.Module):
            if not isinstance(obj, (GDNLM, GDNBlock)):
                raise ValueError(f"{path}: pickled module is a {type(obj).__name__}, not a GDNLM or GDNBlock")
            return obj.eval()
    except (RuntimeError, EOFError, OSError, IndexError, KeyError, TypeError, AttributeError) as e:
        # what torch.load's unpickler raises on a corrupt or non-torch file (seen: IndexError, KeyError)
        why = f"{type(e).__name__}: {e}" if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a readable torch checkpoint (corrupt, truncated or not a torch.save file: "
                         f"{why})") from e
    _check_header(obj, str(path))
    return model_from_state(obj["kind"], obj["config"], obj["state_dict"], str(path))
