"""The GDN block and the pure-GDN LM (compatibility module; the code lives in :mod:`gdn_deploy.lm`).

- :class:`GDNConfig`, :class:`GDNBlock`: a Gated DeltaNet layer with Hugging Face parameter names
  (Qwen3-Next, Qwen3.5, OLMo-Hybrid layouts), prefill over packed ragged sequences and one-token decode
  through the ``torch.ops.gdn.*`` custom ops (:mod:`gdn_deploy.lm.gdn`);
- :class:`GDNLM`: the bundled pure-GDN LM, one case of the hybrid model :class:`gdn_deploy.lm.HybridLM`
  (:mod:`gdn_deploy.lm.model`).
"""
from __future__ import annotations

from .lm.gdn import L2NORM_EPS, PROJECTION_LAYOUTS, GDNBlock, GDNConfig, check_state_dict
from .lm.mlp import SwiGLU
from .lm.model import GDNLM, DecoderLayer
from .lm.norms import GatedRMSNorm, RMSNorm

__all__ = ["GDNConfig", "GDNBlock", "GDNLM", "GatedRMSNorm", "RMSNorm", "SwiGLU", "DecoderLayer",
           "PROJECTION_LAYOUTS", "L2NORM_EPS", "check_state_dict"]
