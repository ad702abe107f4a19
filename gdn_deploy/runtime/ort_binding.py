"""Every layer's state kept on one device and bound to onnxruntime through IOBinding: KV caches updated in place,
GDN states ping-ponged, nothing copied to or from the host between steps.

A whole hybrid folder's onnxruntime graphs hold one ``com.microsoft::GroupQueryAttention`` per attention layer whose
past and present caches have one shape ``[B, Hkv, S, D]`` (the sidecar's ``attention.onnxruntime``). Its kernels
(CPU and CUDA) test whether ``past_key`` and ``present_key`` (and the values) are one buffer: then they write only
the new rows at each sequence's position and leave the rest of the cache as it is; else they clear the present
cache and copy the past into it on every call. :class:`BoundStates` binds each KV cache tensor as both the graph
input and the graph output, so a decode step writes one row per sequence. That is done only where the graph feeds
the cache input straight into the node's past input and returns the node's present output as the graph output
(:func:`in_place_caches`): no other op ever reads a buffer that is being written.

A GDN recurrent state that the graph feeds only into a ``com.microsoft::LinearAttention`` node's past_state
(directly, through the gdn node's function body, or through a float32 Cast) and returns as that node's
present_state is also bound as both input and output on the CPU provider (:func:`in_place_recurrent`): onnxruntime's
CPU kernel (1.32) then updates the state where it is instead of first copying 16 MB per layer at batch 16
(``[16, 16, 128, 128]`` float32) into a fresh output; the single-node step costs half. Every other GDN state (conv
states, the standard-op decode body, prefill bodies, the CUDA provider, whose kernels' aliasing is not documented)
has two preallocated tensors, one bound as the input and the other as the output, exchanged after every call.
Logits are written into a preallocated tensor. The tensors are torch tensors on the backend's state device
(``cpu``, or ``cuda`` under the CUDA provider), bound by pointer, so the same code serves both providers.

Folders whose onnxruntime graphs use the standard-Attention form (head sizes GroupQueryAttention refuses), bf16
folders on the CPU provider (their graphs are rewritten with casts at the state inputs), pure-GDN ``lm`` folders
and non-onnxruntime backends keep the tensor-in, tensor-out path: :func:`bound_states_for` returns None for them.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import Tensor

from .folder import ExportFolder, StateSpec
from .ort_attention import TOTAL_INPUT
from .states import StateHolder

__all__ = ["BoundStates", "bound_states_for", "in_place_caches", "in_place_recurrent", "GQA_OP"]

GQA_OP = "com.microsoft::GroupQueryAttention"
_ONNX_TYPE = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int32: 6, torch.int64: 7, torch.bool: 9,
              torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}
_TORCH_TYPE = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


def _graph_model(path_or_model):
    """The ModelProto of a graph file (its external weights not loaded), or the ModelProto given."""
    import onnx
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    return onnx.load(str(path_or_model), load_external_data=False)


def _data_readers(nodes) -> dict[str, list]:
    """Tensor name -> the (node, input index) pairs that read its data (Shape/Size read only its shape)."""
    readers: dict[str, list] = {}
    for n in nodes:
        if n.domain in ("", "ai.onnx") and n.op_type in ("Shape", "Size"):
            continue
        for j, x in enumerate(n.input):
            if x:
                readers.setdefault(x, []).append((n, j))
    return readers


def in_place_caches(path, states: list[StateSpec], graph: str) -> bool:
    """True when graph file ``path`` (or its ModelProto) feeds every attention state input straight into a
    GroupQueryAttention's past_key/past_value and returns that node's present_key/present_value as the state's output
    (both bindable to one buffer) and nothing else reads the cache's data, and every state name is a graph input and
    output."""
    g = _graph_model(path).graph
    ins, outs = {i.name for i in g.input}, {o.name for o in g.output}
    names = [(s.prefill_input, s.prefill_output) if graph == "prefill" else (s.decode_input, s.decode_output)
             for s in states]
    if any(i not in ins or o not in outs for i, o in names):
        return False
    pairs = set()
    for n in g.node:
        if n.domain == "com.microsoft" and n.op_type == "GroupQueryAttention" and len(n.input) >= 5 \
                and len(n.output) >= 3:
            pairs.update({(n.input[3], n.output[1]), (n.input[4], n.output[2])})
    readers = _data_readers(g.node)
    for s, (i, o) in zip(states, names):
        if s.kind == "attention" and ((i, o) not in pairs or len(readers.get(i, ())) != 1):
            return False
    return True


def _la_past(scope, nodes, functions, readers: dict, name: str, depth: int = 0):
    """The LinearAttention node whose past_state is tensor ``name`` of ``nodes`` and the name of its present_state
    output in ``nodes``' scope, when that node (reached directly, through one float32 Cast, or inside the function
    body of a node in ``functions``) is the only reader of ``name``'s data; else None. ``scope``: the main graph
    (None) or the function's (domain, name, overload); ``readers``: each scope's :func:`_data_readers`, filled on first use."""
    if scope not in readers:
        readers[scope] = _data_readers(nodes)
    found = readers[scope].get(name, [])
    if len(found) != 1 or depth > 3:
        return None
    n, j = found[0]
    if n.domain == "com.microsoft" and n.op_type == "LinearAttention":
        return (n, n.output[1]) if j == 3 and len(n.output) > 1 else None
    if n.domain in ("", "ai.onnx") and n.op_type == "Cast":
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        return _la_past(scope, nodes, functions, readers, n.output[0], depth + 1) if to == 1 else None   # float32
    key = (n.domain, n.op_type, n.overload)
    f = functions.get(key)
    if f is None or j >= len(f.input):
        return None
    inner = _la_past(key, f.node, functions, readers, f.input[j], depth + 1)
    if inner is None or inner[1] not in f.output:
        return None
    return inner[0], n.output[list(f.output).index(inner[1])]


def in_place_recurrent(path, states: list[StateSpec], graph: str) -> frozenset:
    """The float32 GDN recurrent states (by decode input name) that graph file ``path`` (or its ModelProto) reads
    only as a LinearAttention node's past_state and returns straight as that node's present_state: bound as one
    buffer, the CPU kernel updates them where they are."""
    m = _graph_model(path)
    g = m.graph
    ins, outs = {i.name for i in g.input}, {o.name for o in g.output}
    functions = {(f.domain, f.name, f.overload): f for f in m.functions}
    readers: dict = {}
    found = set()
    for s in states:
        if s.kind != "gdn" or s.role != "recurrent" or s.dtype not in ("float32", "float"):
            continue
        i, o = (s.prefill_input, s.prefill_output) if graph == "prefill" else (s.decode_input, s.decode_output)
        if i not in ins or o not in outs:
            continue
        hit = _la_past(None, g.node, functions, readers, i)
        if hit is not None and hit[1] == o:
            found.add(s.decode_input)
    return frozenset(found)


def bound_states_for(folder: ExportFolder, backend) -> Optional["BoundStates"]:
    """A :class:`BoundStates` for ``backend`` when it is onnxruntime with ``bind_states`` on and the folder's
    prefill continues from its states; None otherwise (the caller keeps tensors in and out). Caches are updated
    in place in the graphs that allow it (:func:`in_place_caches`; not in graphs loaded with their attention
    expanded, :mod:`.ort_attention`), else exchanged between two buffers like GDN states."""
    if getattr(backend, "name", "") != "onnxruntime" or not getattr(backend, "bind_states", False):
        return None
    if getattr(backend, "bf16_cpu", False) or folder.kind != "hybrid" or not folder.prefill_continues:
        return None
    attn = (folder.meta.get("attention") or {}).get("onnxruntime")
    has_attention = any(s.kind == "attention" for s in folder.states)
    if has_attention and (not attn or attn.get("op") != GQA_OP):
        return None
    cache = backend.in_place_graphs             # graph -> caches updated in place, checked once per backend
    recurrent = backend.in_place_recurrent      # graph -> GDN recurrent states updated in place
    on_cpu = torch.device(getattr(backend, "state_device", "cpu")).type == "cpu"
    for g in ("prefill", "decode"):
        if g not in cache:
            backend._open(g)
            model = _graph_model(folder.graph_file(g))     # the file's graph, read once for both checks
            cache[g] = backend.forms.get(g) != "expanded" and in_place_caches(model, folder.states, g)
            recurrent[g] = in_place_recurrent(model, folder.states, g) \
                if on_cpu and backend.prefill_bodies.get(g, "exported") == "exported" else frozenset()
        if not cache[g] and backend.forms.get(g) != "expanded":
            return None
    return BoundStates(folder, backend)


class BoundStates(StateHolder):
    """The states of a batch of sequences on the backend's state device, bound to its sessions' inputs/outputs
    (the :class:`~gdn_deploy.runtime.states.StateHolder` interface).

    :meth:`load` takes states (by decode input name, as a prefill feed or :meth:`state_dict` gives them),
    :meth:`run` runs a graph on its other inputs and returns its other outputs (logits, ...), leaving the updated
    states here; ``select`` keeps some batch rows; ``state_dict`` returns the current tensors (no copy)."""

    def __init__(self, folder: ExportFolder, backend):
        self.folder, self.backend = folder, backend
        self.device = torch.device(getattr(backend, "state_device", "cpu"))
        self.current: dict[str, Tensor] = {}     # by decode input name
        self.spare: dict[str, Tensor] = {}       # states not updated in place: the next call's output buffers
        self.in_place = dict(backend.in_place_graphs)     # graph -> its caches are updated in place
        self.in_place_recurrent = dict(backend.in_place_recurrent)   # graph -> GDN states updated in place

    # ---- state -----------------------------------------------------------------------------------
    def load(self, states: Mapping[str, Tensor]) -> None:
        """Take ``states`` (by decode input name; prefill input names are the same in hybrid folders) as the
        current states. Tensors already on the device and contiguous are used as they are (no copy)."""
        self.current, self.spare = {}, {}
        for s in self.folder.states:
            x = states[s.decode_input] if s.decode_input in states else states[s.prefill_input]
            x = x.to(self.device).contiguous()
            self.current[s.decode_input] = x
            if s.kind != "attention" or not all(self.in_place.values()):
                self.spare[s.decode_input] = torch.empty_like(x)

    # ---- running -----------------------------------------------------------------------------------
    def _bind(self, binding, name: str, t: Tensor, output: bool) -> None:
        dev = t.device
        args = (name, dev.type, dev.index or 0, _ONNX_TYPE[t.dtype], list(t.shape), t.data_ptr())
        (binding.bind_output if output else binding.bind_input)(*args)

    def run(self, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Run ``graph`` ("prefill" or "decode") on ``feed`` (its non-state inputs; state inputs in it are
        ignored) and the current states; the states become the graph's outputs. Returns the non-state outputs
        (logits on the state device, others on the CPU)."""
        sess = self.backend._open(graph)
        feed = self.backend.graph_feed(graph, feed)
        binding = sess.io_binding()
        keep = []
        state_in = {(s.prefill_input if graph == "prefill" else s.decode_input): s for s in self.folder.states}
        state_out = {(s.prefill_output if graph == "prefill" else s.decode_output): s for s in self.folder.states}
        for i in sess.get_inputs():
            if i.name in state_in:
                s = state_in[i.name]
                self._bind(binding, i.name, self.current[s.decode_input], False)
            else:
                t = feed[i.name]
                t = (t if i.name == TOTAL_INPUT else t.to(self.device)).contiguous()   # a host scalar stays there
                keep.append(t)
                self._bind(binding, i.name, t, False)
        results: dict[str, Tensor] = {}
        others, swap = [], []
        for o in sess.get_outputs():
            if o.name in state_out:
                s = state_out[o.name]
                if (s.kind == "attention" and self.in_place.get(graph, False)) or \
                        s.decode_input in self.in_place_recurrent.get(graph, ()):
                    buf = self.current[s.decode_input]
                else:
                    buf = self.spare[s.decode_input]
                    swap.append(s.decode_input)
                self._bind(binding, o.name, buf, True)
            elif o.name == "logits" and o.type in _TORCH_TYPE:
                n = self.logit_rows(graph, feed)
                results[o.name] = torch.empty((n, self.folder.vocab_size), dtype=_TORCH_TYPE[o.type],
                                              device=self.device)
                self._bind(binding, o.name, results[o.name], True)
            else:
                others.append(o.name)
                binding.bind_output(o.name, self.device.type, self.device.index or 0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)         # inputs written by torch before onnxruntime reads them
        sess.run_with_iobinding(binding)
        if self.device.type == "cuda":
            binding.synchronize_outputs()
        if others:                                      # outputs other than logits and states (rare)
            from ..export.runtimes import from_numpy
            bound = [o.name for o in sess.get_outputs()]
            for name, v in zip(bound, binding.get_outputs()):
                if name in others:
                    results[name] = from_numpy(v.numpy())
        for k in swap:                                  # this call's outputs are the next call's inputs
            self.current[k], self.spare[k] = self.spare[k], self.current[k]
        return results
