"""Is an export folder whole and its own? The sidecar's ``files`` and ``sidecar_sha256`` against what is on disk.

:func:`verify_folder` raises :class:`~gdn_deploy.errors.LoadError` (exit code 3) with one line naming the first file
that does not match:

- the sidecar's own checksum (``sidecar_sha256``): an edited ``gdn_model.json``;
- every file listed in ``files``: present, of the recorded size and, with ``hashes``, of the recorded sha256
  (``gdn-check`` hashes; loading a folder to run it checks sizes only: hashing GBs of weights on every load is slow);
- every file the sidecar names (graphs, TensorRT copies, reference files, tokenizer) is one of ``files``;
- each graph's ONNX inputs and outputs (read without external data) have the sidecar's names, order, dtypes and
  shapes (ints and dim symbols), and every state tensor of a hybrid sidecar is one of them with the same shape.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import LoadError
from . import metadata as md

__all__ = ["verify_folder", "check_graph_io"]

_DTYPES = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "float64": "DOUBLE", "int64": "INT64",
           "int32": "INT32", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}


def _named_files(meta: Mapping[str, Any]) -> list[str]:
    names = []
    for info in meta.get("graphs", {}).values():
        names += [info.get("file"), info.get("tensorrt_file")]
        check = info.get("check") or {}
        names += [check.get("inputs"), check.get("reference")]
    names.append(meta.get("tokenizer"))
    return [n for n in names if n]


def _reference_names(meta: Mapping[str, Any]) -> set[str]:
    return {n for info in meta.get("graphs", {}).values() for n in
            ((info.get("check") or {}).get("inputs"), (info.get("check") or {}).get("reference")) if n}


def _check_files(outdir: Path, meta: Mapping[str, Any], hashes: bool, skip: set[str]) -> None:
    sidecar = outdir / md.SIDECAR_NAME
    files = meta.get("files")
    if not isinstance(files, dict) or "sidecar_sha256" not in meta:
        raise LoadError(f"{sidecar}: lists no file checksums (written by hand or by an older gdn-deploy); re-export "
                        "the model with gdn-export")
    if meta["sidecar_sha256"] != md.sidecar_digest(meta):
        raise LoadError(f"{sidecar}: was edited after the export (its sidecar_sha256 does not match its content); "
                        "re-export the model with gdn-export")
    for name in _named_files(meta):
        if name not in files and name not in skip:
            raise LoadError(f"{outdir / name}: named in {md.SIDECAR_NAME} but not among its checksummed files; "
                            "re-export the model")
    refs = _reference_names(meta)
    for name, want in files.items():
        if name in skip:
            continue
        path = outdir / name
        if Path(name).name != name or not path.is_file():
            fix = "re-export, or rewrite the reference files with gdn-check --from-model" if name in refs else \
                "re-export"
            raise LoadError(f"{outdir}: incomplete export: {name} missing (listed in {md.SIDECAR_NAME}); {fix}")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise LoadError(f"{path}: {size} bytes, the export wrote {want.get('bytes')} (truncated, replaced or "
                            "from another export); re-export or copy the folder again")
        if hashes and md.file_digest(path)["sha256"] != want.get("sha256"):
            raise LoadError(f"{path}: its sha256 differs from the one the export recorded (changed or from another "
                            "export); re-export or copy the folder again")


def _dims(vi) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None))
    return out


def _same_shape(got: list, want: list) -> bool:
    if len(got) != len(want):
        return False
    return all(g is None or str(g).replace(" ", "") == str(w).replace(" ", "") for g, w in zip(got, want))


def check_graph_io(path: Path, info: Mapping[str, Any]) -> dict[str, list]:
    """The graph file's inputs and outputs against the sidecar's entry ``info``; returns {name: shape} of its I/O."""
    import onnx
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001  (protobuf raises several kinds on a truncated or foreign file)
        raise LoadError(f"{path}: not a readable ONNX model ({type(e).__name__}: truncated or corrupt?); re-export "
                        "the model") from None
    shapes = {}
    for role, got, want in (("inputs", model.graph.input, info.get("inputs", [])),
                            ("outputs", model.graph.output, info.get("outputs", []))):
        got_names, want_names = [v.name for v in got], [t.get("name") for t in want]
        if got_names != want_names:
            raise LoadError(f"{path}: its {role} {got_names} are not the {role} {want_names} that "
                            f"{md.SIDECAR_NAME} lists; the graph and the sidecar are of different exports")
        for v, t in zip(got, want):
            shape = _dims(v)
            shapes[v.name] = shape
            dtype = onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)
            if "dtype" in t and _DTYPES.get(t["dtype"], t["dtype"]) != dtype:
                raise LoadError(f"{path}: {role[:-1]} {v.name} is {dtype}, {md.SIDECAR_NAME} says {t['dtype']}; the "
                                "graph and the sidecar are of different exports")
            if "shape" in t and not _same_shape(shape, list(t["shape"])):
                raise LoadError(f"{path}: {role[:-1]} {v.name} has shape {shape}, {md.SIDECAR_NAME} says {t['shape']}; "
                                "the graph and the sidecar are of different exports")
    return shapes


def _check_states(outdir: Path, meta: Mapping[str, Any], io: Mapping[str, Mapping[str, list]]) -> None:
    for s in meta.get("states") or []:
        for graph, key, shape_key in (("prefill", "prefill_output", "prefill_shape"),
                                      ("decode", "decode_input", "decode_shape"),
                                      ("decode", "decode_output", "decode_shape")):
            if graph not in io:
                continue
            name = s.get(key)
            if name not in io[graph]:
                raise LoadError(f"{outdir / md.SIDECAR_NAME}: state {key} {name!r} is not an I/O tensor of "
                                f"{meta['graphs'][graph]['file']}")
            if shape_key in s and not _same_shape(io[graph][name], list(s[shape_key])):
                raise LoadError(f"{outdir / md.SIDECAR_NAME}: state {name} has {shape_key} {s[shape_key]}, the graph "
                                f"{meta['graphs'][graph]['file']} has {io[graph][name]}")


def verify_folder(outdir: str | Path, meta: Mapping[str, Any], *, hashes: bool = False,
                  graphs: Iterable[str] | None = None, skip_references: bool = False) -> int:
    """Check an export folder against its sidecar (see the module doc); returns the number of files checked.
    ``graphs``: whose ONNX I/O to read (default: all); ``skip_references``: leave out the reference files (they
    are about to be rewritten: ``gdn-check --from-model``)."""
    outdir = Path(outdir)
    _check_files(outdir, meta, hashes, _reference_names(meta) if skip_references else set())
    io = {}
    for g in (list(meta["graphs"]) if graphs is None else graphs):
        io[g] = check_graph_io(outdir / meta["graphs"][g]["file"], meta["graphs"][g])
    _check_states(outdir, meta, io)
    return len(meta["files"])
