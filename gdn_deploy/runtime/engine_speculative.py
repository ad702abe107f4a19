"""Greedy speculative decoding on the graphed decode engine: one verify + accept + commit step over the
:class:`.cuda_engine.StaticDecoder` pools, captured as one CUDA graph per (batch bucket, L), and a
continuous-batching generation loop on it.

:class:`SpeculativeStep` takes ``ids [B, L]`` (each row: its last token, then K = L - 1 drafts) and ``slots [B]``,
all on the device. Every layer reads its pools at the slots:

- GDN layers: the causal conv over the L inputs from the pooled window (the conv pool is not written until the
  commit), ``torch.ops.gdn.verify`` from the pool rows (the recurrent state is only read); the pre-conv inputs and
  the verify op's commit factors stay on the device (inside the graph's memory when captured);
- attention layers: the L keys/values are written at positions ``pos .. pos + L - 1`` of the slot (clamped to the
  capacity like the decode step; :class:`EngineSpeculator` refuses steps that would clamp) and each of the B x L
  queries attends to its slot up to its own position (:func:`.decode_attention.decode_attention` with the slots
  repeated L times and per-query lengths). Rejected tokens' keys lie beyond the next position: masked, overwritten.

Then on the device: the greedy prediction at every position, the accepted count ``m`` per row (the leading drafts
equal to the predictions), and the commit: every GDN recurrent state through ``torch.ops.gdn.commit_`` in place at
the slots (``m + 1`` steps), every conv window shifted by ``m + 1`` inputs, the slot positions advanced by
``m + 1``. No host sync, no data-dependent shape; padded rows of a bucket point at the scratch slot (GDN slot -1).
The host reads back one ``[B, L + 1]`` tensor per step: the L predictions and ``m + 1``.

Greedy only: the accepted tokens are the target's argmax tokens, so the output equals plain greedy decoding
whatever the drafts are (up to floating-point near-ties between the verify and the decode arithmetic).
Drafters: :class:`.speculative.OracleDrafter` and :class:`.speculative.NgramDrafter` (host-side). The MTP drafter
is not wired here (its head keeps per-row caches outside the engine's pools).
"""
from __future__ import annotations

import time
import weakref
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UsageError
from ..kernels import trusted_values
from ..lm.gdn import L2NORM_EPS
from ..lm.norms import wide
from . import engine_layers as el
from .cuda_engine import DecodeEngine, StaticDecoder, admit, capture_graph
from .generation import sync
from .decode_attention import decode_attention
from .generation import token_budgets
from .speculative import SpeculativeResult

__all__ = ["SpeculativeStep", "EngineSpeculator", "speculator", "engine_speculative_generate", "speculative_on_engine"]


