"""When may a greedy pick differ from a reference's? Shared by the bf16 GPU tests and the fp32 generation tests.

fp32 (``unexplained_difference``): two fp32 computations of one model may part only at a near-tie, where the
reference's logits of the two tokens are within what the comparison tolerance lets each move; the tokens after that
are not compared.

bf16 (``pick_errors``):
Teacher-forced on the reference's tokens ``tgt`` (one per position), ``ours`` picks ``pick = argmax``. The fp32
model ``r32`` judges: a differing pick is an error only where fp32 ranks it below the reference's token by more than
the bf16 noise of that position, ``r32[tgt] - r32[pick] > 2 * noise`` (each of the two bf16 computations may move
each logit by ``noise``). ``noise`` is the largest ``max |logits - r32|`` over every bf16 computation that chose or
scored these tokens: the reference's own generation step (its decode path, whose logits can differ from its
prefill's, e.g. where a MoE router sits near a tie), its prefill, and ours.

The comparison is signed: where fp32 prefers our pick to the reference's token, the reference made the bf16 slip
and ours is not at fault (an absolute gap there failed a qwen3_5_moe run on an H200 at position 12).
"""
from __future__ import annotations

import torch

__all__ = ["pick_errors", "unexplained_difference"]


def pick_errors(pick: torch.Tensor, tgt: torch.Tensor, r32: torch.Tensor, *bf16_logits: torch.Tensor) -> list[int]:
    """Positions where ``pick [P]`` is wrong given the reference's tokens ``tgt [P]``, the fp32 logits ``r32 [P, V]``
    and the bf16 logits ``[P, V]`` of each computation involved (see the module docstring)."""
    r32 = r32.double()
    noise = torch.stack([(x.double() - r32).abs().amax(-1) for x in bf16_logits]).amax(0)
    worse_by = r32.gather(-1, tgt[:, None].long())[:, 0] - r32.gather(-1, pick[:, None].long())[:, 0]
    bad = (pick != tgt) & (worse_by > 2 * noise)
    return bad.nonzero().flatten().tolist()


def unexplained_difference(got: list[int], want: list[int], logits_at, atol: float, rtol: float) -> str | None:
    """None where the greedy tokens ``got`` equal ``want`` or first part at a near-tie: ``logits_at(j)`` (the
    reference's logits [V] after ``want[:j]``) of the two tokens within what the tolerance |a - b| <= atol + rtol|b|
    lets each move, ``2 (atol + rtol max|logit|)``; else what differs, in one line."""
    j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if j is None:
        return None if len(got) == len(want) else f"{len(got)} tokens instead of {len(want)}"
    lg = logits_at(j)
    a, b = float(lg[got[j]]), float(lg[want[j]])
    tol = 2 * (atol + rtol * max(abs(a), abs(b)))
    if abs(a - b) <= tol:
        return None
    return f"first difference at new token {j}: {got[j]} instead of {want[j]}, whose reference logits differ by " \
           f"{abs(a - b):.2e} > {tol:.1e} (not a near-tie)"
