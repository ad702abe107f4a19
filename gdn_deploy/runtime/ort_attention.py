"""The attention form onnxruntime runs a folder's graphs in, chosen per execution provider at session load.

A hybrid folder's onnxruntime graphs hold one ``com.microsoft::GroupQueryAttention`` per attention layer, which
updates the KV caches in place (:mod:`.ort_binding`). On the CUDA provider of onnxruntime-gpu 1.31.1 that node gives
wrong outputs inside these graphs: NaN, or a norm-relative error of ~0.8 against the CPU provider, in prefill (64 to
1024 tokens, with or without spare cache slots) and in decode, with its flash and memory-efficient kernels alike;
the same node fed the same inputs in a session of its own matches float64 to 2e-4 (docs/models.md, "onnxruntime's
CUDA provider"). So a session on the CUDA provider loads each graph with every GroupQueryAttention expanded into the
form the TensorRT copies hold (``ScatterND`` row writes + the standard ONNX ``Attention``, opset 23:
:func:`gdn_deploy.export.onnx_cache_attention.expand_cache_attention`), in memory: the files on disk are unchanged
and the weights are read from the folder (``session.model_external_initializers_file_folder_path``). Its caches
are not updated in place: :class:`~.ort_binding.BoundStates` then keeps two buffers per cache, as for GDN states.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

__all__ = ["EXPAND_ON_PROVIDERS", "expand_attention_default", "graph_session"]

EXPAND_ON_PROVIDERS = frozenset({"CUDAExecutionProvider"})
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def _names(providers: Sequence) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers]


def expand_attention_default(providers: Sequence) -> bool:
    """True when ``providers`` (names or (name, options)) put graphs on a provider listed in EXPAND_ON_PROVIDERS."""
    return bool(EXPAND_ON_PROVIDERS & set(_names(providers)))


def graph_session(path: Path, providers: Sequence, options, expand: bool):
    """(an onnxruntime session of graph file ``path``, whether its GroupQueryAttention nodes were expanded).
    ``expand``: load the graph with them expanded (see the module docstring); a graph without such nodes loads
    from its file as it is."""
    import onnx
    import onnxruntime as ort

    from ..export.onnx_cache_attention import expand_cache_attention
    from ..export.runtimes import session_settings
    path = Path(path)
    model: Optional[onnx.ModelProto] = None
    if expand:
        model = onnx.load(str(path), load_external_data=False)
        if not expand_cache_attention(model):
            model = None
    if model is None:
        return ort.InferenceSession(str(path), options, **session_settings(providers)), False
    folder = str(path.parent.resolve())
    try:
        known = options.get_session_config_entry(EXTERNAL_FOLDER_KEY)
    except Exception:  # noqa: BLE001  (onnxruntime raises when the entry is not set)
        known = None
    if known != folder:
        options.add_session_config_entry(EXTERNAL_FOLDER_KEY, folder)
    return ort.InferenceSession(model.SerializeToString(), options, **session_settings(providers)), True