class SpeculativeStep:
    """The verify + accept + commit step over a :class:`StaticDecoder`'s pools (see the module docstring)."""

    def __init__(self, decoder: StaticDecoder):
        self.dec = decoder
        self.graphs: dict[tuple[int, int], tuple] = {}

    # ---- one layer ----------------------------------------------------------------------------------------
    def _gdn(self, layer, h: Tensor, pools, slots: Tensor, gdn_slots: Tensor, B: int, L: int, cu: Tensor):
        """-> (h, (window [B, W-1+L, C], commit_k, commit_delta, commit_g))."""
        conv_pool, rec_pool = pools
        g = layer.linear_attn
        mixed, z, b, a = el._gdn_project(g, layer._mixer_in(h), self.dec.packs.get(id(g)))
        C, W = mixed.shape[1], g.conv_kernel_size
        window = torch.cat([conv_pool.index_select(0, slots).to(mixed.dtype).transpose(1, 2),
                            mixed.reshape(B, L, C)], dim=1)                          # [B, W-1+L, C]
        w = g._conv_weight()                                                          # [C, W] wide
        acc = None if g.conv1d.bias is None else wide(g.conv1d.bias)
        for j in range(W):                                                            # static taps
            term = wide(window[:, j:j + L]) * w[:, j]
            acc = term if acc is None else acc + term
        conv_out = F.silu(acc).to(mixed.dtype).reshape(B * L, C)
        q, k, v = g._split_qkv(conv_out)
        gt = g._gate_args(a, b)
        with trusted_values():
            o, ck, cd, cg = torch.ops.gdn.verify(q.contiguous(), k.contiguous(), v.contiguous(), gt["g"], gt["beta"],
                                                 cu, rec_pool, gdn_slots, gt["A_log"], gt["dt_bias"],
                                                 gate_mode=gt["gate_mode"], use_qk_l2norm=1, scale=0.0,
                                                 l2norm_eps=L2NORM_EPS, state_mode=1)
        return self.dec.fns.gdn_out(layer, h, o, z, self.dec.packs), (window, ck, cd, cg)

    def _attn(self, layer, h: Tensor, pools, slots_rep: Tensor, pos: Tensor, inv_freq: Optional[Tensor]) -> Tensor:
        k_pool, v_pool = pools
        d = self.dec
        q, k, v, gate = d.fns.attn_in(layer, h, pos, inv_freq, k_pool.dtype, d.packs)
        k_pool[slots_rep, :, pos] = k                                                # [B*L, Hkv, D]
        v_pool[slots_rep, :, pos] = v
        o = decode_attention(q, k_pool, v_pool, slots_rep, pos + 1, layer.self_attn.scaling, impl=d.attention)
        return d.fns.attn_out(layer, h, o, gate, d.packs)

    # ---- the step -----------------------------------------------------------------------------------------
    def _step(self, ids: Tensor, slots: Tensor, gdn_slots: Tensor) -> Tensor:
        d, m = self.dec, self.dec.model
        B, L = ids.shape
        dev = ids.device
        cu = torch.arange(B + 1, device=dev, dtype=torch.int32) * L
        pos0 = d.positions.index_select(0, slots)                                     # [B]
        ar = torch.arange(L, device=dev)
        pos = (pos0[:, None] + ar[None, :]).clamp(max=d.capacity - 1).reshape(-1)     # [B*L]
        slots_rep = slots[:, None].expand(B, L).reshape(-1).contiguous()             # (B = 1: no stride-0 view)
        h = d.fns.embed(m, ids.reshape(-1))
        pending = []
        for layer, pools, inv in zip(m.layers, d.pools, d.inv_freq):
            if layer.layer_type == "linear_attention":
                h, pend = self._gdn(layer, h, pools, slots, gdn_slots, B, L, cu)
                pending.append(pend)
            else:
                h = self._attn(layer, h, pools, slots_rep, pos, inv)
                pending.append(None)
        pred = d.fns.head(m, h).argmax(-1).reshape(B, L)                              # greedy at every position
        same = (ids[:, 1:] == pred[:, :L - 1]).to(torch.long)
        count = same.cumprod(1).sum(1) + 1                                            # m + 1 in [1, L]
        count32 = count.to(torch.int32)
        for layer, pools, pend in zip(m.layers, d.pools, pending):
            if pend is None:
                continue
            conv_pool, rec_pool = pools
            window, ck, cd, cg = pend
            with trusted_values():
                torch.ops.gdn.commit_(rec_pool, ck, cd, cg, cu, count32, gdn_slots, state_mode=1)
            W1 = conv_pool.shape[2]
            idx = (count[:, None] + torch.arange(W1, device=dev)[None, :])[:, :, None].expand(B, W1, window.shape[2])
            conv_pool.index_copy_(0, slots, window.gather(1, idx).transpose(1, 2).to(conv_pool.dtype))
        d.positions.index_copy_(0, slots, (pos0 + count).clamp(max=d.capacity))
        d.positions.narrow(0, d.scratch, 1).zero_()
        return torch.cat([pred, count[:, None]], dim=1)                               # [B, L + 1]

    @torch.no_grad()
    def step_eager(self, ids: Tensor, slots: Tensor) -> Tensor:
        """ids [B, L] int64, slots [B] int64 (distinct, in [0, P)) -> [B, L + 1]: the L greedy predictions and the
        count of new tokens m + 1 (the pools and positions already committed)."""
        return self._step(ids, slots, slots.to(torch.int32))

    @torch.no_grad()
    def capture(self, B: int, L: int, warmup: int = 2) -> None:
        """Capture the step for bucket B and L tokens per row (CUDA). Warm-up and capture touch only the scratch
        slot; the graph shares the decoder's graph memory pool (outputs valid until the next step)."""
        d = self.dec
        if d.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        ids = torch.zeros(B, L, dtype=torch.long, device=d.device)
        slots = torch.full((B,), d.scratch, dtype=torch.long, device=d.device)
        gslots = torch.full((B,), -1, dtype=torch.int32, device=d.device)
        graph, out = capture_graph(self._step, (ids, slots, gslots), d.device, d._graph_pool, warmup)
        d._graph_pool = graph.pool()
        self.graphs[(B, L)] = (graph, ids, slots, gslots, out)

    @torch.no_grad()
    def step(self, ids: Tensor, slots: Tensor, graphs: bool = True) -> Tensor:
        """:meth:`step_eager`, replayed from the graph of (the smallest bucket >= B, L) when ``graphs`` and the
        decoder is on CUDA (captured on first use). The result is a view of the graph's output: valid until the
        next step."""
        d = self.dec
        B, L = ids.shape
        if not graphs or d.device.type != "cuda":
            return self.step_eager(ids, slots)
        key = (d.bucket(B), L)
        if key not in self.graphs:
            self.capture(*key)
        graph, g_ids, g_slots, g_gslots, out = self.graphs[key]
        g_ids[:B].copy_(ids)
        g_slots[:B].copy_(slots)
        g_gslots[:B].copy_(slots)
        if B < key[0]:
            g_ids[B:].zero_()
            g_slots[B:].fill_(d.scratch)
            g_gslots[B:].fill_(-1)
        graph.replay()
        return out[:B]


