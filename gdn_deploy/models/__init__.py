"""Shipped models. ``default_model_path()`` is the tiny GDN LM built by ``python -m gdn_deploy.models.make_default``."""
from __future__ import annotations

from pathlib import Path

__all__ = ["default_model_path", "load_default_model"]

DEFAULT_MODEL_FILE = "tiny_gdn_lm.pt"


def default_model_path() -> Path:
    """Path of the shipped tiny GDNLM checkpoint (gdn-deploy/1 format, fp32, < 1 MB)."""
    return Path(__file__).resolve().parent / DEFAULT_MODEL_FILE


def load_default_model():
    """The shipped tiny GDNLM (weights_only load)."""
    from ..checkpoint import load_checkpoint
    return load_checkpoint(default_model_path())
