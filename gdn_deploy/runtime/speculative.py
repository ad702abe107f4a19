"""Self-speculative greedy generation with a :class:`~gdn_deploy.lm.model.HybridLM` in PyTorch
(:class:`TorchTarget`) or on the graphs of an export folder (:mod:`.speculative_folder`).

Every step, each sequence's drafter proposes K tokens; one target call verifies ``[last, d_1 .. d_K]`` (K + 1
tokens per sequence, :func:`gdn_deploy.lm.speculative_steps.verify_step`), the longest prefix of drafts equal to
the target's own argmax is accepted (m per sequence, different across the batch), the target's token after it is
added (so 1..K+1 new tokens per call), and the GDN states land exactly on the state after those m + 1 inputs
(``commit``). The tokens are therefore the greedy tokens whatever the drafts are. A sequence stops at an
end-of-sequence id inside an accepted run (the id is kept, later tokens dropped) or after ``max_new_tokens``,
and leaves the batch.

Drafters: :class:`MTPDrafter` (the checkpoint's multi-token-prediction head, :mod:`gdn_deploy.lm.mtp`),
:class:`NgramDrafter` (prompt lookup: the tokens that followed the latest earlier occurrence of the last
n-gram) and :class:`OracleDrafter` (given tokens, for tests and benchmarks of the accept-everything case).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..lm.generate import check_prompt_lengths, pack_prompts
from ..lm.model import HybridLM, decode_states_from_prefill
from ..lm.mtp import MTPHead, lm_head_logits
from ..lm.speculative_steps import commit, verify_step

__all__ = ["SpeculativeResult", "speculative_generate", "MTPDrafter", "NgramDrafter", "OracleDrafter", "TorchTarget",
           "TorchMTPRunner", "speculative_from_folder"]


@dataclass
class SpeculativeResult:
    tokens: list[list[int]]
    finished: list[bool] = field(default_factory=list)
    target_calls: int = 0          # verify calls of the target model (the prefill not counted)
    row_steps: int = 0             # sequences x verify calls
    drafted: int = 0               # draft tokens proposed
    accepted: int = 0              # draft tokens accepted
    seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        """New tokens per sequence per target verify call (1 .. K+1)."""
        return (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0


class NgramDrafter:
    """Prompt lookup: the K tokens after the latest earlier occurrence of the context's last n-gram (n from
    ``max_n`` down to 1); the last token repeated when nothing matches."""

    def __init__(self, max_n: int = 3):
        self.max_n = max_n

    def start(self, model, prompts, normed_packed, cu, first) -> None:
        pass

    def propose(self, contexts: Sequence[list[int]], K: int, device) -> Tensor:
        out = []
        for ctx in contexts:
            draft: list[int] = []
            for n in range(min(self.max_n, len(ctx) - 1), 0, -1):
                tail = ctx[-n:]
                for s in range(len(ctx) - n - 1, -1, -1):
                    if ctx[s:s + n] == tail:
                        draft = ctx[s + n:s + n + K]
                        break
                if draft:
                    break
            draft = (draft + [ctx[-1]] * K)[:K]
            out.append(draft)
        return torch.tensor(out, dtype=torch.long, device=device).reshape(len(contexts), K)

    def update(self, normed, pred, count, positions) -> None:
        pass

    def select(self, rows: Tensor) -> None:
        pass


class OracleDrafter(NgramDrafter):
    """Proposes the given continuation of each prompt (``future[i]``: e.g. the greedy tokens), so every draft is
    accepted while it lasts; past its end it proposes the last token."""

    def __init__(self, future: Sequence[Sequence[int]], prompts: Sequence[Sequence[int]]):
        super().__init__()
        self.full = [list(p) + list(f) for p, f in zip(prompts, future)]
        self.rows: list[int] = list(range(len(prompts)))

    def propose(self, contexts, K, device) -> Tensor:
        out = []
        for r, ctx in zip(self.rows, contexts):
            full = self.full[r]
            nxt = full[len(ctx):len(ctx) + K] if full[:len(ctx)] == list(ctx) else []
            out.append((nxt + [ctx[-1]] * K)[:K])
        return torch.tensor(out, dtype=torch.long, device=device).reshape(len(contexts), K)

    def select(self, rows: Tensor) -> None:
        self.rows = [self.rows[r] for r in rows.tolist()]


class TorchMTPRunner:
    """The MTP head in PyTorch, one call = what draft.onnx computes (:mod:`gdn_deploy.export.speculative_graphs`):
    entries (token p, normed hidden of p-1) at their positions (>= capacity: padding, no cache write) ->
    (logits [B, vocab], normed hidden' [B, H]) of entry ``last[b]``; the head's KV caches kept here."""

    def __init__(self, model: HybridLM, head: MTPHead):
        self.model, self.head = model, head
        self.caches: list = []

    def start(self, B: int, capacity: int, device) -> None:
        self.caches = self.head.init_caches(B, capacity, device=device)

    def run(self, tokens: Tensor, normed: Tensor, positions: Tensor, last: Tensor, step: int):
        emb = self.model.embed_tokens(tokens)
        out, self.caches = self.head.forward_cached(emb, normed.to(emb.dtype), positions, self.caches, step)
        hid = out[torch.arange(out.shape[0], device=out.device), last]
        return lm_head_logits(self.model, hid), hid

    def select(self, rows: Tensor) -> None:
        self.caches = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.caches]


class MTPDrafter:
    """Drafts with the checkpoint's MTP head (``runner``: :class:`TorchMTPRunner`, or the draft graph of an export
    folder): its KV cache follows the accepted tokens; K drafts chain the head on its own outputs (see
    :mod:`gdn_deploy.lm.mtp`)."""

    def __init__(self, runner, capacity: int):
        self.runner, self.capacity = runner, capacity
        self.last_logits: Optional[Tensor] = None   # [B, vocab]: the head's prediction after each row's last entry
        self.last_hidden: Optional[Tensor] = None   # [B, H]: the head's output at each row's last position
        self.last_pos: Optional[Tensor] = None      # [B]

    def _run(self, normed: Tensor, tokens: Tensor, start: Tensor, count: Tensor, step: int = 0) -> None:
        """Entries (normed[b, i], tokens[b, i]) at positions start[b] + i for i < count[b]."""
        L = tokens.shape[1]
        i = torch.arange(L, device=tokens.device)
        pos = start[:, None] + i[None, :]
        pos = torch.where(i[None, :] < count[:, None], pos, torch.full_like(pos, self.capacity))   # padding: no write
        last = (count - 1).clamp(min=0)
        self.last_logits, self.last_hidden = self.runner.run(tokens, normed, pos, last, step)
        self.last_pos = start + last

    def start(self, model, prompts, normed_packed, cu, first) -> None:
        dev = normed_packed.device
        B, lens = len(prompts), [len(p) for p in prompts]
        L = max(lens)
        self.runner.start(B, self.capacity, dev)
        H = normed_packed.shape[-1]
        normed = normed_packed.new_zeros(B, L, H)
        tokens = torch.zeros(B, L, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):          # entry p pairs hidden_{p-1} with token p (token n = first)
            s = int(cu[b])
            normed[b, :lens[b]] = normed_packed[s:s + lens[b]]
            tokens[b, :lens[b]] = torch.tensor(list(p[1:]) + [int(first[b])], device=dev)
        self._run(normed, tokens, torch.ones(B, dtype=torch.long, device=dev),
                  torch.tensor(lens, device=dev))

    def propose(self, contexts, K: int, device) -> Tensor:
        drafts = []
        logits, hid, pos = self.last_logits, self.last_hidden, self.last_pos
        zero = torch.zeros(hid.shape[0], dtype=torch.long, device=hid.device)
        for k in range(K):
            tok = logits.argmax(-1)
            drafts.append(tok)
            if k == K - 1:
                break
            logits, hid = self.runner.run(tok[:, None], hid[:, None], (pos + 1)[:, None], zero, k + 1)
            pos = pos + 1
        return torch.stack(drafts, dim=1).to(device)

    def update(self, normed: Tensor, pred: Tensor, count: Tensor, positions: Tensor) -> None:
        """After a verify at ``positions``: entries (target hidden of input i, target token i) for i < count."""
        self._run(normed, pred, positions + 1, count)

    def select(self, rows: Tensor) -> None:
        self.runner.select(rows)
        self.last_logits = self.last_logits.index_select(0, rows)
        self.last_hidden, self.last_pos = self.last_hidden.index_select(0, rows), self.last_pos.index_select(0, rows)


class TorchTarget:
    """The target model in PyTorch: decode-state lists, ``verify_step`` and ``commit`` (gdn::verify / commit_)."""

    def __init__(self, model: HybridLM):
        self.model = model
        self.device = model.embed_tokens.weight.device

    def prefill(self, ids: Tensor, cu: Tensor, capacity: int):
        """-> (each prompt's last-token logits [N, vocab], decode states, normed hidden of every token [T, H])."""
        normed: list = []
        last_logits, states = self.model.forward_prefill(ids, cu, last_only=True, hidden_out=normed)
        return last_logits, decode_states_from_prefill(self.model.hybrid_config, states, cu, capacity), normed[0]

    def verify(self, inp: Tensor, pos: Tensor, states):
        """-> (logits [B, L, vocab], normed hidden [B, L, H], states, what the commit needs)."""
        hidden, states, pending = verify_step(self.model, inp, pos, states)
        normed = self.model.norm(hidden)
        return lm_head_logits(self.model, normed), normed, states, pending

    def commit(self, states, pending, L: int, count: Tensor):
        return commit(states, pending, L, count)

    def select(self, states, rows: Tensor):
        return _select(states, rows)


@torch.no_grad()
def speculative_generate(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, drafter,
                         draft_tokens: int = 3, eos_token_ids: Sequence[int] = ()) -> SpeculativeResult:
    """Greedy tokens per prompt (identical to plain greedy decoding), drafted ``draft_tokens`` at a time.
    ``model``: a :class:`HybridLM` (run in PyTorch) or a target with the :class:`TorchTarget` methods (e.g. the
    graphs of an export folder, :mod:`.speculative_folder`)."""
    from ..spec import SPEC
    K = int(draft_tokens)
    if not 1 <= K < SPEC.max_draft_tokens:
        raise ValueError(f"draft tokens {draft_tokens!r}: expected 1..{SPEC.max_draft_tokens - 1} (a verify step "
                         f"takes K + 1 <= {SPEC.max_draft_tokens} tokens per sequence)")
    if isinstance(model, HybridLM):
        check_prompt_lengths(model, prompts, max_new_tokens)
        target = TorchTarget(model)
    else:
        target = model
    t0 = time.perf_counter()
    dev = target.device
    ids, cu = pack_prompts(prompts, dev)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    last_logits, states, normed_prompts = target.prefill(ids, cu, int(lens.max()) + max_new_tokens + K + 1)
    eos = set(int(e) for e in eos_token_ids)
    N = len(prompts)
    res = SpeculativeResult([[] for _ in prompts], [False] * N)
    last = last_logits.argmax(-1).to(dev)
    drafter.start(model, prompts, normed_prompts, cu, last.tolist())
    contexts = [list(p) for p in prompts]
    alive = []
    for i, t in enumerate(last.tolist()):
        res.tokens[i].append(t)
        contexts[i].append(t)
        res.finished[i] = t in eos
        if not res.finished[i] and max_new_tokens > 1:
            alive.append(i)
    if len(alive) < N:
        rows = torch.tensor(alive, dtype=torch.long, device=dev)
        states, last, lens = target.select(states, rows), last.index_select(0, rows), lens.index_select(0, rows)
        drafter.select(rows)
    pos = lens.clone()
    while alive:
        B = len(alive)
        drafts = drafter.propose([contexts[i] for i in alive], K, dev)
        inp = torch.cat([last[:, None], drafts], dim=1)                        # [B, K+1]
        logits, normed, states, pending = target.verify(inp, pos, states)
        pred = logits.argmax(-1)                                               # [B, K+1]
        m = (drafts == pred[:, :K]).to(torch.long).cumprod(1).sum(1)           # accepted drafts per row
        count = m + 1
        states = target.commit(states, pending, K + 1, count)
        res.target_calls += 1
        res.row_steps += B
        res.drafted += B * K
        res.accepted += int(m.sum())
        drafter.update(normed, pred, count, pos)
        keep = []
        for row, (i, new) in enumerate(zip(alive, pred.tolist())):
            for t in new[:int(count[row])]:
                res.tokens[i].append(t)
                contexts[i].append(t)
                if t in eos:
                    res.finished[i] = True
                    break
                if len(res.tokens[i]) >= max_new_tokens:
                    break
            if not res.finished[i] and len(res.tokens[i]) < max_new_tokens:
                keep.append(row)
        pos = pos + count
        last = pred[torch.arange(B, device=dev), m]
        if len(keep) < B:
            rows = torch.tensor(keep, dtype=torch.long, device=dev)
            alive = [alive[r] for r in keep]
            states, pos, last = target.select(states, rows), pos.index_select(0, rows), last.index_select(0, rows)
            if keep:
                drafter.select(rows)
    res.seconds = time.perf_counter() - t0
    return res


def _select(states, rows: Tensor) -> list:
    return [(a.index_select(0, rows), b.index_select(0, rows)) for a, b in states]


SPECULATIVE_MODES = ("mtp", "ngram")


def speculative_from_folder(folder, backend, prompts, max_new_tokens: int, eos_token_ids, mode: str,
                            draft_tokens: int) -> SpeculativeResult:
    """``samples/decode_loop.py --speculative``: an MTP or prompt-lookup drafter on the torch backend's model (MTP
    head from the Hugging Face folder the export came from; CPU) or on the folder's graphs with the onnxruntime
    backend (verify / commit / draft of ``gdn-export --speculative``: :mod:`.speculative_folder`).
    UsageError for the tensorrt backend, a CUDA device or a folder without the speculative graphs; LoadError
    when ``mtp`` is asked and there are no MTP weights (no mtp.* in the source folder, no draft graph)."""
    from ..errors import UsageError
    if mode not in SPECULATIVE_MODES:
        raise UsageError(f"--speculative {mode!r}: expected one of {', '.join(SPECULATIVE_MODES)}")
    name = getattr(backend, "name", "")
    if name not in ("torch", "onnxruntime"):
        raise UsageError(f"--speculative runs on the torch and onnxruntime backends (got --backend {name}: its "
                         "speculative generation loop does not exist yet)")
    if folder.kind != "hybrid":
        raise UsageError("--speculative needs a whole language-model export of a Hugging Face folder")
    K = int(draft_tokens)
    capacity = max(len(p) for p in prompts) + max_new_tokens + K + 1
    if name == "torch":
        target, runner = _torch_parts(folder, backend, mode)
    else:
        from .speculative_folder import FolderMTPRunner, FolderTarget, speculative_graphs_of
        speculative_graphs_of(folder, mode)
        from .generation import check_prompts
        check_prompts(folder, prompts, max_new_tokens)
        target = FolderTarget(folder, backend)
        runner = FolderMTPRunner(folder, backend) if mode == "mtp" else None
    drafter = NgramDrafter() if mode == "ngram" else MTPDrafter(runner, capacity)
    try:
        return speculative_generate(target, prompts, max_new_tokens, drafter, K, eos_token_ids)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _torch_parts(folder, backend, mode: str):
    """(the torch model, its MTP runner or None) of the torch backend."""
    from pathlib import Path

    from ..errors import LoadError, UsageError
    model = backend.model
    if not isinstance(model, HybridLM):
        raise UsageError("--speculative needs a language model export")
    if model.embed_tokens.weight.device.type != "cpu":
        raise UsageError("--speculative off the engine runs on the CPU (on CUDA: --speculative ngram on the decode "
                         "engine, --engine auto or on)")
    if mode == "ngram":
        return model, None
    from ..lm.hf_folder import CheckpointError
    from ..lm.mtp import MTPWeightsMissing, load_mtp_head
    src = folder.meta.get("source", {}).get("model", "")
    path = Path(src) if Path(src).is_absolute() else (folder.path / src).resolve()
    if not src or not (path / "config.json").is_file():
        raise LoadError(f"--speculative mtp: the export's source ({src or 'unknown'}) is not a Hugging Face "
                        "folder with MTP weights; use --speculative ngram")
    try:
        head = load_mtp_head(path, model)
    except (MTPWeightsMissing, CheckpointError) as e:
        raise LoadError(f"--speculative mtp: {e}") from e
    return model, TorchMTPRunner(model, head)
