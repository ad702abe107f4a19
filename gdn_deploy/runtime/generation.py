"""Generation from an export folder with any backend (greedy by default; sampling, stop strings, streaming).

One prefill call for all prompts (packed, ``cu_seqlens``; sequences of different lengths), then one decode call
per step for the whole batch: every sequence at its own position, its states carried from the previous call.
A sequence that emits an end-of-sequence id (the sidecar's ``generation.eos_token_ids`` unless given) stops and
leaves the batch (its state rows are dropped), so sequences finish at different times.
With ``prefill_chunk`` (folders whose prefill continues), a prompt longer than that is prefilled in pieces of at
most that many tokens, each continuing from the previous piece's states (:mod:`.chunked_prefill`): the prefill's
memory is bounded by the chunk; the tokens equal the one-call prefill's, the logits to rounding.

The next token comes from :class:`.sampling.Sampler` (``sampling``: temperature, top-k/p, min-p, repetition
penalty, seed; greedy when left out). With ``decode_text`` (ids -> text), each sequence's text is built
incrementally (:class:`.streaming.TextStream`): ``stop_strings`` end a sequence where one appears, and ``on_text(i,
piece)`` receives each prompt's new text as it arrives. ``max_new_tokens`` is one budget or one per prompt.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..errors import UsageError
from .chunked_prefill import check_prefill_chunk, prefill_into
from .folder import ExportFolder
from .ort_binding import bound_states_for
from .sampling import Sampler, SamplingConfig
from .states import (StateHolder, TensorStates, decode_states_after_prefill, empty_state_feed, last_token_logits,
                     pack_prompts, prefill_feed)
from .streaming import TextStream, accept_token, check_stop_strings

__all__ = ["GenerationResult", "generate", "check_prompts", "pack_prompts", "prefill_feed", "fresh_prefill_feed",
           "state_holder", "empty_state_feed", "decode_states_after_prefill"]


@dataclass
class GenerationResult:
    tokens: list[list[int]]                 # generated ids per prompt (an eos id included when it stopped one)
    prefill_logits: Tensor                  # [N, vocab] float32: each prompt's last-token logits
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0                  # tokens produced by decode calls (batch rows summed over steps)
    finished: list[bool] = field(default_factory=list)   # stopped by an eos id or a stop string
    stop_reasons: list[str] = field(default_factory=list)  # "eos", "stop" (a stop string) or "length"
    texts: Optional[list[str]] = None       # with decode_text: each prompt's text (cut before a stop string)
    seed: Optional[int] = None              # the sampler's seed (given or drawn)
    decode_cpu_seconds: float = 0.0         # the calling thread's CPU time in the decode calls (onnxruntime with
                                            # 1 intra-op thread runs in it; other processes barely change it)

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens produced by decode calls over their time."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def token_budgets(max_new_tokens, n: int) -> list[int]:
    """One new-token budget per prompt from an int or a sequence of n ints (UsageError otherwise)."""
    many = isinstance(max_new_tokens, (list, tuple))
    vals = list(max_new_tokens) if many else [max_new_tokens] * n
    if many and len(vals) != n:
        raise UsageError(f"-n/--max-new-tokens: {len(vals)} budgets given for {n} prompts (give one, or one per "
                         "prompt)")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"-n/--max-new-tokens {v!r}: expected an integer >= 1")
    return vals


def check_prompts(folder: ExportFolder, prompts: Sequence[Sequence[int]],
                  max_new_tokens: Union[int, Sequence[int]]) -> None:
    """UsageError (one line) for n < 1, an empty prompt, an id outside the vocabulary, or prompt + n beyond the
    model's position limit (``max_new_tokens``: one budget, or one per prompt)."""
    if not isinstance(max_new_tokens, (list, tuple)):
        token_budgets(max_new_tokens, 1)
    if not prompts:
        raise UsageError("no prompts: give at least one (--ids 1,2,3 or -p TEXT)")
    budgets = token_budgets(max_new_tokens, len(prompts))
    V, limit = folder.vocab_size, folder.max_positions
    for i, p in enumerate(prompts):
        max_new_tokens = budgets[i]
        if len(p) == 0:
            raise UsageError(f"prompt {i} is empty: every prompt needs at least one token")
        bad = [t for t in p if not 0 <= int(t) < V]
        if bad:
            raise UsageError(f"prompt {i}: token id(s) {bad[:3]} outside the vocabulary [0, {V})")
        if limit and len(p) + max_new_tokens > limit:
            raise UsageError(f"prompt {i}: {len(p)} tokens + {max_new_tokens} new exceed the model's position limit "
                             f"(max_position_embeddings={limit}); shorten the prompt or lower -n")


