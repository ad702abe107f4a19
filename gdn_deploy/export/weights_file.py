"""One weights file per export folder: every graph (prefill, decode, decode_pool and their TensorRT copies) reads
its initializers from the same ``weights.data`` through ONNX external-data entries (``location``, ``offset``,
``length``).

:func:`share_weights` rewrites the ``.onnx`` files of a folder in place: each initializer of at least
:data:`INLINE_BYTES` bytes is looked up by the sha256 of its bytes; the first graph holding it appends it to the
weights file, every other graph (and every other initializer with the same bytes) points at the same range.
Identity is the content, not the name, so a constant the exporter folded or transposed differently per graph simply
gets its own range, and two names holding the same bytes share one. Smaller tensors (shape vectors, norm scales)
stay inline. Tensors are read one at a time (inline bytes from the graph, or a range of the graph's own
``<graph>.onnx.data``), so memory stays bounded by the largest tensor whatever the model size.

An export of big weights writes ``weights.data`` directly instead (:class:`WeightsWriter`, filled graph by graph by
:func:`gdn_deploy.export.stream_weights.save_streamed`) and passes the writer to :func:`share_weights`, which then
keeps those references and only appends what is left.

onnxruntime resolves ``location`` relative to the model file's folder (load graphs by path, not from bytes);
TensorRT's parser does the same with ``parse_from_file`` or ``parse(bytes, path)`` (docs/tensorrt.md).
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import onnx
from onnx import numpy_helper

__all__ = ["WEIGHTS_FILE", "INLINE_BYTES", "ALIGN_BYTES", "SharedWeights", "WeightsWriter", "share_weights",
           "external_locations", "initializer_refs"]

WEIGHTS_FILE = "weights.data"
INLINE_BYTES = 1024            # smaller initializers stay inside the graph (as onnx.save's default threshold)
ALIGN_BYTES = 4096             # tensors of 1 MiB or more start at a page boundary (mmap-friendly, as onnx.save does)
_ALIGN_FROM = 1 << 20


@dataclass
class SharedWeights:
    """What :func:`share_weights` did: the file, its size, the bytes the graphs reference, and counts."""
    path: Path
    file_bytes: int
    referenced_bytes: int          # sum over graphs and initializers of the bytes each reads (before sharing)
    unique_tensors: int
    references: int                # external initializers over all graphs
    graphs: list[str]


class WeightsWriter:
    """Appends tensors to one weights file, each distinct content once (sha256 of the bytes, as
    :func:`share_weights`), tensors of 1 MiB or more page-aligned. :meth:`add` returns the ``(offset, length)`` an
    external-data entry points at. An exporter streams every graph's initializers through one writer, so the
    folder's ``weights.data`` is written once, directly (no per-graph ``<graph>.onnx.data`` first); the file is
    complete after :meth:`close` (the export's staging folder makes the whole folder atomic)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = open(self.path, "wb")
        self.seen: dict[bytes, tuple[int, int]] = {}
        self.sources: dict[object, tuple[int, int]] = {}   # a tensor's source (e.g. its checkpoint name) -> range
        self.offset = 0
        self.written = 0               # bytes of tensor data written (without padding)

    @property
    def name(self) -> str:
        return self.path.name

    def source_range(self, source: object) -> tuple[int, int] | None:
        """The range of the tensor added with this ``source`` key, if any (so a caller can skip materialising it)."""
        return self.sources.get(source) if source is not None else None

    def add(self, data: bytes | memoryview, source: object = None) -> tuple[int, int]:
        """Append ``data`` unless the same bytes are there; ``source`` (hashable, optional) names where the bytes come
        from, for :meth:`source_range`: the same source must always give the same bytes."""
        key = hashlib.sha256(data).digest() + len(data).to_bytes(8, "little")
        hit = self.seen.get(key)
        if hit is not None:
            if source is not None:
                self.sources[source] = hit
            return hit
        if len(data) >= _ALIGN_FROM and self.offset % ALIGN_BYTES:
            pad = ALIGN_BYTES - self.offset % ALIGN_BYTES
            self._fh.write(b"\0" * pad)
            self.offset += pad
        self._fh.write(data)
        self.seen[key] = (self.offset, len(data))
        if source is not None:
            self.sources[source] = self.seen[key]
        self.offset += len(data)
        self.written += len(data)
        return self.seen[key]

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self) -> "WeightsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ext_info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and its subgraphs (Loop/If/Scan bodies), which may hold initializers too."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _graphs(g)


def _initializers(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for g in _graphs(model.graph):
        yield from g.initializer


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The external-data files (``location``) the initializers of ``model`` refer to."""
    return {_ext_info(t)["location"] for t in _initializers(model)
            if t.data_location == onnx.TensorProto.EXTERNAL}


def initializer_refs(model: onnx.ModelProto) -> dict[str, tuple[str, int, int]]:
    """Initializer name -> (location, offset, length) for the external ones."""
    out = {}
    for t in _initializers(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = _ext_info(t)
            out[t.name] = (info["location"], int(info.get("offset", 0)), int(info["length"]))
    return out


def _tensor_bytes(t: onnx.TensorProto, folder: Path) -> bytes:
    """The raw little-endian bytes of an initializer, read from its external file when it has one."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = _ext_info(t)
        path = folder / info["location"]
        offset, length = int(info.get("offset", 0)), info.get("length")
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(int(length)) if length is not None else fh.read()
        if length is not None and len(data) != int(length):
            raise ValueError(f"{path}: external data of {t.name!r} ends early ({len(data)} of {length} bytes)")
        return data
    if t.HasField("raw_data"):
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def _set_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                  "uint64_data"):
        t.ClearField(field)
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def _make_inline(t: onnx.TensorProto, data: bytes) -> None:
    del t.external_data[:]
    t.data_location = onnx.TensorProto.DEFAULT
    t.raw_data = data


def share_weights(folder: str | Path, graph_files: Sequence[str | Path], *, name: str = WEIGHTS_FILE,
                  inline_bytes: int = INLINE_BYTES, log: Callable[[str], None] = lambda s: None,
                  writer: WeightsWriter | None = None) -> SharedWeights:
    """Move the initializers of ``graph_files`` (ONNX files in ``folder``) into ONE shared file ``folder/name``.

    Without ``writer`` the weights file is written atomically (``*.tmp`` then rename). With an open
    :class:`WeightsWriter` (the exporter's, which already streamed the big initializers into its file), references
    to that file are kept as they are, any other initializer is appended to it, and the writer is closed. Graphs
    are rewritten only after the weights file is complete (``*.tmp`` then rename); the per-graph external-data
    files the graphs referred to before (e.g. ``prefill.onnx.data``) are deleted once no graph refers to them.
    Returns a :class:`SharedWeights` summary.
    """
    folder = Path(folder)
    paths = [folder / Path(p).name for p in graph_files]
    own = writer is None
    if own:
        target = folder / name
        tmp_weights = target.with_name(target.name + ".tmp")
        writer = WeightsWriter(tmp_weights)
    else:
        target, name, tmp_weights = writer.path, writer.name, None
    models: list[onnx.ModelProto] = []
    old_locations: set[str] = set()
    referenced = refs = 0
    t0 = time.perf_counter()
    try:
        with writer:
            for path in paths:
                model = onnx.load(str(path), load_external_data=False)
                old_locations |= external_locations(model)
                for t in _initializers(model):
                    if not own and t.data_location == onnx.TensorProto.EXTERNAL and _ext_info(t)["location"] == name:
                        referenced += int(_ext_info(t)["length"])      # streamed there by the exporter
                        refs += 1
                        continue
                    data = _tensor_bytes(t, folder)
                    if len(data) < inline_bytes:
                        if t.data_location == onnx.TensorProto.EXTERNAL:
                            _make_inline(t, data)
                        continue
                    _set_external(t, name, *writer.add(data))
                    referenced += len(data)
                    refs += 1
                    del data
                models.append(model)
                log(f"  {path.name}: initializers -> {name} ({len(writer.seen)} distinct tensors, "
                    f"{writer.offset / 1e6:.1f} MB so far, {time.perf_counter() - t0:.1f} s)")
        if tmp_weights is not None:
            os.replace(tmp_weights, target)
        for path, model in zip(paths, models):
            tmp = path.with_name(path.name + ".tmp")
            onnx.save_model(model, str(tmp))
            os.replace(tmp, path)
    finally:
        if tmp_weights is not None and tmp_weights.exists():
            tmp_weights.unlink()
    for loc in sorted(old_locations - {name}):
        stale = folder / loc
        if stale.is_file():
            stale.unlink()
    return SharedWeights(target, target.stat().st_size, referenced, len(writer.seen), refs, [p.name for p in paths])
