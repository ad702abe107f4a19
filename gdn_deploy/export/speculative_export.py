"""``gdn-export --speculative``: which speculative graphs a whole hybrid LM gets, and their sidecar entry.

``verify`` and ``commit`` (:mod:`.speculative_graphs`) are exported for every whole hybrid model (prompt-lookup
drafts need nothing else); ``draft`` when the Hugging Face folder has an MTP head (``mtp.*`` tensors,
:func:`gdn_deploy.lm.mtp.load_mtp_head`), which is attached to the target so prefill and verify also return
the final-normed hidden states it reads. The sidecar's ``speculative`` entry says which graphs there are::

  "speculative": {"graphs": ["verify", "commit", "draft"], "draft": "mtp" | null, "mtp_layers": 1,
                  "max_tokens_per_call": 16, "commit": "..."}
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import LoadError, UsageError, first_line
from ..spec import SPEC
from .speculative_graphs import SPECULATIVE_GRAPHS

__all__ = ["speculative_targets", "speculative_metadata"]


def speculative_targets(targets: Sequence, graphs: Sequence[str], flag: bool,
                        say: Callable[[str], None] = lambda s: None) -> tuple[str, ...]:
    """Attach the MTP head to each whole-model target where its folder has one; returns the graph list
    (``flag``: verify and commit added, draft too where a head exists). UsageError for block / GDNLM targets
    or streamed (lazy) weights, LoadError for MTP weights that do not match config.json."""
    from ..lm.hf_folder import CheckpointError
    from ..lm.mtp import MTPWeightsMissing, load_mtp_head
    from .lazy_export import is_lazy
    out = list(graphs)
    if flag:
        out += [g for g in ("verify", "commit") if g not in out]
    for t in targets:
        if t.kind != "hybrid":
            raise UsageError("--speculative (verify/commit/draft graphs): export a whole Hugging Face model "
                             "(no --layer/--blocks; not a gdn-deploy checkpoint)")
        if is_lazy(t):
            raise UsageError("--speculative: the speculative graphs need the weights loaded; pass --lazy-weights off")
        src = t.source.get("model")
        try:
            t.mtp_head = load_mtp_head(Path(src), t.module)
        except MTPWeightsMissing:
            t.mtp_head = None
            if "draft" in out:
                raise UsageError(f"draft: {src} has no MTP weights (mtp.*); leave draft out of --graphs") from None
            say("  note: no MTP weights (mtp.*) in the folder: no draft.onnx; decode_loop --speculative ngram "
                "drafts by prompt lookup")
            continue
        except (CheckpointError, ValueError, OSError) as e:
            raise LoadError(f"--speculative: the MTP head cannot be loaded: {first_line(e)}") from e
        say(f"  MTP head: {len(t.mtp_head.layers)} layer(s): draft.onnx; prefill and verify also return 'hidden'")
        if flag and "draft" not in out:
            out.append("draft")
    return tuple(out)


def speculative_metadata(meta: dict[str, Any], target) -> None:
    """Add the sidecar's ``speculative`` entry when the folder has speculative graphs."""
    present = [g for g in SPECULATIVE_GRAPHS if g in meta["graphs"]]
    if not present:
        return
    head = target.mtp_head
    meta["speculative"] = {
        "graphs": present, "draft": "mtp" if "draft" in present else None,
        "mtp_layers": len(head.layers) if head is not None else 0,
        "max_tokens_per_call": SPEC.max_draft_tokens,
        "commit": "after every verify call run commit with accepted[b] = drafts kept + 1 (<= L): the GDN states "
                  "land on the state after those tokens; attention caches need no commit"}
