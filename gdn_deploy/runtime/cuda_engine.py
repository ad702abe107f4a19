"""A graph-safe decode step for HybridLM over preallocated state pools, CUDA graphs per batch bucket, and
continuous batching (sequences join and leave between steps).

:class:`StaticDecoder` owns, for a pool of P sequence slots (+ one scratch slot for padded rows):

- per GDN layer ``conv [P+1, conv_dim, W-1]`` (model dtype) and ``rec [P+1, Hv, K, V]`` float32;
- per attention layer ``k, v [P+1, Hkv, capacity, D]`` (model dtype);
- ``positions [P+1]`` int64 on the device (tokens cached per slot), RoPE frequencies on the device.

One step (:meth:`StaticDecoder.step`) takes the new token ids and the slots of the batch, all on the device,
and returns logits ``[B, vocab]``: every layer reads and writes its pools in place at the slots (GDN recurrent
state through ``torch.ops.gdn.decode_pool_``, the conv state and the new key/value through index writes), the
attention reads only each slot's filled positions (:func:`.decode_attention.decode_attention`), and the slot
positions advance by one inside the step. Nothing is copied between host and device, no shape depends on data,
and MoE layers gather their k experts per token, so on CUDA the step for a batch size is captured once per bucket
(1, 2, 4, ... up to P) with ``torch.cuda.CUDAGraph`` and replayed; a batch of B rows runs the smallest bucket
>= B, the extra rows pointed at the scratch slot (their GDN rows skipped with slot -1).

Unfused on CUDA with triton (the default; ``kernels=False`` turns it off) the glue between the pool updates runs on
Triton kernels (:mod:`.engine_fast`: residual add + RMSNorm, gated output norm, the conv window in place in its
pool, SiLU x up, each one kernel) and the projections that read one input share one GEMM (as below).
With ``fuse=True`` (CUDA with triton; opt-in, see docs/performance.md) the per-layer math between the pool updates runs through
``torch.compile`` (:mod:`.engine_layers`: pure functions, so Inductor fuses norms, gates, the conv window and RoPE
without touching the pools) and projections that read one input share one GEMM on a packed weight (the model's
weights become views of it); the pool updates, the GDN kernel and the attention stay outside the compiled code.

:class:`DecodeEngine` adds the bookkeeping: a free-slot list, prefill of new prompts (the model's packed prefill,
then its states written into the pools at fresh slots), :meth:`DecodeEngine.step` for any set of live sequences
(the batch may change every step: no recapture), :meth:`DecodeEngine.release`. :func:`engine_generate` runs a
continuous-batching generation loop on it (prompts may arrive at later steps).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..errors import UsageError
from ..kernels import trusted_values
from ..lm.attention import rope_inv_freq
from ..lm.gdn import L2NORM_EPS
from .decode_attention import decode_attention
from .engine_fast import FastLayerFns, fast_available
from .engine_layers import LayerFns, compile_available, pack_model
from .generation import GenerationResult, token_budgets
from .generation import sync
from .sampling import Sampler, SamplingConfig
from .streaming import TextStream, accept_token, check_stop_strings

__all__ = ["StaticDecoder", "DecodeEngine", "engine_generate", "batch_buckets", "capture_graph"]


def batch_buckets(pool_size: int) -> list[int]:
    """1, 2, 4, ... and pool_size itself (the last bucket)."""
    if pool_size < 1:
        raise ValueError(f"pool size: expected >= 1, got {pool_size}")
    out, b = [], 1
    while b < pool_size:
        out.append(b)
        b *= 2
    return out + [pool_size]


def admit(waiting: list[int], arrivals: Sequence[int], step: int, free: int) -> tuple[list[int], list[int]]:
    """Continuous batching's admission: (the waiting prompts that have arrived by ``step``, in order, at most
    ``free`` of them; the prompts still waiting)."""
    joining = [i for i in waiting if arrivals[i] <= step][:free]
    return joining, [i for i in waiting if i not in joining]


def capture_graph(fn, args: tuple, device, pool, warmup: int):
    """``fn(*args)`` run ``warmup`` times on a side stream, then captured into a CUDA graph sharing the memory pool
    ``pool`` (None: a new one): (graph, the captured call's output)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*args)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*args)
    return graph, out


class StaticDecoder:
    """Pools and the in-place decode step of one HybridLM (see the module docstring)."""

    def __init__(self, model, pool_size: int, capacity: int, attention: str = "auto", fuse: bool = False,
                 kernels: Optional[bool] = None):
        if capacity < 1:
            raise ValueError(f"capacity: expected >= 1 cached positions, got {capacity}")
        self.model = model
        self.pool_size, self.capacity, self.attention = int(pool_size), int(capacity), attention
        self.buckets = batch_buckets(self.pool_size)
        p = model.embed_tokens.weight
        self.device, self.dtype = p.device, p.dtype
        self.scratch = self.pool_size                                 # the extra row padded batch rows use
        rows = self.pool_size + 1
        self.pools: list[tuple[Tensor, Tensor]] = []
        self.inv_freq: list[Optional[Tensor]] = []
        for layer in model.layers:
            if layer.layer_type == "linear_attention":
                self.pools.append(layer.linear_attn.init_states(rows, self.dtype, self.device))
                self.inv_freq.append(None)
            else:
                a = layer.self_attn
                shape = (rows, a.num_kv_heads, self.capacity, a.head_dim)
                self.pools.append((torch.zeros(shape, dtype=self.dtype, device=self.device),
                                   torch.zeros(shape, dtype=self.dtype, device=self.device)))
                c = a.config
                self.inv_freq.append(None if c.rope_theta is None else
                                     rope_inv_freq(c.rope_theta, c.rotary_dim).to(self.device))
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        if fuse:
            why = compile_available(self.device)
            if why is not None:
                raise UsageError(f"the fused decode step: {why}")
        why_not_fast = fast_available(self.device)
        if kernels and why_not_fast is not None:
            raise UsageError(f"the engine's Triton glue kernels: {why_not_fast}")
        fast = not fuse and why_not_fast is None and kernels is not False
        self.packs = pack_model(model) if fuse or fast else {}
        self.fns = FastLayerFns() if fast else LayerFns(fuse)
        self.graphs: dict[int, tuple] = {}
        self._graph_pool = None

    # ---- the step ----------------------------------------------------------------------------------------
    def _gdn(self, layer, h: Tensor, pools, slots: Tensor, gdn_slots: Tensor) -> Tensor:
        conv_pool, rec_pool = pools
        q, k, v, g, beta, A_log, dt_bias, z, conv_new = self.fns.gdn_in(layer, h, conv_pool, slots, self.packs)
        if conv_new is not None:                                       # else written in place by gdn_in
            conv_pool.index_copy_(0, slots, conv_new)
        with trusted_values():                   # the engine's own slots and tensors: no device syncs
            o = torch.ops.gdn.decode_pool_(q, k, v, g, beta, rec_pool, gdn_slots, A_log, dt_bias,
                                           gate_mode=1 if A_log is not None else 0, use_qk_l2norm=1, scale=0.0,
                                           l2norm_eps=L2NORM_EPS)
        return self.fns.gdn_out(layer, h, o, z, self.packs)

    def _attn(self, layer, h: Tensor, pools, slots: Tensor, pos: Tensor, inv_freq: Optional[Tensor]) -> Tensor:
        k_pool, v_pool = pools
        q, k, v, gate = self.fns.attn_in(layer, h, pos, inv_freq, k_pool.dtype, self.packs)
        k_pool[slots, :, pos] = k                                      # [B, Hkv, D] at (slot, :, position)
        v_pool[slots, :, pos] = v
        o = decode_attention(q, k_pool, v_pool, slots, pos + 1, layer.self_attn.scaling, impl=self.attention)
        return self.fns.attn_out(layer, h, o, gate, self.packs)

    def _step(self, ids: Tensor, slots: Tensor, gdn_slots: Tensor) -> Tensor:
        m = self.model
        pos = self.positions.index_select(0, slots).clamp(max=self.capacity - 1)
        h = self.fns.embed(m, ids)
        for layer, pools, inv in zip(m.layers, self.pools, self.inv_freq):
            if layer.layer_type == "linear_attention":
                h = self._gdn(layer, h, pools, slots, gdn_slots)
            else:
                h = self._attn(layer, h, pools, slots, pos, inv)
        self.positions.index_copy_(0, slots, pos + 1)
        self.positions.narrow(0, self.scratch, 1).zero_()         # padded rows always read one position
        return self.fns.head(m, h)

    @torch.no_grad()
    def step_eager(self, ids: Tensor, slots: Tensor) -> Tensor:
        """One decode step without graphs: ids [B] int64, slots [B] int64 (distinct, in [0, P)) -> logits."""
        return self._step(ids, slots, slots.to(torch.int32))

    # ---- graphs -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def capture(self, buckets: Optional[Sequence[int]] = None, warmup: int = 2) -> None:
        """Capture the step once per batch bucket (CUDA only). Warm-up and capture touch only the scratch slot."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        for B in sorted(buckets or self.buckets):
            ids = torch.zeros(B, dtype=torch.long, device=self.device)
            slots = torch.full((B,), self.scratch, dtype=torch.long, device=self.device)
            gslots = torch.full((B,), -1, dtype=torch.int32, device=self.device)
            graph, out = capture_graph(self._step, (ids, slots, gslots), self.device, self._graph_pool, warmup)
            self._graph_pool = graph.pool()
            self.graphs[B] = (graph, ids, slots, gslots, out)

    def bucket(self, B: int) -> int:
        for b in sorted(self.graphs) if self.graphs else self.buckets:
            if b >= B:
                return b
        raise ValueError(f"batch of {B} rows exceeds the pool size {self.pool_size}")

    @torch.no_grad()
    def step(self, ids: Tensor, slots: Tensor) -> Tensor:
        """:meth:`step_eager`, replayed from the captured graph of the smallest bucket >= B when captured.
        The returned logits are a view of the graph's output buffer: valid until the next step."""
        B = ids.shape[0]
        if not self.graphs:
            return self.step_eager(ids, slots)
        graph, g_ids, g_slots, g_gslots, out = self.graphs[self.bucket(B)]
        g_ids[:B].copy_(ids)
        g_slots[:B].copy_(slots)
        g_gslots[:B].copy_(slots)
        if B < g_ids.shape[0]:
            g_slots[B:].fill_(self.scratch)
            g_gslots[B:].fill_(-1)
        graph.replay()
        return out[:B]

    # ---- filling slots from a prefill -------------------------------------------------------------------
    @torch.no_grad()
    def write_prefill(self, slots: Sequence[int], states, cu_seqlens: Sequence[int]) -> None:
        """Write the model's prefill states of N packed sequences into the pools at ``slots``."""
        sl = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        for layer, pools, (a, b) in zip(self.model.layers, self.pools, states):
            if layer.layer_type == "linear_attention":
                pools[0].index_copy_(0, sl, a.to(pools[0].dtype))
                pools[1].index_copy_(0, sl, b.to(pools[1].dtype))
            else:
                for n, s in enumerate(slots):
                    lo, hi = cu_seqlens[n], cu_seqlens[n + 1]
                    pools[0][s, :, :hi - lo] = a[lo:hi].transpose(0, 1).to(pools[0].dtype)
                    pools[1][s, :, :hi - lo] = b[lo:hi].transpose(0, 1).to(pools[1].dtype)
        lens = torch.tensor([cu_seqlens[n + 1] - cu_seqlens[n] for n in range(len(slots))], dtype=torch.long)
        self.positions.index_copy_(0, sl, lens.to(self.device))


class DecodeEngine:
    """Continuous batching over a :class:`StaticDecoder`: slots are handed out from a free list."""

    def __init__(self, model, pool_size: int, capacity: int, graphs: Optional[bool] = None, attention: str = "auto",
                 fuse: bool = False, kernels: Optional[bool] = None):
        self.model = model
        if graphs is None:
            graphs = model.embed_tokens.weight.device.type == "cuda"
        self.decoder = StaticDecoder(model, pool_size, capacity, attention, fuse=fuse, kernels=kernels)
        self.free = list(range(pool_size - 1, -1, -1))                 # pop() hands out 0, 1, 2, ...
        self.lengths: dict[int, int] = {}                              # slot -> tokens cached (host mirror)
        self._slots_key, self._slots_dev = None, None                  # the last batch's slots, on the device
        if graphs:
            self.decoder.capture()

    @property
    def capacity(self) -> int:
        return self.decoder.capacity

    @torch.no_grad()
    def add(self, prompts: Sequence[Sequence[int]]) -> tuple[list[int], Tensor]:
        """Prefill prompts into fresh slots -> (slots, last-token logits [N, vocab])."""
        if len(prompts) > len(self.free):
            raise UsageError(f"{len(prompts)} new sequences but only {len(self.free)} free slots of "
                             f"{self.decoder.pool_size}")
        for i, p in enumerate(prompts):
            if not 1 <= len(p) < self.capacity:
                raise UsageError(f"prompt {i}: {len(p)} tokens; the engine caches 1 to {self.capacity - 1} "
                                 "prompt tokens (capacity)")
        dev = self.decoder.device
        ids = torch.tensor([int(t) for p in prompts for t in p], dtype=torch.long, device=dev)
        cu = [0]
        for p in prompts:
            cu.append(cu[-1] + len(p))
        logits, states = self.model.forward_prefill(ids, torch.tensor(cu, dtype=torch.int32, device=dev),
                                                    last_only=True)
        slots = [self.free.pop() for _ in prompts]
        self.decoder.write_prefill(slots, states, cu)
        for s, p in zip(slots, prompts):
            self.lengths[s] = len(p)
        return slots, logits

    def step(self, slots: Sequence[int], ids: Tensor) -> Tensor:
        """One decode step for the sequences at ``slots`` (any live subset, any order) with their new token ids
        (a device tensor [B]) -> logits [B, vocab] (valid until the next step)."""
        for s in slots:
            if s not in self.lengths:
                raise ValueError(f"slot {s} holds no live sequence")
            if self.lengths[s] >= self.capacity:
                raise UsageError(f"slot {s}: {self.lengths[s]} tokens fill the engine's capacity {self.capacity}")
            self.lengths[s] += 1
        key = tuple(slots)
        if key != self._slots_key:                                     # copied only when the batch changes
            self._slots_key = key
            self._slots_dev = torch.tensor(key, dtype=torch.long).to(self.decoder.device)
        return self.decoder.step(ids.to(self.decoder.device), self._slots_dev)

    def release(self, slots: Sequence[int]) -> None:
        for s in slots:
            if self.lengths.pop(s, None) is None:
                raise ValueError(f"slot {s} holds no live sequence")
            self.free.append(s)


def engine_generate(engine: DecodeEngine, prompts: Sequence[Sequence[int]],
                    max_new_tokens: Union[int, Sequence[int]], sampling: Optional[SamplingConfig] = None,
                    eos_token_ids: Sequence[int] = (), arrivals: Optional[Sequence[int]] = None,
                    stop_strings: Sequence[str] = (), decode_text: Optional[Callable[[list[int]], str]] = None,
                    on_text: Optional[Callable[[int, str], None]] = None) -> GenerationResult:
    """Generate with continuous batching: prompt i joins at decode step ``arrivals[i]`` (default 0: all at once,
    as pool slots allow; a prompt waits while the pool is full) and leaves at an eos id, a stop string (with
    ``decode_text``) or after its budget (``max_new_tokens``: one, or one per prompt). The result is
    :class:`.generation.GenerationResult` (prefill time: the engine's prefills; decode: the steps, synchronised)."""
    N = len(prompts)
    budgets = token_budgets(max_new_tokens, N)
    stop_strings = check_stop_strings(stop_strings)
    if (stop_strings or on_text is not None) and decode_text is None:
        raise UsageError("stop strings and streamed text need a tokenizer (the folder has no tokenizer.json)")
    arrivals = list(arrivals) if arrivals is not None else [0] * N
    dev = engine.decoder.device
    sampler = Sampler(sampling, prompts, engine.model.hybrid_config.vocab_size, device=dev)
    streams = [TextStream(decode_text, stop_strings) for _ in prompts] if decode_text is not None else None
    eos = set(int(t) for t in eos_token_ids)
    tokens: list[list[int]] = [[] for _ in prompts]
    reasons = ["length"] * N
    prefill_logits: list[Optional[Tensor]] = [None] * N
    waiting = sorted(range(N), key=lambda i: (arrivals[i], i))
    live: list[int] = []                     # prompt indices in the batch
    slot_of: dict[int, int] = {}
    next_ids: dict[int, Tensor] = {}         # prompt -> its next input token (device [1])
    step, t_pre, t_dec, steps, produced = 0, 0.0, 0.0, 0, 0

    def take(rows: list[int], logits: Tensor) -> None:
        ids = sampler(logits, rows)
        for r, (i, t) in enumerate(zip(rows, ids.tolist())):
            why = accept_token(i, t, tokens, budgets[i], eos, streams, on_text)
            if why is None:
                next_ids[i] = ids[r:r + 1]
                continue
            reasons[i] = why
            engine.release([slot_of[i]])
            live.remove(i)

    while waiting or live:
        joining, waiting = admit(waiting, arrivals, step, len(engine.free))
        if joining:
            sync(dev)
            t0 = time.perf_counter()
            slots, logits = engine.add([prompts[i] for i in joining])
            sync(dev)
            t_pre += time.perf_counter() - t0
            for r, i in enumerate(joining):
                prefill_logits[i] = logits[r].float().cpu()
            slot_of.update(zip(joining, slots))
            live.extend(joining)
            take(joining, logits)
        if live:
            rows = list(live)
            ids = torch.cat([next_ids[i] for i in rows])
            sync(dev)
            t0 = time.perf_counter()
            logits = engine.step([slot_of[i] for i in rows], ids)
            sync(dev)
            t_dec += time.perf_counter() - t0
            steps, produced = steps + 1, produced + len(rows)
            take(rows, logits)
        step += 1
    return GenerationResult(tokens, torch.stack(prefill_logits), t_pre, t_dec, steps, produced,
                            [r != "length" for r in reasons], reasons,
                            None if streams is None else [s.text for s in streams], sampler.seed)

