"""The ``gdn_model.json`` sidecar written next to the exported graphs.

It tells a consumer (``gdn-build``, ``gdn-check``, an inference server) everything the
ONNX files do not say plainly: the model config and head dims, the weight precision,
for each graph its file and its ordered inputs/outputs (symbolic shapes, dtypes), where
the model came from, and suggested TensorRT optimisation profiles::

    {"format": "gdn-deploy.model-export", "format_version": 2,
     "model": {"kind": "lm"|"block", "config": {...}, "heads": {...}, "num_gdn_layers": L},
     "precision": "fp16", "dtypes": {"weights": "float16", "activations": "float16", "states": "float32"},
     "graphs": {"prefill": {"file": "prefill.onnx", "tensorrt_file": "prefill.trt.onnx",
                            "inputs": [{"name", "shape", "dtype"}...], "outputs": [...],
                            "check": {"inputs": "prefill_inputs.json", "reference": "prefill_reference.json",
                                      "reference_dtype": "float32", "tolerance": {"atol", "rtol", "rel"}}}, ...},
     "dims": {"T": "packed prefill tokens", ...},
     "profiles": {"prefill": {"input_ids": {"min": [1], "opt": [2048], "max": [8192]}, ...}, "decode": {...}},
     "source": {"model": "default" | path relative to this folder, "layer": null, ...}, "opset": 18,
     "interop": null, "gdn_body": "chunked", "config_hash": sha256 of the model's kind + config,
     "files": {"prefill.onnx": {"sha256": ..., "bytes": ...}, ...}, "sidecar_sha256": ...}

Shapes are lists of ints and dim symbols: ``T`` (packed prefill tokens), ``N`` (prefill
sequences; ``N+1`` for cu_seqlens), ``B`` (decode batch), ``P`` (state pool rows), ``S`` (KV-cache
capacity of a whole hybrid model's decode graph). A whole hybrid model (``kind: "hybrid"``) adds
``states`` (every state tensor: layer, kind, role, dtype, prefill output, decode input/output, shapes),
``generation`` (eos ids, position limit, prefill logits "last"/"all") and ``tokenizer``
(:mod:`gdn_deploy.export.hybrid_export`).
``file`` is what onnxruntime runs (gdn nodes with their ONNX function bodies); ``tensorrt_file`` is the
TensorRT-ready copy (bodies removed, every gdn node marked for the plugins), absent when the graph has no gdn
nodes (``--interop`` exports).
``gdn_body`` is the prefill function body onnxruntime runs ("chunked" or "token"; null with ``--interop``).
A graph whose onnxruntime file holds a dense-state decode node also says which decode body it runs:
``graphs.<name>.decode_body`` ("linear_attention": onnxruntime's fused ``com.microsoft::LinearAttention``;
"ops": standard ops; absent in folders exported before the choice existed, which run "ops"), read from the file
when the sidecar is written.
``files`` binds the folder together: sha256 and size of every other file in the folder when the sidecar was written
(graphs, external data, TensorRT copies, reference files, tokenizer), and ``sidecar_sha256`` is the sha256 of the
sidecar's own canonical JSON without that key, so an edited sidecar is noticed (:mod:`.integrity` checks both).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import LoadError, UsageError
from ..spec import SPEC

__all__ = ["FORMAT", "FORMAT_VERSION", "SIDECAR_NAME", "DIM_DOCS", "MetadataError", "NotAnExport", "eval_dim",
           "suggest_profiles", "build_metadata", "write_metadata", "read_metadata", "find_sidecar", "file_digest",
           "folder_files", "sidecar_digest"]

FORMAT = "gdn-deploy.model-export"
FORMAT_VERSION = 2
SIDECAR_NAME = "gdn_model.json"
DIM_DOCS = {
    "T": "packed prefill tokens (all sequences concatenated)",
    "N": "prefill sequences (cu_seqlens has N+1 entries)",
    "B": "decode batch: sequences advanced by one token",
    "P": "rows of a state pool (decode_pool graph)",
    "S": "KV-cache capacity per sequence (hybrid models' attention layers; every position < S, past + L <= S)",
    "L": "hybrid prefill's padded view: the most new tokens of one sequence (pad_index [N, L])",
    "D": "tokens per sequence of a speculative verify call (last accepted token + drafts), entries of a draft call",
}


class MetadataError(LoadError, ValueError):
    """An unreadable or incompatible gdn_model.json (exit code 3); a folder without one is a :class:`NotAnExport`."""


class NotAnExport(UsageError, MetadataError):
    """The path holds no gdn_model.json (exit code 2)."""


def eval_dim(dim: int | str, sizes: Mapping[str, int]) -> int:
    """Value of a shape entry: an int, a symbol ('T'), or symbol+int ('N+1')."""
    if isinstance(dim, int):
        return dim
    sym, _, plus = str(dim).replace(" ", "").partition("+")
    if sym not in sizes:
        raise MetadataError(f"unknown dim symbol {dim!r} (known: {', '.join(sorted(sizes))})")
    return int(sizes[sym]) + (int(plus) if plus else 0)


def _profile_sizes(max_tokens: int, max_seqs: int, max_context: int = 4096) -> dict[str, dict[str, int]]:
    if max_tokens < 1 or max_seqs < 1 or max_context < 1:
        raise MetadataError(f"profile limits must be >= 1 (max_tokens={max_tokens}, max_seqs={max_seqs}, "
                            f"max_context={max_context})")
    return {
        "min": {"T": 1, "N": 1, "B": 1, "P": 1, "S": 1, "L": 1, "D": 1},
        "opt": {"T": max(1, max_tokens // 4), "N": max(1, max_seqs // 4), "B": max(1, max_seqs // 4),
                "P": max_seqs, "S": max(1, max_context // 4), "L": max(1, min(max_tokens, max_context) // 4),
                "D": 4},
        "max": {"T": max_tokens, "N": max_seqs, "B": max_seqs, "P": max_seqs, "S": max_context,
                "L": min(max_tokens, max_context), "D": SPEC.max_draft_tokens},
    }


def suggest_profiles(graphs: Mapping[str, Mapping[str, Any]], *, max_tokens: int = 8192,
                     max_seqs: int = 64, max_context: int = 4096) -> dict[str, dict[str, dict[str, list[int]]]]:
    """TensorRT optimisation profiles (min/opt/max shape of every graph input).

    Defaults: up to ``max_tokens`` packed prefill tokens in up to ``max_seqs`` sequences,
    decode batches up to ``max_seqs``, pools of ``max_seqs`` rows, KV caches of up to ``max_context``
    slots; opt is a quarter of max.
    """
    sizes = _profile_sizes(max_tokens, max_seqs, max_context)
    out: dict[str, dict[str, dict[str, list[int]]]] = {}
    for graph, info in graphs.items():
        out[graph] = {t["name"]: {level: [eval_dim(d, sizes[level]) for d in t["shape"]]
                                  for level in ("min", "opt", "max")}
                      for t in info["inputs"]}
    return out


def build_metadata(*, kind: str, config: Mapping[str, Any], heads: Mapping[str, int], num_gdn_layers: int,
                   precision: str, dtypes: Mapping[str, str], graphs: Mapping[str, Mapping[str, Any]],
                   source: Mapping[str, Any], opset: int | None, interop: str | None,
                   max_tokens: int = 8192, max_seqs: int = 64, config_hash: str | None = None,
                   gdn_body: str | None = None, max_context: int = 4096) -> dict[str, Any]:
    """Assemble the sidecar dict. ``graphs``: name -> {"file", "inputs", "outputs"[, "check"]} (tensor dicts) and
    optionally "tensorrt_file" (the TensorRT-ready copy; omitted when None)."""
    for name, g in graphs.items():
        for key in ("file", "inputs", "outputs"):
            if key not in g:
                raise MetadataError(f"graph {name!r}: missing {key!r}")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": {"kind": kind, "config": dict(config), "heads": dict(heads), "num_gdn_layers": num_gdn_layers},
        "precision": precision,
        "dtypes": dict(dtypes),
        "graphs": {name: {"file": g["file"],
                          **({"tensorrt_file": g["tensorrt_file"]} if g.get("tensorrt_file") else {}),
                          "inputs": list(g["inputs"]), "outputs": list(g["outputs"]),
                          **({"check": dict(g["check"])} if "check" in g else {})}
                   for name, g in graphs.items()},
        "dims": dict(DIM_DOCS),
        "profiles": suggest_profiles(graphs, max_tokens=max_tokens, max_seqs=max_seqs, max_context=max_context),
        "profile_limits": {"max_tokens": max_tokens, "max_seqs": max_seqs, "max_context": max_context},
        "source": dict(source),
        "opset": opset,
        "interop": interop,
        "gdn_body": gdn_body,
        "config_hash": config_hash,
    }


def file_digest(path: str | Path) -> dict[str, Any]:
    """{"sha256", "bytes"} of a file (read in 8 MiB pieces)."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            n += len(chunk)
    return {"sha256": h.hexdigest(), "bytes": n}


