"""Sidecar entries of a whole hybrid LM export (kind "hybrid") and the files copied beside its graphs.

Besides the common sidecar (:mod:`.metadata`) a hybrid export records:

- ``model``: ``family``, ``architecture``, ``layer_types``, ``mlp_types``, ``num_layers``, ``notes`` (what the loader
  left out, e.g. a vision tower);
  with MoE layers also ``moe``: how the onnxruntime graphs compute them (``prefill``; ``decode`` for decode,
  decode_pool, verify and draft) and their TensorRT copies (``tensorrt``): ``{"prefill": "op", "decode": "op",
  "tensorrt": {"prefill": "grouped", "decode": "gather"}}`` where onnxruntime has ``com.microsoft::MoE``, else
  both as ``tensorrt`` (:mod:`gdn_deploy.lm.mlp`, :mod:`.onnx_moe`; folders written before the op have no
  ``tensorrt``);
- ``states``: every state tensor, in graph order: ``{"layer", "kind": "gdn"|"attention", "role":
  "conv"|"recurrent"|"key"|"value", "dtype", "prefill_output", "prefill_shape", "decode_input", "decode_output",
  "decode_shape"}`` (:func:`gdn_deploy.export.hybrid_graphs.hybrid_state_specs`);
- ``generation``: ``eos_token_ids`` (config.json's, plus generation_config.json's when the folder has one),
  ``bos_token_id``, ``pad_token_id``, ``max_position_embeddings``, ``vocab_size``, ``prefill_logits`` ("last" or
  "all");
- ``speculative`` (verify / commit / draft exported): :mod:`.speculative_export`;
- ``attention`` (models with attention layers): the form each file uses, ``{"onnxruntime": ..., "tensorrt": ...}``
  (:data:`gdn_deploy.export.onnx_cache_attention.ATTENTION_FORMS`: GroupQueryAttention in ``prefill.onnx`` /
  ``decode.onnx``, ScatterND + ONNX Attention in the ``*.trt.onnx`` copies);
- ``tokenizer``: ``"tokenizer.json"`` when the Hugging Face folder had one (copied here; read offline with the
  ``tokenizers`` package).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .hybrid_graphs import HybridDecodeGraph, HybridPrefillGraph, hybrid_state_specs
from .speculative_export import speculative_metadata
from .targets import ExportTarget

__all__ = ["hybrid_metadata", "TOKENIZER_FILE"]

TOKENIZER_FILE = "tokenizer.json"


def hybrid_metadata(meta: dict[str, Any], target: ExportTarget, outdir: Path,
                    log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    c = target.module.hybrid_config
    meta["model"].update(family=c.family, architecture=c.architecture, layer_types=list(c.layer_types),
                         mlp_types=list(c.mlp_types), num_layers=c.num_layers, notes=list(c.notes))
    if "moe" in c.mlp_types:
        from .onnx_moe import tensorrt_moe_form
        meta["model"]["moe"] = {"prefill": HybridPrefillGraph(target.module).moe_impl,
                                "decode": HybridDecodeGraph(target.module).moe_impl,
                                "tensorrt": {g: tensorrt_moe_form(g) for g in ("prefill", "decode")}}
    meta["states"] = hybrid_state_specs(target.module)
    speculative_metadata(meta, target)
    if "full_attention" in c.layer_types:
        from .onnx_cache_attention import ATTENTION_FORMS, onnxruntime_attention_form
        gs = meta.get("graphs", {}).values()
        head_dim = next(s["decode_shape"][-1] for s in meta["states"] if s["kind"] == "attention")
        ort_form = ATTENTION_FORMS[onnxruntime_attention_form(head_dim)]
        meta["attention"] = {"onnxruntime": dict(ort_form, files=[g["file"] for g in gs]),
                             "tensorrt": dict(ATTENTION_FORMS["tensorrt"],
                                              files=[g["tensorrt_file"] for g in gs if g.get("tensorrt_file")])}
    src = target.source.get("model")
    hf_dir = Path(src) if src and target.source.get("format") == "hf" else None
    eos = list(c.eos_token_ids)
    gen_cfg = hf_dir / "generation_config.json" if hf_dir else None
    if gen_cfg is not None and gen_cfg.is_file():
        try:
            g = json.loads(gen_cfg.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            g = None
        for e in ([g] if isinstance(g, int) else g or []):
            if isinstance(e, int) and e not in eos:
                eos.append(e)
    meta["generation"] = {"eos_token_ids": eos, "bos_token_id": c.bos_token_id,
                          "pad_token_id": c.pad_token_id, "max_position_embeddings": c.max_position_embeddings,
                          "vocab_size": c.vocab_size, "prefill_logits": "all" if target.all_logits else "last"}
    for note in c.notes:
        log(f"  note: {note}")
    tok = hf_dir / TOKENIZER_FILE if hf_dir else None
    if tok is not None and tok.is_file():
        shutil.copyfile(tok, outdir / TOKENIZER_FILE)
        meta["tokenizer"] = TOKENIZER_FILE
        log(f"  copied {TOKENIZER_FILE} (prompts as text in samples/decode_loop.py)")
    return meta
