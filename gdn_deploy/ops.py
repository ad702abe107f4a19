"""``torch.library`` custom ops of the gdn contract (namespace ``gdn``).

- ``gdn::prefill``      GatedDeltaPrefill: packed varlen tokens -> (o, final_state)
- ``gdn::decode``       GatedDeltaDecode, state_mode 0: one token per sequence -> (o, new_state)
- ``gdn::decode_pool_`` GatedDeltaDecode, state_mode 1: updates ``pool`` in place at ``slots`` -> o
- ``gdn::verify``       GatedDeltaVerify: <= 16 tokens per sequence from a state it only reads -> (o, commit factors)
- ``gdn::commit`` / ``gdn::commit_``  GatedDeltaCommit: replay the accepted factors -> new state / in place

Verify and commit run the CUDA kernels of :mod:`gdn_deploy.kernels.speculative` on CUDA tensors when the kernel
library is available; otherwise they raise NotImplementedError there (the reference would read counts and offsets
on the host every step); docs/speculative.md.

The default implementation (every device) is the PyTorch reference of
:mod:`gdn_deploy.reference`; importing this module calls :func:`gdn_deploy.kernels.register`,
which registers the CUDA kernels for the ``cuda`` device when the library is built and usable
(a warning says why not when it exists but cannot be used; ``GDN_REQUIRE_KERNELS=1`` makes that an error). Fake implementations give shapes for
``torch.export``/``torch.compile`` tracing and ONNX export.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import reference
from .spec import COMMIT, DECODE, PREFILL, VERIFY
from .validate import validate_commit, validate_decode, validate_prefill, validate_verify

_D = PREFILL.defaults
_DD = DECODE.defaults
_DV = VERIFY.defaults


def _on_cpu(*ts: Optional[Tensor]) -> bool:
    return all(t is None or t.device.type == "cpu" for t in ts)


@torch.library.custom_op("gdn::prefill", mutates_args=())
def prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
            initial_state: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
            gate_mode: int = _D["gate_mode"], use_qk_l2norm: int = _D["use_qk_l2norm"],
            scale: float = _D["scale"], l2norm_eps: float = _D["l2norm_eps"]) -> tuple[Tensor, Tensor]:
    o, s = reference.prefill_ref(q, k, v, g, beta, cu_seqlens, initial_state, A_log, dt_bias,
                                 gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale,
                                 l2norm_eps=l2norm_eps, form="chunked",
                                 check_values=_on_cpu(q, cu_seqlens))
    return o.contiguous(), s.contiguous()


@prefill.register_fake
def _(q, k, v, g, beta, cu_seqlens, initial_state, A_log=None, dt_bias=None, gate_mode=_D["gate_mode"],
      use_qk_l2norm=_D["use_qk_l2norm"], scale=_D["scale"], l2norm_eps=_D["l2norm_eps"]):
    attrs = PREFILL.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps)
    validate_prefill(dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                          A_log=A_log, dt_bias=dt_bias), attrs, check_values=False)
    return v.new_empty(v.shape), initial_state.new_empty(initial_state.shape)


@torch.library.custom_op("gdn::decode", mutates_args=())
def decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
           A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
           gate_mode: int = _DD["gate_mode"], use_qk_l2norm: int = _DD["use_qk_l2norm"],
           scale: float = _DD["scale"], l2norm_eps: float = _DD["l2norm_eps"]) -> tuple[Tensor, Tensor]:
    o, s = reference.decode_ref(q, k, v, g, beta, state, None, A_log, dt_bias, gate_mode=gate_mode,
                                use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                                state_mode=0, check_values=_on_cpu(q))
    return o.contiguous(), s.contiguous()


@decode.register_fake
def _(q, k, v, g, beta, state, A_log=None, dt_bias=None, gate_mode=_DD["gate_mode"],
      use_qk_l2norm=_DD["use_qk_l2norm"], scale=_DD["scale"], l2norm_eps=_DD["l2norm_eps"]):
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale,
                         l2norm_eps=l2norm_eps, state_mode=0)
    validate_decode(dict(q=q, k=k, v=v, g=g, beta=beta, state=state, A_log=A_log, dt_bias=dt_bias),
                    attrs, check_values=False)
    return v.new_empty(v.shape), state.new_empty(state.shape)


@torch.library.custom_op("gdn::decode_pool_", mutates_args=("pool",))
def decode_pool_(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor, slots: Tensor,
                 A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                 gate_mode: int = _DD["gate_mode"], use_qk_l2norm: int = _DD["use_qk_l2norm"],
                 scale: float = _DD["scale"], l2norm_eps: float = _DD["l2norm_eps"]) -> Tensor:
    o, new = reference.decode_ref(q, k, v, g, beta, pool, slots, A_log, dt_bias, gate_mode=gate_mode,
                                  use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                                  state_mode=1, check_values=_on_cpu(q, slots))
    used = slots.to(torch.long)
    used = used[used >= 0]
    pool.index_copy_(0, used, new.index_select(0, used).to(pool.dtype))
    return o.contiguous()


@decode_pool_.register_fake
def _(q, k, v, g, beta, pool, slots, A_log=None, dt_bias=None, gate_mode=_DD["gate_mode"],
      use_qk_l2norm=_DD["use_qk_l2norm"], scale=_DD["scale"], l2norm_eps=_DD["l2norm_eps"]):
    attrs = DECODE.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale,
                         l2norm_eps=l2norm_eps, state_mode=1)
    validate_decode(dict(q=q, k=k, v=v, g=g, beta=beta, state=pool, slots=slots, A_log=A_log, dt_bias=dt_bias),
                    attrs, check_values=False)
    return v.new_empty(v.shape)


@torch.library.custom_op("gdn::verify", mutates_args=())
def verify(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, state: Tensor,
           slots: Optional[Tensor] = None, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
           gate_mode: int = _DV["gate_mode"], use_qk_l2norm: int = _DV["use_qk_l2norm"],
           scale: float = _DV["scale"], l2norm_eps: float = _DV["l2norm_eps"],
           state_mode: int = _DV["state_mode"]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    outs = reference.verify_ref(q, k, v, g, beta, cu_seqlens, state, slots, A_log, dt_bias, gate_mode=gate_mode,
                                use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                                state_mode=state_mode, check_values=_on_cpu(q, cu_seqlens, slots))
    return tuple(t.contiguous() for t in outs)


@verify.register_fake
def _(q, k, v, g, beta, cu_seqlens, state, slots=None, A_log=None, dt_bias=None, gate_mode=_DV["gate_mode"],
      use_qk_l2norm=_DV["use_qk_l2norm"], scale=_DV["scale"], l2norm_eps=_DV["l2norm_eps"],
      state_mode=_DV["state_mode"]):
    attrs = VERIFY.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                         state_mode=state_mode)
    validate_verify(dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state=state, slots=slots,
                         A_log=A_log, dt_bias=dt_bias), attrs, check_values=False)
    f32 = dict(dtype=torch.float32, device=q.device)
    return (v.new_empty(v.shape), k.new_empty(k.shape, **f32), v.new_empty(v.shape, **f32),
            g.new_empty(g.shape, **f32))


def _commit(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots, state_mode):
    return reference.commit_ref(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots,
                                state_mode=state_mode, check_values=_on_cpu(state, cu_seqlens, accepted, slots))


@torch.library.custom_op("gdn::commit", mutates_args=())
def commit(state: Tensor, commit_k: Tensor, commit_delta: Tensor, commit_g: Tensor, cu_seqlens: Tensor,
           accepted: Tensor, slots: Optional[Tensor] = None, state_mode: int = 0) -> Tensor:
    return _commit(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots, state_mode).contiguous()


@commit.register_fake
def _(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None, state_mode=0):
    validate_commit(dict(state=state, commit_k=commit_k, commit_delta=commit_delta, commit_g=commit_g,
                         cu_seqlens=cu_seqlens, accepted=accepted, slots=slots),
                    COMMIT.attrs(state_mode=state_mode), check_values=False)
    return state.new_empty(state.shape)


@torch.library.custom_op("gdn::commit_", mutates_args=("state",))
def commit_(state: Tensor, commit_k: Tensor, commit_delta: Tensor, commit_g: Tensor, cu_seqlens: Tensor,
            accepted: Tensor, slots: Optional[Tensor] = None, state_mode: int = 0) -> None:
    """In place: rows (dense: n; pool: slots[n] >= 0) with an accepted count > 0 get the replayed state."""
    state.copy_(_commit(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots, state_mode))


@commit_.register_fake
def _(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None, state_mode=0):
    validate_commit(dict(state=state, commit_k=commit_k, commit_delta=commit_delta, commit_g=commit_g,
                         cu_seqlens=cu_seqlens, accepted=accepted, slots=slots),
                    COMMIT.attrs(state_mode=state_mode), check_values=False)
    return None


def _no_cuda_kernel(name: str):
    def raise_(*args, **kwargs):
        raise NotImplementedError(f"gdn::{name}: the CUDA kernel library is not available "
                                  f"({_kernels.status().reason}; docs/speculative.md): build it with "
                                  "scripts/build_kernels.sh, or run speculative decoding on the CPU")
    return raise_


for _op, _name in ((verify, "verify"), (commit, "commit"), (commit_, "commit_")):
    _op.register_kernel("cuda")(_no_cuda_kernel(_name))


from . import kernels as _kernels  # noqa: E402  (after the op definitions: registers their CUDA kernels)

_kernels.register()