class EngineSpeculator:
    """Speculative steps on a :class:`DecodeEngine`'s slots: host-side length bookkeeping and the capacity check."""

    def __init__(self, engine: DecodeEngine, graphs: Optional[bool] = None):
        self.engine = engine
        self.spec = SpeculativeStep(engine.decoder)
        self.graphs = bool(engine.decoder.graphs) if graphs is None else graphs

    def capture(self, L: int) -> None:
        """Capture the step for L tokens per row at every batch bucket (else captured on first use)."""
        for b in self.engine.decoder.buckets:
            if (b, L) not in self.spec.graphs:
                self.spec.capture(b, L)

    def step(self, slots: Sequence[int], ids: Tensor) -> Tensor:
        """ids [B, L] (device) for the live sequences at ``slots`` -> [B, L + 1] on the device (predictions, m + 1)."""
        eng = self.engine
        L = ids.shape[1]
        for s in slots:
            if s not in eng.lengths:
                raise ValueError(f"slot {s} holds no live sequence")
            if eng.lengths[s] + L > eng.capacity:
                raise UsageError(f"slot {s}: {eng.lengths[s]} cached tokens + {L} verified exceed the engine's "
                                 f"capacity {eng.capacity}")
        sl = torch.tensor(list(slots), dtype=torch.long).to(eng.decoder.device)
        return self.spec.step(ids.to(eng.decoder.device), sl, graphs=self.graphs)

    def advance(self, slots: Sequence[int], counts: Sequence[int]) -> None:
        for s, c in zip(slots, counts):
            self.engine.lengths[s] += int(c)


_SPECULATORS: "weakref.WeakKeyDictionary[DecodeEngine, EngineSpeculator]" = weakref.WeakKeyDictionary()


def speculator(engine: DecodeEngine, graphs: Optional[bool] = None) -> EngineSpeculator:
    """The engine's :class:`EngineSpeculator` (one per engine and ``graphs``, so its CUDA graphs are kept)."""
    key = bool(engine.decoder.graphs) if graphs is None else bool(graphs)
    per = _SPECULATORS.setdefault(engine, {})
    if key not in per:
        per[key] = EngineSpeculator(engine, key)
    return per[key]