def folder_files(outdir: str | Path) -> dict[str, dict[str, Any]]:
    """``files`` of a sidecar: every regular file directly in ``outdir`` except the sidecar and hidden files."""
    d = Path(outdir)
    return {p.name: file_digest(p) for p in sorted(d.iterdir())
            if p.is_file() and p.name != SIDECAR_NAME and not p.name.startswith(".")}


def sidecar_digest(meta: Mapping[str, Any]) -> str:
    """sha256 of the sidecar's canonical JSON without its ``sidecar_sha256`` key."""
    body = {k: v for k, v in meta.items() if k != "sidecar_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _note_decode_bodies(outdir: Path, meta: dict[str, Any]) -> None:
    """Set ``graphs.<name>.decode_body`` from each onnxruntime graph file's ``gdn.decode_body`` metadata."""
    import onnx
    from .onnx_functions import decode_function_body
    for g in (meta.get("graphs") or {}).values():
        path = outdir / str(g.get("file", ""))
        if not g.get("file") or not path.is_file():
            continue
        body = decode_function_body(onnx.load(str(path), load_external_data=False))
        if body:
            g["decode_body"] = body


def write_metadata(outdir: str | Path, meta: dict[str, Any]) -> Path:
    """Write the sidecar last: set ``meta["files"]`` (digests of every file now in the folder) and
    ``meta["sidecar_sha256"]``, then write ``gdn_model.json`` atomically (a temporary file moved into place)."""
    d = Path(outdir)
    _note_decode_bodies(d, meta)
    meta["files"] = folder_files(d)
    meta["sidecar_sha256"] = sidecar_digest(meta)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{SIDECAR_NAME}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, d / SIDECAR_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return d / SIDECAR_NAME


def find_sidecar(path: str | Path) -> Path | None:
    """The sidecar of an export folder (or the file itself), or None."""
    p = Path(path)
    if p.is_file() and p.name.endswith(".json"):
        return p
    cand = p / SIDECAR_NAME
    return cand if cand.is_file() else None


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Load and sanity-check a sidecar (a folder or the json file); raises :class:`MetadataError`."""
    p = find_sidecar(path)
    if p is None:
        raise NotAnExport(f"{path}: no {SIDECAR_NAME} here: not a gdn-export output folder (make one with "
                          f"gdn-export MODEL -o {path})")
    try:
        meta = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataError(f"{p}: not readable JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise MetadataError(f"{p}: not a gdn-deploy export sidecar (format is {meta.get('format')!r})"
                            if isinstance(meta, dict) else f"{p}: not a JSON object")
    if meta.get("format_version") != FORMAT_VERSION:
        raise MetadataError(f"{p}: format_version {meta.get('format_version')!r}, this gdn-deploy reads "
                            f"{FORMAT_VERSION}; re-export the model")
    for key in ("model", "graphs", "profiles", "precision"):
        if key not in meta:
            raise MetadataError(f"{p}: missing key {key!r}")
    return meta


def graph_names(meta: Mapping[str, Any]) -> Sequence[str]:
    return list(meta["graphs"])
