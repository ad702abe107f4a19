"""Self-speculative greedy generation with a :class:`~gdn_deploy.lm.model.HybridLM` in PyTorch.

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

import contextlib
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..lm.generate import check_prompt_lengths, pack_prompts
from ..lm.model import HybridLM, decode_states_from_prefill
from ..lm.mtp import MTPHead, lm_head_logits
from ..lm.speculative_steps import commit, verify_step

__all__ = ["SpeculativeResult", "speculative_generate", "MTPDrafter", "NgramDrafter", "OracleDrafter"]


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


@contextlib.contextmanager
def _capture_normed(model: HybridLM, box: list):
    """Record the output of ``model.norm`` (the final-normed hidden states the lm_head reads)."""
    handle = model.norm.register_forward_hook(lambda m, i, o: box.append(o))
    try:
        yield
    finally:
        handle.remove()


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


class MTPDrafter:
    """Drafts with the checkpoint's MTP head: its KV cache follows the accepted tokens; K drafts chain the head
    on its own outputs (see :mod:`gdn_deploy.lm.mtp`)."""

    def __init__(self, model: HybridLM, head: MTPHead, capacity: int):
        self.model, self.head, self.capacity = model, head, capacity
        self.caches: list = []
        self.last_hidden: Optional[Tensor] = None   # [B, H]: the head's output at each row's last position
        self.last_pos: Optional[Tensor] = None      # [B]

    def _run(self, normed: Tensor, tokens: Tensor, start: Tensor, count: Tensor, step: int = 0) -> None:
        """Entries (normed[b, i], tokens[b, i]) at positions start[b] + i for i < count[b]."""
        B, L, _ = normed.shape
        i = torch.arange(L, device=normed.device)
        pos = start[:, None] + i[None, :]
        pos = torch.where(i[None, :] < count[:, None], pos, torch.full_like(pos, self.capacity))   # padding: no write
        emb = self.model.embed_tokens(tokens)
        out, self.caches = self.head.forward_cached(emb, normed.to(emb.dtype), pos, self.caches, step)
        last = (count - 1).clamp(min=0)
        self.last_hidden = out[torch.arange(B, device=out.device), last]
        self.last_pos = start + last

    def start(self, model, prompts, normed_packed, cu, first) -> None:
        dev = normed_packed.device
        B, lens = len(prompts), [len(p) for p in prompts]
        L = max(lens)
        self.caches = self.head.init_caches(B, self.capacity, device=dev)
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
        hid, pos = self.last_hidden, self.last_pos
        for k in range(K):
            tok = lm_head_logits(self.model, hid).argmax(-1)
            drafts.append(tok)
            if k == K - 1:
                break
            emb = self.model.embed_tokens(tok)[:, None]
            out, self.caches = self.head.forward_cached(emb, hid[:, None], (pos + 1)[:, None], self.caches, k + 1)
            hid, pos = out[:, 0], pos + 1
        return torch.stack(drafts, dim=1)

    def update(self, normed: Tensor, pred: Tensor, count: Tensor, positions: Tensor) -> None:
        """After a verify at ``positions``: entries (target hidden of input i, target token i) for i < count."""
        self._run(normed, pred, positions + 1, count)

    def select(self, rows: Tensor) -> None:
        self.caches = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.caches]
        self.last_hidden, self.last_pos = self.last_hidden.index_select(0, rows), self.last_pos.index_select(0, rows)


@torch.no_grad()
def speculative_generate(model: HybridLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, drafter,
                         draft_tokens: int = 3, eos_token_ids: Sequence[int] = ()) -> SpeculativeResult:
    """Greedy tokens per prompt (identical to plain greedy decoding), drafted ``draft_tokens`` at a time."""
    from ..spec import SPEC
    K = int(draft_tokens)
    if not 1 <= K < SPEC.max_draft_tokens:
        raise ValueError(f"draft tokens {draft_tokens!r}: expected 1..{SPEC.max_draft_tokens - 1} (a verify step "
                         f"takes K + 1 <= {SPEC.max_draft_tokens} tokens per sequence)")
    check_prompt_lengths(model, prompts, max_new_tokens)
    t0 = time.perf_counter()
    dev = model.embed_tokens.weight.device
    ids, cu = pack_prompts(prompts, dev)
    box: list = []
    with _capture_normed(model, box):
        logits, states = model.forward_prefill(ids, cu)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    last_logits = logits.index_select(0, cu[1:].long() - 1)
    states = decode_states_from_prefill(model.hybrid_config, states, cu, int(lens.max()) + max_new_tokens + K + 1)
    eos = set(int(e) for e in eos_token_ids)
    N = len(prompts)
    res = SpeculativeResult([[] for _ in prompts], [False] * N)
    last = last_logits.argmax(-1)
    drafter.start(model, prompts, box[-1], cu, last.tolist())
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
        states, last, lens = _select(states, rows), last.index_select(0, rows), lens.index_select(0, rows)
        drafter.select(rows)
    pos = lens.clone()
    while alive:
        B = len(alive)
        drafts = drafter.propose([contexts[i] for i in alive], K, dev)
        inp = torch.cat([last[:, None], drafts], dim=1)                        # [B, K+1]
        box.clear()
        hidden, states, pending = verify_step(model, inp, pos, states)
        normed = model.norm(hidden)
        pred = lm_head_logits(model, normed).argmax(-1)                        # [B, K+1]
        m = (drafts == pred[:, :K]).to(torch.long).cumprod(1).sum(1)           # accepted drafts per row
        count = m + 1
        states = commit(states, pending, K + 1, count)
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
            states, pos, last = _select(states, rows), pos.index_select(0, rows), last.index_select(0, rows)
            if keep:
                drafter.select(rows)
    res.seconds = time.perf_counter() - t0
    return res


def _select(states, rows: Tensor) -> list:
    return [(a.index_select(0, rows), b.index_select(0, rows)) for a, b in states]


SPECULATIVE_MODES = ("mtp", "ngram")


def speculative_from_folder(folder, backend, prompts, max_new_tokens: int, eos_token_ids, mode: str,
                            draft_tokens: int) -> SpeculativeResult:
    """``samples/decode_loop.py --speculative``: the torch backend's model with an MTP (from the Hugging Face
    folder the export came from) or prompt-lookup drafter. UsageError for another backend or a CUDA device,
    LoadError when ``mtp`` is asked and the source folder has no MTP weights."""
    from pathlib import Path

    from ..errors import LoadError, UsageError
    if mode not in SPECULATIVE_MODES:
        raise UsageError(f"--speculative {mode!r}: expected one of {', '.join(SPECULATIVE_MODES)}")
    if getattr(backend, "name", "") != "torch":
        raise UsageError(f"--speculative runs on the torch backend only (got --backend {backend.name})")
    model = backend.model
    if not isinstance(model, HybridLM):
        raise UsageError("--speculative needs a language model export")
    if model.embed_tokens.weight.device.type != "cpu":
        raise UsageError("--speculative runs on the CPU for now (the speculative generation path has not been run on a GPU)")
    K = int(draft_tokens)
    if mode == "ngram":
        drafter = NgramDrafter()
    else:
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
        drafter = MTPDrafter(model, head, max(len(p) for p in prompts) + max_new_tokens + K + 1)
    try:
        return speculative_generate(model, prompts, max_new_tokens, drafter, K, eos_token_ids)
    except ValueError as e:
        raise UsageError(str(e)) from e