def fresh_prefill_feed(folder: ExportFolder, ids: Tensor, cu: Tensor, pos: Tensor, capacity: int) -> dict[str, Tensor]:
    """The prefill graph's feed for packed prompts that start from empty states (KV caches of ``capacity``)."""
    n = int(cu.shape[0]) - 1
    return {**prefill_feed(folder, ids, cu, pos), **empty_state_feed(folder, n, capacity, ids.device)}


def state_holder(folder: ExportFolder, backend) -> StateHolder:
    """Where generation keeps the states on ``backend``: bound in place on onnxruntime where the graphs allow it
    (:class:`.ort_binding.BoundStates`), else tensors in and out (:class:`.states.TensorStates`)."""
    return bound_states_for(folder, backend) or TensorStates(folder, backend)


def sync(device: torch.device) -> None:
    """Wait for ``device``'s work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(folder: ExportFolder, backend, prompts: Sequence[Sequence[int]], max_new_tokens: Union[int, Sequence[int]],
             eos_token_ids: Optional[Sequence[int]] = None, sampling: Optional[SamplingConfig] = None,
             stop_strings: Sequence[str] = (), decode_text: Optional[Callable[[list[int]], str]] = None,
             on_text: Optional[Callable[[int, str], None]] = None,
             prefill_chunk: Optional[int] = None) -> GenerationResult:
    check_prompts(folder, prompts, max_new_tokens)
    prefill_chunk = check_prefill_chunk(folder, prefill_chunk)
    budgets = token_budgets(max_new_tokens, len(prompts))
    max_new_tokens = max(budgets)
    stop_strings = check_stop_strings(stop_strings)
    if (stop_strings or on_text is not None) and decode_text is None:
        raise UsageError("stop strings and streamed text need a tokenizer (the folder has no tokenizer.json)")
    dev = backend.device
    ids, cu, pos = pack_prompts(prompts, dev)
    N = len(prompts)
    if folder.interop:
        from ..export.interop import require_equal_lengths
        require_equal_lengths(cu)
    lens = [len(p) for p in prompts]
    capacity = max(lens) + max_new_tokens
    states = state_holder(folder, backend)
    if prefill_chunk is not None and max(lens) > prefill_chunk:     # in pieces, continuing (chunked_prefill)
        states.capacity = capacity
        zeros = empty_state_feed(folder, N, capacity, states.device)
        sync(dev)
        t0 = time.perf_counter()
        logits = prefill_into(states, prompts, [0] * N, zeros, prefill_chunk)
    else:
        states.start(N, capacity)
        feed = prefill_feed(folder, ids, cu, pos)
        sync(dev)
        t0 = time.perf_counter()
        logits = last_token_logits(states.run("prefill", feed)["logits"], cu)
    sync(dev)
    t_prefill = time.perf_counter() - t0
    prefill_logits = logits.float().cpu()
    eos = set(folder.eos_token_ids if eos_token_ids is None else eos_token_ids)
    tokens: list[list[int]] = [[] for _ in prompts]
    finished = [False] * N
    reasons = ["length"] * N
    sampler = Sampler(sampling, prompts, folder.vocab_size, device=logits.device)
    streams = [TextStream(decode_text, stop_strings) for _ in prompts] if decode_text is not None else None
    alive = list(range(N))                        # prompt index of each batch row
    positions = torch.tensor(lens, dtype=torch.long, device=dev)
    t_decode, c_decode, steps, produced = 0.0, 0.0, 0, 0
    for step in range(max_new_tokens):
        nxt = sampler(logits, alive)
        keep = []
        for row, t in enumerate(nxt.tolist()):
            i = alive[row]
            why = accept_token(i, t, tokens, budgets[i], eos, streams, on_text)
            if why is None:
                keep.append(row)
            else:
                finished[i], reasons[i] = why != "length", why
        if not keep:
            break
        if len(keep) < len(alive):                # finished sequences leave the batch
            rows = torch.tensor(keep, dtype=torch.long)
            alive = [alive[r] for r in keep]
            nxt, positions = nxt[rows.to(nxt.device)], positions[rows.to(positions.device)]
            states.select(rows)
        feed = {"input_ids": nxt.to(dev)}
        if folder.has_positions:
            feed["positions"] = positions.to(dev)
        sync(dev)
        t0, c0 = time.perf_counter(), time.thread_time()
        out = states.run("decode", feed)
        sync(dev)
        t_decode += time.perf_counter() - t0
        c_decode += time.thread_time() - c0
        steps, produced = steps + 1, produced + len(alive)
        logits = out["logits"]
        positions = positions + 1
    return GenerationResult(tokens, prefill_logits, t_prefill, t_decode, steps, produced, finished, reasons,
                            None if streams is None else [s.text for s in streams], sampler.seed, c_decode)
