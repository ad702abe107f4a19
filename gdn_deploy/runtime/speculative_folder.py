"""Speculative generation on the graphs of an export folder (``gdn-export --speculative``): prefill, verify and
commit (and draft with an MTP head) run by a backend (``run(graph, feed) -> outputs``: onnxruntime today).

:class:`FolderTarget` has the methods of :class:`~gdn_deploy.runtime.speculative.TorchTarget` on the folder's
graphs (states as ``{decode input name: tensor}``, the decode graph's layout), :class:`FolderMTPRunner` those of
:class:`~gdn_deploy.runtime.speculative.TorchMTPRunner` on draft.onnx, so
:func:`~gdn_deploy.runtime.speculative.speculative_generate` runs unchanged on either.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from ..errors import LoadError, UsageError
from .folder import ExportFolder
from .generation import fresh_prefill_feed
from .states import STATE_DTYPES, decode_states_after_prefill, last_token_logits

__all__ = ["FolderTarget", "FolderMTPRunner", "speculative_graphs_of"]


def speculative_graphs_of(folder: ExportFolder, mode: str) -> dict:
    """The sidecar's ``speculative`` entry; UsageError when the folder has no verify/commit graphs, LoadError
    when ``mode`` is "mtp" and it has no draft graph (no MTP weights at export)."""
    spec = folder.meta.get("speculative") or {}
    have = set(spec.get("graphs") or ())
    if not {"verify", "commit"} <= have:
        raise UsageError(f"--speculative on {folder.path}: the folder has no verify/commit graphs; re-export it with "
                         "gdn-export --speculative (or use --backend torch)")
    if mode == "mtp" and "draft" not in have:
        raise LoadError(f"--speculative mtp: {folder.path} has no draft graph (its model had no MTP weights, mtp.*, "
                        "at export); use --speculative ngram")
    from ..export.integrity import verify_folder
    verify_folder(folder.path, folder.meta, graphs=sorted(have))      # sizes and graph I/O of the extra graphs
    return spec


class FolderTarget:
    """The target model as the folder's prefill / verify / commit graphs."""

    def __init__(self, folder: ExportFolder, backend):
        self.folder, self.backend = folder, backend
        self.device = torch.device("cpu")
        self.attention = [s for s in folder.states if s.kind == "attention"]
        self.gdn_layers = sorted({s.layer for s in folder.states if s.kind == "gdn"})
        commit_ins = folder.meta["graphs"]["commit"]["inputs"]
        self.factor_names = [t["name"] for t in commit_ins if t["name"].startswith(("conv_inputs_", "commit_"))]
        self.gdn_state_names = [t["name"] for t in commit_ins if t["name"] != "accepted"
                                and t["name"] not in self.factor_names]

    def prefill(self, ids: Tensor, cu: Tensor, capacity: int):
        T = ids.shape[0]
        pos = torch.cat([torch.arange(int(n)) for n in (cu[1:] - cu[:-1]).tolist()]) if T else ids.new_zeros(0)
        out = self.backend.run("prefill", fresh_prefill_feed(self.folder, ids, cu, pos, capacity))
        states = decode_states_after_prefill(self.folder, out, cu, capacity)
        return last_token_logits(out["logits"], cu).float(), states, out.get("hidden")

    def verify(self, inp: Tensor, pos: Tensor, states: Mapping[str, Tensor]):
        out = self.backend.run("verify", {"input_ids": inp, "positions": pos, **states})
        new = dict(states)
        for s in self.attention:
            new[s.decode_input] = out[s.decode_output]
        pending = {n: out[n] for n in self.factor_names}
        return out["logits"].float(), out.get("hidden"), new, pending

    def commit(self, states: Mapping[str, Tensor], pending: Mapping[str, Tensor], L: int, count: Tensor):
        feed = {"accepted": count.to(torch.int32), **{n: states[n] for n in self.gdn_state_names}, **pending}
        out = self.backend.run("commit", feed)
        new = dict(states)
        for s in self.folder.states:
            if s.kind == "gdn":
                new[s.decode_input] = out[s.decode_output]
        return new

    def select(self, states: Mapping[str, Tensor], rows: Tensor):
        return {k: v.index_select(0, rows) for k, v in states.items()}


class FolderMTPRunner:
    """The MTP head as the folder's draft graph; its KV caches ``[B, Hkv, S, D]`` kept here."""

    def __init__(self, folder: ExportFolder, backend):
        self.backend = backend
        info = folder.meta["graphs"]["draft"]
        self.caches_in = [t for t in info["inputs"] if t["name"].startswith("mtp_")]
        self.cache_out = {t["name"]: t["name"].replace("_cache_", "_cache_out_") for t in self.caches_in}
        self.hidden_dtype = STATE_DTYPES[next(t["dtype"] for t in info["inputs"] if t["name"] == "hidden")]
        self.caches: dict[str, Tensor] = {}

    def start(self, B: int, capacity: int, device) -> None:
        self.caches = {}
        for t in self.caches_in:
            shape = [B if d == "B" else capacity if d == "S" else int(d) for d in t["shape"]]
            self.caches[t["name"]] = torch.zeros(shape, dtype=STATE_DTYPES[t["dtype"]])

    def run(self, tokens: Tensor, normed: Tensor, positions: Tensor, last: Tensor, step: int):
        out = self.backend.run("draft", {"input_ids": tokens, "hidden": normed.to(self.hidden_dtype),
                                         "positions": positions, "last": last.to(torch.long), **self.caches})
        self.caches = {n: out[o] for n, o in self.cache_out.items()}
        return out["logits"].float(), out["hidden_out"]

    def select(self, rows: Tensor) -> None:
        self.caches = {k: v.index_select(0, rows) for k, v in self.caches.items()}
