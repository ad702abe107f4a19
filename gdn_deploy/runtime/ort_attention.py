"""The attention form onnxruntime runs a folder's graphs in, chosen per execution provider at session load.

A hybrid folder's onnxruntime graphs hold one ``com.microsoft::GroupQueryAttention`` per attention layer, which
updates the KV caches in place (:mod:`.ort_binding`); the graph computes the node's ``total_sequence_length`` (a
host-side scalar input of the op) from the positions: max(past) + L. On the CUDA provider of onnxruntime-gpu
1.31.1 the node then gives wrong outputs: NaN, or a norm-relative error of ~0.8 against the CPU provider, in
prefill (64 to 1024 tokens) and in decode, with its flash and memory-efficient kernels alike. The same node fed the
same inputs in a session of its own matches float64 to 2e-4, and the whole graph is right (2.3e-3 from the CPU
provider in fp16, like every other form) when ``total_sequence_length`` comes from a graph input on the host
instead of from the GPU (docs/models.md, "onnxruntime's CUDA provider"). So the CUDA provider loads graphs in one
of two rewritten forms, in memory (the files on disk are unchanged, the weights are read from the folder through
``session.model_external_initializers_file_folder_path``):

- ``host_total`` (prefill and decode, when the graph takes ``positions``): every GroupQueryAttention reads
  ``total_sequence_length`` from one extra graph input, :data:`TOTAL_INPUT` (int32 scalar), which the runtime
  computes on the host from the feed (:func:`host_total`). Caches stay in place, the fused kernels run.
- ``expanded`` (other graphs, e.g. verify): every GroupQueryAttention becomes the form the TensorRT copies hold
  (``ScatterND`` row writes + the standard ONNX ``Attention``, opset 23:
  :func:`gdn_deploy.export.onnx_cache_attention.expand_cache_attention`); caches are not updated in place
  (:class:`~.ort_binding.BoundStates` keeps two buffers per cache) and onnxruntime's CUDA ``Attention`` forms the
  [L, S] scores of every head.

Other providers load the graphs as exported (``exported``).

The CUDA provider also loads each ``gdn::GatedDeltaPrefill`` node with the ``linear_attention`` function body
(:func:`gdn_deploy.export.onnx_functions.make_function`: the packed rows in a padded per-sequence view through
onnxruntime's fused ``com.microsoft::LinearAttention``, whose float16 K = V = 128 form is a chunked tensor-core
kernel) instead of the chunked body of standard ops the file holds, which onnxruntime runs as hundreds of small
kernels and whose per-chunk matrices set the memory of a long prefill (:data:`PREFILL_BODIES`, :func:`default_prefill_body`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["FORMS", "PREFILL_BODIES", "TOTAL_INPUT", "default_form", "default_prefill_body", "graph_session",
           "host_total"]

FORMS = ("exported", "host_total", "expanded")
PREFILL_BODIES = ("exported", "linear_attention")   # the gdn prefill body a session loads
TOTAL_INPUT = "gqa_total_sequence_length"
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
_REWRITE_ON = frozenset({"CUDAExecutionProvider"})


def default_form(providers: Sequence, graph: str) -> str:
    """The form graph ``graph`` loads in on ``providers`` (names or (name, options)): see the module docstring."""
    from ..export.runtimes import provider_names
    if not _REWRITE_ON.intersection(provider_names(providers)):
        return "exported"
    return "host_total" if graph in ("prefill", "decode") else "expanded"


def default_prefill_body(providers: Sequence) -> str:
    """The gdn prefill body graphs load with on ``providers``: ``linear_attention`` on the CUDA provider where
    onnxruntime has ``com.microsoft::LinearAttention``, else ``exported``."""
    from ..export.onnx_functions import onnxruntime_has_linear_attention
    from ..export.runtimes import provider_names
    on_cuda = bool(_REWRITE_ON.intersection(provider_names(providers)))
    return "linear_attention" if on_cuda and onnxruntime_has_linear_attention() else "exported"


def _la_prefill(model) -> bool:
    """Give ``model``'s gdn prefill nodes the LinearAttention body (in place); False, ``model`` unchanged, where
    it has none or their value heads are not static."""
    import onnx

    from ..export.onnx_functions import LA_BODY, add_function_bodies, decode_function_body, function_body
    body = function_body(model)
    if body in (None, LA_BODY):
        return body == LA_BODY
    trial = onnx.ModelProto()
    trial.CopyFrom(model)                      # weights are external: a copy of the graph only
    try:
        add_function_bodies(trial, LA_BODY, decode_function_body(trial) or "ops")
    except ValueError:
        return False
    model.CopyFrom(trial)
    return True


def host_total(feed: Mapping[str, Tensor]) -> Tensor:
    """:data:`TOTAL_INPUT` for a prefill or decode feed: max(past) + L, as the graphs compute it (prefill: past =
    each sequence's first position, L = the padded view's width; decode: past = the positions, L = 1)."""
    pos = feed["positions"].detach().cpu().to(torch.long)
    if "pad_index" in feed:
        cu = feed["cu_seqlens"].detach().cpu().to(torch.long)
        past = pos[cu[:-1].clamp(max=max(int(pos.shape[0]) - 1, 0))] if pos.numel() else pos
        width = int(feed["pad_index"].shape[1])
    else:
        past, width = pos, 1
    top = int(past.max()) if past.numel() else 0
    return torch.tensor(top + width, dtype=torch.int32)


def _rewrite(model, form: str) -> int:
    """Rewrite ``model`` (in place) into ``form``; the count of GroupQueryAttention nodes changed."""
    from onnx import TensorProto, helper

    from ..export.onnx_cache_attention import GQA_DOMAIN, expand_cache_attention
    if form == "expanded":
        return expand_cache_attention(model)
    g = model.graph
    if not any(i.name == "positions" for i in g.input):
        return 0
    count = 0
    for n in g.node:
        if n.domain == GQA_DOMAIN and n.op_type == "GroupQueryAttention" and len(n.input) >= 7:
            n.input[6] = TOTAL_INPUT
            count += 1
    if count:
        g.input.append(helper.make_tensor_value_info(TOTAL_INPUT, TensorProto.INT32, []))
    return count


def graph_session(path: Path, providers: Sequence, options, form: str, prefill_body: str = "exported"):
    """(an onnxruntime session of graph file ``path``, the attention form it was loaded in, its gdn prefill body).
    ``form``: one of FORMS; a graph without GroupQueryAttention nodes (or, for ``host_total``, without a
    ``positions`` input, then expanded) loads from its file as it is. ``prefill_body``: one of PREFILL_BODIES; the
    body given is ``exported`` where the graph has no prefill node or its value heads are not static, or where this
    onnxruntime cannot load the linear_attention body (then the graph loads again with the file's body)."""
    import onnx
    import onnxruntime as ort

    from ..export.runtimes import session_settings
    if form not in FORMS:
        raise ValueError(f"attention form {form!r}: expected one of {FORMS}")
    if prefill_body not in PREFILL_BODIES:
        raise ValueError(f"prefill body {prefill_body!r}: expected one of {PREFILL_BODIES}")
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False) if form != "exported" or prefill_body != "exported" \
        else None
    changed = False
    if model is not None and form != "exported":
        changed = bool(_rewrite(model, form))
        if not changed:
            changed = form == "host_total" and bool(_rewrite(model, "expanded"))
            form = "expanded" if changed else "exported"
    if model is not None and prefill_body != "exported":
        if _la_prefill(model):
            changed = True
        else:
            prefill_body = "exported"
    if not changed:
        return ort.InferenceSession(str(path), options, **session_settings(providers)), "exported", "exported"
    folder = str(path.parent.resolve())
    try:
        known = options.get_session_config_entry(EXTERNAL_FOLDER_KEY)
    except Exception:  # noqa: BLE001  (onnxruntime raises when the entry is not set)
        known = None
    if known != folder:
        options.add_session_config_entry(EXTERNAL_FOLDER_KEY, folder)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options, **session_settings(providers))
    except Exception:  # noqa: BLE001  (onnxruntime's own error types)
        if prefill_body == "exported":
            raise
        return graph_session(path, providers, options, form, "exported")
    return sess, form, prefill_body
