"""ONNX export of the gdn ops.

- :mod:`.onnx_schemas`   OpSchemas of gdn::GatedDeltaPrefill / GatedDeltaDecode from the spec
- :mod:`.onnx_functions` model-local function bodies (standard ONNX ops) so onnxruntime runs gdn nodes: the chunked
  prefill body of :mod:`.onnx_chunked` (default) or the token-by-token one; :mod:`.onnx_graph` builds their nodes
- :mod:`.onnx_ops`       translation table for torch.onnx.export(dynamo=True), export_program
- :mod:`.interop`        LinearAttention (com.microsoft / ONNX opset 27) translation for onnxruntime-only use
- :mod:`.targets`        what gets exported (ExportTarget) and its precision;  :mod:`.loading`  MODEL -> targets
- :mod:`.graphs`         the graphs as torch modules with flat I/O, their I/O plans, example feeds
- :mod:`.runtimes`       run a graph in PyTorch / onnxruntime, compare outputs with the spec tolerances
- :mod:`.verify`         reference feeds/outputs in an export folder and the check gdn-export and gdn-check share
- :mod:`.model_export`   export_model: graphs + gdn_model.json (:mod:`.metadata`) + reference files + check
- :mod:`.cli`, :mod:`.check_cli`  the gdn-export and gdn-check commands

The names below are imported lazily (importing this package does not import torch's exporter).
"""
from __future__ import annotations

_LAZY = {
    "register_schemas": "onnx_ops", "translation_table": "onnx_ops", "add_function_bodies": "onnx_ops",
    "export_program": "onnx_ops", "run_onnxruntime": "runtimes", "gdn_nodes": "onnx_ops",
    "export_model": "model_export", "ExportOptions": "model_export", "load_targets": "loading",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