def engine_speculative_generate(engine: DecodeEngine, prompts: Sequence[Sequence[int]],
                                max_new_tokens: Union[int, Sequence[int]], drafter, draft_tokens: int = 3,
                                eos_token_ids: Sequence[int] = (), arrivals: Optional[Sequence[int]] = None,
                                graphs: Optional[bool] = None) -> SpeculativeResult:
    """Greedy speculative generation with continuous batching on ``engine`` (prompt i joins at step
    ``arrivals[i]``, as slots allow; leaves at an eos id, kept, or after its budget). ``drafter``: an object with
    ``propose(contexts, K, device) -> [B, K]`` (:class:`.speculative.NgramDrafter`, :class:`.speculative.OracleDrafter`
    or one of the same shape; one with a ``rows`` attribute gets the prompt index of each context there before
    ``propose``). The tokens equal plain greedy decoding; ``seconds`` counts the verify steps only."""
    from ..spec import SPEC
    K = int(draft_tokens)
    if not 1 <= K < SPEC.max_draft_tokens:
        raise UsageError(f"draft tokens {draft_tokens!r}: expected 1..{SPEC.max_draft_tokens - 1} (a verify step "
                         f"takes K + 1 <= {SPEC.max_draft_tokens} tokens per sequence)")
    N = len(prompts)
    budgets = token_budgets(max_new_tokens, N)
    for i, p in enumerate(prompts):
        if len(p) + budgets[i] + K > engine.capacity:
            raise UsageError(f"prompt {i}: {len(p)} tokens + {budgets[i]} new + {K} drafts exceed the engine's "
                             f"capacity {engine.capacity}")
    arrivals = list(arrivals) if arrivals is not None else [0] * N
    spec = speculator(engine, graphs)
    dev = engine.decoder.device
    eos = set(int(t) for t in eos_token_ids)
    res = SpeculativeResult([[] for _ in prompts], [False] * N)
    contexts = [list(p) for p in prompts]
    waiting = sorted(range(N), key=lambda i: (arrivals[i], i))
    live: list[int] = []
    slot_of: dict[int, int] = {}
    step = 0

    def take(i: int, new: Sequence[int]) -> bool:
        """Append tokens to prompt i up to an eos / its budget; True when it stays."""
        for t in new:
            res.tokens[i].append(int(t))
            contexts[i].append(int(t))
            if int(t) in eos:
                res.finished[i] = True
                return False
            if len(res.tokens[i]) >= budgets[i]:
                return False
        return True

    def leave(i: int) -> None:
        engine.release([slot_of[i]])
        live.remove(i)

    while waiting or live:
        joining, waiting = admit(waiting, arrivals, step, len(engine.free))
        if joining:
            slots, logits = engine.add([prompts[i] for i in joining])
            slot_of.update(zip(joining, slots))
            live.extend(joining)
            for i, t in zip(joining, logits.argmax(-1).tolist()):
                if budgets[i] < 1 or not take(i, [t]):
                    leave(i)
        if live:
            rows = list(live)
            if hasattr(drafter, "rows"):             # OracleDrafter: which prompt each context belongs to
                drafter.rows = rows
            drafts = drafter.propose([contexts[i] for i in rows], K, "cpu")
            last = torch.tensor([contexts[i][-1] for i in rows], dtype=torch.long)
            ids = torch.cat([last[:, None], drafts.to("cpu", torch.long)], dim=1)
            sync(dev)
            t0 = time.perf_counter()
            out = spec.step([slot_of[i] for i in rows], ids.to(dev)).cpu()          # the step's one read-back
            res.seconds += time.perf_counter() - t0
            counts = out[:, -1].tolist()
            spec.advance([slot_of[i] for i in rows], counts)
            res.target_calls += 1
            res.row_steps += len(rows)
            res.drafted += len(rows) * K
            res.accepted += int(sum(counts)) - len(rows)
            preds = out[:, :-1].tolist()
            for i, c, p in zip(rows, counts, preds):
                if not take(i, p[:int(c)]):
                    leave(i)
        step += 1
    return res



def speculative_on_engine(folder, backend, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                          eos_token_ids: Sequence[int], mode: str, draft_tokens: int) -> SpeculativeResult:
    """``samples/decode_loop.py --speculative ngram`` with the engine on (the torch backend; graphed on CUDA, eager
    on the CPU): one pool slot per prompt, capacity for prompt + budget + K. The MTP drafter is not wired to the
    engine: ``mtp`` is a UsageError."""
    from .engine_generation import engine_unsupported
    from .generation import check_prompts
    from .speculative import SPECULATIVE_MODES, NgramDrafter
    if mode not in SPECULATIVE_MODES:
        raise UsageError(f"--speculative {mode!r}: expected one of {', '.join(SPECULATIVE_MODES)}")
    if mode == "mtp":
        raise UsageError("--speculative mtp does not run on the decode engine yet: use --speculative ngram, or "
                         "--engine off --device cpu")
    why = engine_unsupported(backend)
    if why is not None:
        raise UsageError(f"--speculative on the engine: {why}")
    check_prompts(folder, prompts, max_new_tokens)
    budgets = token_budgets(max_new_tokens, len(prompts))
    capacity = max(len(p) + n for p, n in zip(prompts, budgets)) + int(draft_tokens)
    engine = DecodeEngine(backend.model, pool_size=len(prompts), capacity=capacity)
    return engine_speculative_generate(engine, prompts, budgets, NgramDrafter(), draft_tokens, eos_token_ids)
