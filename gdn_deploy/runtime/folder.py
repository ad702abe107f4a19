"""What a gdn-export folder offers a runtime: its graphs, one state list (names, shapes, dtypes, layer, kind) for
both LM kinds, and the tokenizer.

Pure-GDN LM exports (kind "lm") take zero initial states in prefill and return every token's logits; whole hybrid
exports (kind "hybrid") take positions, ``pad_index`` and every layer's state (KV caches included) and return them
updated, in the layout decode takes (``prefill_continues``). Hybrid folders of earlier releases start prefill from
empty states and return attention keys/values of the packed tokens, which become decode KV caches
(:func:`gdn_deploy.lm.model.scatter_packed`). The sidecar says which.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import LoadError, UsageError
from ..export import metadata as md

__all__ = ["ExportFolder", "StateSpec"]


@dataclass
class StateSpec:
    layer: int
    kind: str                 # "gdn" | "attention"
    role: str                 # "conv" | "recurrent" | "key" | "value"
    dtype: str
    prefill_input: Optional[str]      # the prefill graph takes this state (lm exports, hybrid exports that continue)
    prefill_output: str
    decode_input: str
    decode_output: str
    decode_shape: list


class ExportFolder:
    """A gdn-export folder usable for generation (an LM or a whole hybrid model, both graphs present).

    Loading checks the folder against its sidecar (:func:`gdn_deploy.export.integrity.verify_folder`: the sidecar's
    own checksum, every file's size, the prefill/decode graphs' inputs/outputs and the state list); ``gdn-check``
    also compares every file's sha256."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = md.read_metadata(self.path)
        self.kind = self.meta["model"]["kind"]
        if self.kind == "block":
            raise UsageError(f"{self.path}: holds a single GDN block (a --layer/--blocks export); generation needs a "
                             "language-model export (gdn-export MODEL without --layer/--blocks)")
        if self.kind not in ("lm", "hybrid"):
            raise LoadError(f"{self.path}: model kind {self.kind!r} is not one this gdn-deploy can run")
        missing = [g for g in ("prefill", "decode") if g not in self.meta["graphs"]]
        if missing:
            raise UsageError(f"{self.path}: has no {' or '.join(missing)} graph (exported with --graphs "
                             f"{','.join(self.meta['graphs'])}); re-export with --graphs prefill,decode")
        from ..export.integrity import verify_folder
        verify_folder(self.path, self.meta, graphs=("prefill", "decode"))   # sizes and graph I/O; gdn-check hashes
        self.interop = self.meta.get("interop")
        self.states = self._states()

    # ---- facts -------------------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        return self.meta["model"]["config"]

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_positions(self) -> int:
        return int(self.meta.get("generation", {}).get("max_position_embeddings") or 0)

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.meta.get("generation", {}).get("eos_token_ids") or [])

    @property
    def has_positions(self) -> bool:
        return self.kind == "hybrid"

    @property
    def prefill_continues(self) -> bool:
        """The prefill graph takes every layer's past state and ``pad_index`` (continues a conversation)."""
        return any(t["name"] == "pad_index" for t in self.meta["graphs"]["prefill"]["inputs"])

    def graph_file(self, graph: str, tensorrt: bool = False) -> Path:
        g = self.meta["graphs"][graph]
        name = g.get("tensorrt_file") if tensorrt else g["file"]
        if tensorrt and not name:
            raise UsageError(f"{self.path}: graph {graph} has no TensorRT-ready file (an --interop export?)")
        return self.path / name

    def tokenizer_path(self) -> Optional[Path]:
        name = self.meta.get("tokenizer")
        p = self.path / name if name else None
        return p if p is not None and p.is_file() else None

    def _states(self) -> list[StateSpec]:
        if self.kind == "hybrid":
            return [StateSpec(s["layer"], s["kind"], s["role"], s["dtype"], s.get("prefill_input"), s["prefill_output"],
                              s["decode_input"], s["decode_output"], list(s["decode_shape"]))
                    for s in self.meta["states"]]
        ins = {t["name"]: t for t in self.meta["graphs"]["decode"]["inputs"]}
        out = []
        for i in range(int(self.meta["model"]["num_gdn_layers"])):
            for role, stem in (("conv", "conv_state"), ("recurrent", "rec_state")):
                name = f"{stem}_{i}"
                out.append(StateSpec(i, "gdn", role, ins[name]["dtype"], name, f"{stem}_out_{i}", name,
                                     f"{stem}_out_{i}", list(ins[name]["shape"])))
        return out
