"""Feed-forward layers: dense SwiGLU and the sparse MoE of Qwen3-Next / Qwen3.5-MoE.

Parameter names and layouts equal HF transformers 5 (``gate_proj``/``up_proj``/``down_proj``; MoE: ``gate.weight
[E, hidden]`` router, ``experts.gate_up_proj [E, 2I, hidden]`` (gate rows then up rows), ``experts.down_proj
[E, hidden, I]``, ``shared_expert.*`` and ``shared_expert_gate.weight [1, hidden]``). Checkpoints that store one
module per expert (``experts.{e}.gate_proj.weight`` ...) are stacked into this layout when loaded.

MoE math (HF): router softmax in float32 over E experts, top-k, renormalised to sum 1 when ``norm_topk_prob``,
cast to the model dtype; output = sum_k w_k * SwiGLU_{e_k}(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x).

Five ways to compute the routed part (``SparseMoE.impl``), equal up to float summation order:

- ``"routed"`` (default, eager PyTorch): each expert runs only on the tokens routed to it (k/E of the dense
  FLOPs; data-dependent shapes, so not for export);
- ``"gather"``: each token gathers its k experts' weights (``[R, k, 2I, hidden]``) and runs them; reads k/E of the
  expert weights per token: the decode graph's choice;
- ``"dense"``: every expert on every token as two GEMMs over the stacked weights, the non-selected experts
  weighted 0 (E/k times the routed FLOPs, an ``[R, E*2I]`` intermediate);
- ``"grouped"``: routed compute with shapes that depend only on the token count (:func:`grouped_blocks`): the
  prefill graph's choice. The ``M = T*k`` (token, expert) rows are placed by expert into blocks of ``rows``
  rows, each block holding rows of one expert only (its last block padded); one weight gather per block and two
  batched MatMuls over the blocks compute every row, then each token gathers its k rows back. Rows computed <=
  ``max(2*rows, M*(1 + 1/GROUPED_SLACK) + E + rows)`` with ``rows ~ M/(GROUPED_SLACK*E)``: within 1.25x of the
  routed FLOPs once ``M >= 24 (E+1)`` (E >= 4); expert matrices gathered per layer call <= ``(GROUPED_SLACK+1)*E
  + 2`` (``(M + E)/2 + 1`` for short prompts). Standard ONNX ops only (CumSum, ScatterElements, GatherND, batched
  MatMul), so the TensorRT copies keep it.
- ``"op"``: router logits and expert weights into one op, :func:`gdn_deploy.lm.moe_op.moe` (routed compute
  eagerly; one ``com.microsoft::MoE`` node in the onnxruntime graphs, ``grouped`` / ``gather`` ops in their
  TensorRT copies): the onnxruntime graphs' choice where the installed onnxruntime has the op.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .moe_op import moe as moe_op, moe_route, routed_experts

__all__ = ["SwiGLU", "MoEConfig", "Experts", "SparseMoE", "MOE_IMPLS", "GROUPED_SLACK", "grouped_blocks"]

MOE_IMPLS = ("routed", "gather", "dense", "grouped", "op")
GROUPED_SLACK = 6           # padding budget of "grouped": about M/GROUPED_SLACK padding rows


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "intermediate_size", "shared_expert_intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoE {name}: expected a positive int, got {v!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoE num_experts_per_tok={self.top_k} exceeds num_experts={self.num_experts}")

    def to_dict(self) -> dict:
        return asdict(self)


def grouped_blocks(tokens, top_k: int, num_experts: int, slack: int = GROUPED_SLACK):
    """(rows per block, blocks) of the "grouped" form for ``tokens`` tokens: enough blocks for any routing.

    With ``M = tokens * top_k`` rows and ``c_e`` rows for expert e, the blocks needed are ``sum_e ceil(c_e / rows)
    <= (M + E*(rows-1)) / rows``; ``rows = 2 + (M-1) // (slack*E)`` keeps the padding ``E*(rows-1)`` near
    ``M/slack``. Both are >= 2 by construction, so torch.export can prove it for every token count (a size that
    may be 0 or 1 would be specialised to the example's); ``tokens`` may be a symbolic int."""
    m, e = tokens * top_k, num_experts
    rows = 2 + (m - 1) // (slack * e)
    return rows, torch.sym_max(2, 1 + (m - 1 + e * (rows - 1)) // rows)


class Experts(nn.Module):
    def __init__(self, hidden: int, c: MoEConfig):
        super().__init__()
        self.num_experts, self.inter = c.num_experts, c.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(c.num_experts, 2 * c.intermediate_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(c.num_experts, hidden, c.intermediate_size))
        nn.init.normal_(self.gate_up_proj, std=hidden ** -0.5)
        nn.init.normal_(self.down_proj, std=c.intermediate_size ** -0.5)

    def routed(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        return routed_experts(x, idx, w, self.gate_up_proj, self.down_proj)

    def gather(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        gu = self.gate_up_proj[idx]                                   # [R, k, 2I, hidden]
        h = torch.matmul(gu, x[:, None, :, None]).squeeze(-1)         # [R, k, 2I]
        g, u = h[..., :self.inter], h[..., self.inter:]
        a = F.silu(g) * u                                             # [R, k, I]
        y = torch.matmul(self.down_proj[idx], a[..., None]).squeeze(-1)   # [R, k, hidden]
        return (y * w[..., None]).sum(1)

    def dense(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        R, E, I = x.shape[0], self.num_experts, self.inter
        full = torch.zeros(R, E, dtype=w.dtype, device=w.device).scatter(1, idx, w)      # [R, E], 0 off-route
        h = torch.matmul(x, self.gate_up_proj.reshape(E * 2 * I, -1).t()).reshape(R, E, 2 * I)
        a = F.silu(h[..., :I]) * h[..., I:] * full[..., None]                         # [R, E, I]
        down = self.down_proj.permute(0, 2, 1).reshape(E * I, -1)                      # [E*I, hidden]
        return torch.matmul(a.reshape(R, E * I), down)


    def grouped(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        T, k = idx.shape
        E, I, H = self.num_experts, self.inter, x.shape[-1]
        rows, nb = grouped_blocks(T, k, E)
        # integer bookkeeping in float32 (TensorRT's CumSum is float only; exact below 2^24 rows)
        chosen = torch.zeros(T, E, dtype=torch.float32, device=x.device).scatter(1, idx, 1.0)   # [T, E] 0/1
        before = torch.cumsum(chosen, 0) - chosen                 # earlier tokens that chose e
        counts = chosen.sum(0).long()                             # [E]
        b = torch.arange(nb, device=x.device)
        blocks = (b[None, :] * rows < counts[:, None]).long().sum(1)                 # ceil(counts / rows)
        end = torch.cumsum(blocks.float(), 0).long()              # first block after expert e's
        tok = torch.arange(T, device=x.device)[:, None].expand(T, k)
        rank = before.reshape(T * E)[(tok * E + idx).reshape(T * k)].long()         # row's place within its expert
        dest = (end - blocks)[idx.reshape(T * k)] * rows + rank                     # [M] row of each (token, expert)
        # padding rows read token 0; their outputs are never gathered back
        src = torch.zeros(nb * rows, dtype=torch.long, device=x.device).scatter(0, dest, tok.reshape(T * k))
        blk_e = (end[None, :] <= b[:, None]).long().sum(1).clamp(max=E - 1)          # [nb] expert of each block
        xb = x[src].reshape(nb, rows, H)
        h = torch.matmul(xb, self.gate_up_proj.transpose(1, 2)[blk_e])             # [nb, rows, 2I]
        a = F.silu(h[..., :I]) * h[..., I:]
        y = torch.matmul(a, self.down_proj.transpose(1, 2)[blk_e]).reshape(nb * rows, H)
        return (y[dest].reshape(T, k, H) * w[..., None]).sum(1)


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, c: MoEConfig):
        super().__init__()
        self.config = c
        self.impl = "routed"
        self.gate = nn.Linear(hidden, c.num_experts, bias=False)
        self.experts = Experts(hidden, c)
        self.shared_expert = SwiGLU(hidden, c.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def route(self, x: Tensor):
        """x [R, hidden] -> (expert ids [R, k] int64, weights [R, k] in the model dtype)."""
        return moe_route(self.gate(x), self.config.top_k, self.config.norm_topk_prob)

    def forward(self, x: Tensor) -> Tensor:
        if self.impl not in MOE_IMPLS:
            raise ValueError(f"SparseMoE.impl: expected one of {MOE_IMPLS}, got {self.impl!r}")
        if self.impl == "op":
            e = self.experts
            routed = moe_op(x, self.gate(x), e.gate_up_proj, e.down_proj, self.config.top_k, self.config.norm_topk_prob)
        else:
            idx, w = self.route(x)
            routed = getattr(self.experts, self.impl)(x, idx, w)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared
