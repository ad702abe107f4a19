"""Save an exported ``onnx_ir`` model with its big initializers streamed into the folder's shared weights file.

:func:`save_streamed` replaces ``onnxruntime``-style ``<graph>.onnx.data`` saving for exports whose weights do not
fit comfortably in memory or in a protobuf (eager exports above 1.5 GB, every lazy export): each initializer of at
least :data:`~.weights_file.INLINE_BYTES` bytes is materialised (a lazily loaded one is read from the checkpoint
now), appended to the :class:`~.weights_file.WeightsWriter` unless the same bytes are already there, released, and
replaced in the model by an external reference into that file. The folder's ``weights.data`` is thereby written
once, whatever the number of graphs: an export needs the weights' size on disk once (not once per graph plus the
shared copy), and resident memory holds one tensor at a time. A tensor whose ``meta[SOURCE_KEY]`` names its source
(a lazily exported parameter: checkpoint name and dtype) is read once per export: the next graph holding the same
source points at the range already written without reading the checkpoint again.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .weights_file import INLINE_BYTES, WeightsWriter

__all__ = ["save_streamed", "SOURCE_KEY"]


def _buffer(tensor: Any) -> memoryview | bytes:
    """The little-endian bytes of an onnx_ir tensor, without a copy where the value is already an array."""
    try:
        arr = np.ascontiguousarray(tensor.numpy())
        buf = memoryview(arr.reshape(-1).view(np.uint8))
    except (TypeError, ValueError, AttributeError):
        return tensor.tobytes()
    if arr.dtype.byteorder == ">" or len(buf) != tensor.nbytes:
        return tensor.tobytes()
    return buf


SOURCE_KEY = "gdn_source"      # tensor.meta[SOURCE_KEY]: where its bytes come from (lazy_export: checkpoint name, dtype)


def _source(tensor: Any) -> object:
    meta = getattr(tensor, "meta", None)
    return meta.get(SOURCE_KEY) if meta is not None else None


def save_streamed(ir_model: Any, path: str | os.PathLike, writer: WeightsWriter, *,
                  inline_bytes: int = INLINE_BYTES, progress: Any = None, label: str = "writing weights") -> int:
    """Save ``ir_model`` to ``path`` (in ``writer``'s folder) with every initializer of at least ``inline_bytes``
    bytes stored in ``writer``'s file. ``progress`` (a :class:`gdn_deploy.progress.Progress`) is told the bytes
    done of the total. Returns the bytes of those initializers (before deduplication)."""
    import onnx_ir as ir
    folder = Path(path).resolve().parent
    if writer.path.resolve().parent != folder:
        raise ValueError(f"save_streamed: {path} and the weights file {writer.path} must share a folder")
    values = [v for g in ir_model.graphs() for v in g.initializers.values()
              if v.const_value is not None and v.const_value.nbytes >= inline_bytes]
    total, done = sum(v.const_value.nbytes for v in values), 0
    if progress is not None:
        progress.begin(label)
    for v in values:
        t = v.const_value
        if isinstance(t, ir.ExternalTensor) and Path(t.path).resolve() == writer.path.resolve():
            done += t.nbytes
            continue
        source = _source(t)
        hit = writer.source_range(source)
        if hit is not None:            # e.g. the decode graph's copy of a checkpoint tensor prefill already wrote
            offset, length = hit
        else:
            buf = _buffer(t)
            offset, length = writer.add(buf, source=source)
            del buf
        v.const_value = ir.ExternalTensor(writer.name, offset, length, t.dtype, shape=t.shape,
                                          name=v.name, base_dir=str(folder))
        done += t.nbytes
        if progress is not None:
            progress.update(done, total)
    writer.flush()
    ir.save(ir_model, os.fspath(path))
    return total
