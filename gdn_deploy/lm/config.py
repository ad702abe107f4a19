"""HybridConfig: which layer is what in a hybrid GDN / attention causal LM, and every size it needs.

One config describes all supported families (``family``): the bundled pure-GDN ``gdn_lm`` (GDNLM), HF
``qwen3_next``, ``qwen3_5`` (dense), ``qwen3_5_moe`` and ``olmo_hybrid``. ``layer_types[i]`` is
``"linear_attention"`` (a GDN block, sizes in ``gdn``) or ``"full_attention"`` (sizes in ``attention``);
``mlp_types[i]`` is ``"dense"`` (SwiGLU of ``intermediate_size``) or ``"moe"`` (``moe``). ``post_norm_attention``
selects OLMo-Hybrid's attention layers, which normalise the outputs of attention and MLP instead of their inputs.
Read HF config.json files with :func:`gdn_deploy.lm.hf_config.config_from_hf_dict`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

from .attention import AttentionConfig
from .gdn import GDNConfig
from .mlp import MoEConfig
from .norms import NORM_KINDS

__all__ = ["HybridConfig", "FAMILIES", "LAYER_TYPES", "MLP_TYPES"]

FAMILIES = ("gdn_lm", "qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid")
LAYER_TYPES = ("linear_attention", "full_attention")
MLP_TYPES = ("dense", "moe")


@dataclass
class HybridConfig:
    family: str
    vocab_size: int
    hidden_size: int
    layer_types: list
    mlp_types: list
    gdn: Optional[GDNConfig]
    attention: Optional[AttentionConfig] = None
    moe: Optional[MoEConfig] = None
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    norm_kind: str = "scale"
    post_norm_attention: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 0            # 0: no limit (pure GDN)
    eos_token_ids: list = field(default_factory=list)
    bos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    architecture: str = ""                       # the HF class it was read from ("" for our own models)
    notes: list = field(default_factory=list)    # what the loader left out (e.g. a vision tower)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"HybridConfig.family: expected one of {FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "hidden_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"HybridConfig.{name}: expected a positive int, got {v!r}")
        n = len(self.layer_types)
        if n < 1:
            raise ValueError("HybridConfig.layer_types: the model needs at least one layer")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"HybridConfig.layer_types: unknown layer type(s) {sorted(set(bad))}; "
                             f"supported: {', '.join(LAYER_TYPES)}")
        if len(self.mlp_types) != n or any(t not in MLP_TYPES for t in self.mlp_types):
            raise ValueError(f"HybridConfig.mlp_types: expected {n} entries from {MLP_TYPES}, got {self.mlp_types}")
        if "linear_attention" in self.layer_types and self.gdn is None:
            raise ValueError("HybridConfig: linear_attention layers need the gdn sizes")
        if "full_attention" in self.layer_types and self.attention is None:
            raise ValueError("HybridConfig: full_attention layers need the attention sizes")
        if "moe" in self.mlp_types and self.moe is None:
            raise ValueError("HybridConfig: moe layers need the moe sizes")
        if "dense" in self.mlp_types and self.intermediate_size < 1:
            raise ValueError(f"HybridConfig.intermediate_size: dense MLP layers need a positive size, "
                             f"got {self.intermediate_size}")
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(f"HybridConfig.norm_kind: expected one of {NORM_KINDS}, got {self.norm_kind!r}")
        if self.gdn is not None and self.gdn.hidden_size != self.hidden_size:
            raise ValueError(f"HybridConfig: gdn.hidden_size={self.gdn.hidden_size} != hidden_size={self.hidden_size}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    def gdn_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("gdn", "attention", "moe"):
            sub = getattr(self, k)
            d[k] = None if sub is None else sub.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "HybridConfig":
        if not isinstance(d, dict):
            raise ValueError(f"HybridConfig.from_dict: expected a dict, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"HybridConfig.from_dict: unknown key(s) {unknown}")
        d = dict(d)
        subs = {"gdn": GDNConfig.from_dict, "attention": lambda x: AttentionConfig(**x),
                "moe": lambda x: MoEConfig(**x)}
        for k, make in subs.items():
            if d.get(k) is not None:
                try:
                    d[k] = make(d[k])
                except TypeError as e:
                    raise ValueError(f"HybridConfig.from_dict: bad {k} entry: {e}") from e
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"HybridConfig.from_dict: {e}") from e

    def digest(self) -> str:
        """A short stable hash of the config (sidecars use it to tell whether an export matches a model)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_gdn_config(cls, c: GDNConfig) -> "HybridConfig":
        """The pure-GDN GDNLM: every layer a GDN block with a dense SwiGLU, plain RMSNorms, no attention."""
        if not c.is_lm:
            raise ValueError("HybridConfig.from_gdn_config: the GDNConfig has no LM fields "
                             "(vocab_size and intermediate_size must be > 0)")
        return cls(family="gdn_lm", vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   layer_types=["linear_attention"] * c.num_layers, mlp_types=["dense"] * c.num_layers,
                   gdn=c, intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps, norm_kind="scale",
                   tie_word_embeddings=c.tie_word_embeddings)
