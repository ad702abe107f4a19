"""Where a batch's states live between graph calls: one interface, two holders.

A state holder keeps every layer's state of a batch of sequences (by decode input name) and runs the folder's
graphs on them: :meth:`StateHolder.start` (zero states) or :meth:`~StateHolder.load` (given states),
``run(graph, feed)`` (``feed``: the graph's other inputs; returns its other outputs, the states stay in the holder),
:meth:`~StateHolder.select` (keep some batch rows), :meth:`~StateHolder.state_dict` /
:meth:`~StateHolder.prefill_states` (the current tensors by decode / prefill input name).

- :class:`TensorStates`: states passed to ``backend.run`` as tensors and taken from its outputs (every backend);
- :class:`~gdn_deploy.runtime.ort_binding.BoundStates`: onnxruntime, states bound in place through IOBinding.

:func:`gdn_deploy.runtime.generation.state_holder` picks one for a backend.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from ..lm.model import padded_view, scatter_packed
from .folder import ExportFolder

__all__ = ["STATE_DTYPES", "StateHolder", "TensorStates", "empty_state_feed", "decode_states_after_prefill",
           "last_token_logits", "pack_prompts", "prefill_feed"]

STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def empty_state_feed(folder: ExportFolder, n: int, capacity: int, device=None) -> dict[str, Tensor]:
    """Zero prefill state inputs of ``n`` sequences (KV caches of ``capacity`` slots) by prefill input name."""
    out = {}
    for s in folder.states:
        if s.prefill_input:
            shape = [n if d == "B" else capacity if d == "S" else int(d) for d in s.decode_shape]
            out[s.prefill_input] = torch.zeros(shape, dtype=STATE_DTYPES[s.dtype], device=device)
    return out


def pack_prompts(prompts: Sequence[Sequence[int]], device=None) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids [T] int64, cu_seqlens [N+1] int32, positions [T] int64) of the prompts concatenated."""
    ids = torch.tensor([int(t) for p in prompts for t in p], dtype=torch.long, device=device)
    cu = [0]
    for p in prompts:
        cu.append(cu[-1] + len(p))
    pos = torch.tensor([j for p in prompts for j in range(len(p))], dtype=torch.long, device=device)
    return ids, torch.tensor(cu, dtype=torch.int32, device=device), pos


def prefill_feed(folder: ExportFolder, ids: Tensor, cu: Tensor, pos: Tensor) -> dict[str, Tensor]:
    """The prefill graph's inputs other than the states for packed prompts (``pos``: each token's position)."""
    feed = {"input_ids": ids, "cu_seqlens": cu}
    if folder.has_positions:
        feed["positions"] = pos
    if folder.prefill_continues:
        feed["pad_index"] = padded_view(cu, ids.device)
    return feed


def decode_states_after_prefill(folder: ExportFolder, out: dict, cu: Tensor, capacity: int) -> dict[str, Tensor]:
    """The decode graph's state inputs from a prefill's outputs (by decode input name)."""
    states: dict[str, Tensor] = {}
    for s in folder.states:
        x = out[s.prefill_output]
        old_form = s.kind == "attention" and not s.prefill_input   # earlier folders: packed keys/values
        states[s.decode_input] = scatter_packed(x, cu.to(x.device), capacity) if old_form else x
    return states


def last_token_logits(logits: Tensor, cu: Tensor) -> Tensor:
    """Each sequence's last-token logits ``[N, vocab]`` from a prefill's logits (every token's, ``[T, vocab]``,
    under ``--all-logits``; kept as they are when already one row per sequence)."""
    if logits.shape[0] != cu.shape[0] - 1:
        logits = logits.index_select(0, (cu[1:].long() - 1).to(logits.device))
    return logits


class StateHolder:
    """The part of the interface both holders share; subclasses define ``load`` and ``run``."""

    folder: ExportFolder
    backend: object                          # what runs the graphs (backends.py)
    device: torch.device                     # where the states live
    current: dict[str, Tensor]               # by decode input name
    capacity: Optional[int] = None           # KV slots given to start()

    def start(self, n: int, capacity: int) -> None:
        """Zero states of ``n`` sequences with KV caches of ``capacity`` slots."""
        self.load(empty_state_feed(self.folder, n, capacity, self.device))
        self.capacity = capacity

    def load(self, states: Mapping[str, Tensor]) -> None:
        raise NotImplementedError

    def select(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` (finished sequences leave the batch)."""
        rows = rows.to(self.device)
        self.load({k: v.index_select(0, rows) for k, v in self.current.items()})

    def state_dict(self) -> dict[str, Tensor]:
        """The current states by decode input name: the holder's tensors, not copies (a bound holder's later runs
        write into them: clone what must outlive them)."""
        return dict(self.current)

    def prefill_states(self) -> dict[str, Tensor]:
        """The current states by prefill input name (what :func:`.conversation.prefill` takes back)."""
        return {s.prefill_input: self.current[s.decode_input] for s in self.folder.states}

    @property
    def batch(self) -> int:
        return int(next(iter(self.current.values())).shape[0]) if self.current else 0

    def logit_rows(self, graph: str, feed: Mapping[str, Tensor]) -> int:
        """Rows of ``graph``'s logits on ``feed``: every prompt token's for a prefill exported with
        ``--all-logits``, else one per sequence."""
        if graph == "prefill" and self.folder.meta.get("generation", {}).get("prefill_logits") == "all":
            return int(feed["input_ids"].shape[0])
        return self.batch

    def _names(self, graph: str) -> list[tuple[Optional[str], str]]:
        """(graph input, graph output) name of every state in ``graph``."""
        return [(s.prefill_input, s.prefill_output) if graph == "prefill" else (s.decode_input, s.decode_output)
                for s in self.folder.states]


class TensorStates(StateHolder):
    """States passed to ``backend.run`` with the feed and replaced by its outputs (any backend)."""

    def __init__(self, folder: ExportFolder, backend):
        self.folder, self.backend = folder, backend
        self.device = torch.device(backend.device)
        self.current = {}

    def load(self, states: Mapping[str, Tensor]) -> None:
        """Take ``states`` (by decode or prefill input name) as the current states."""
        self.current = {}
        for s in self.folder.states:
            x = states.get(s.decode_input, states.get(s.prefill_input) if s.prefill_input else None)
            if x is not None:                # an earlier folder's prefill takes no attention state
                self.current[s.decode_input] = x.to(self.device)

    def run(self, graph: str, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Run ``graph`` ("prefill" or "decode") on ``feed`` and the current states; the states become its state
        outputs. Returns its other outputs."""
        names = self._names(graph)
        ins = {i: self.current[s.decode_input] for s, (i, _) in zip(self.folder.states, names) if i}
        out = self.backend.run(graph, {**feed, **ins})
        if graph == "prefill":
            self.current = decode_states_after_prefill(self.folder, out, feed["cu_seqlens"], self.capacity)
        else:
            self.current = {s.decode_input: out[o] for s, (_, o) in zip(self.folder.states, names)}
        state_outs = {o for _, o in names}
        return {k: v for k, v in out.items() if k not in state_outs}
