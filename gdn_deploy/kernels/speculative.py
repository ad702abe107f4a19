"""CUDA implementations of ``gdn::verify``, ``gdn::commit`` and ``gdn::commit_`` (``gdnVerify.cu``).

:func:`gdn_deploy.kernels.register` registers them for the ``cuda`` device. Shapes and dtypes are validated
on the host; values (offsets, accepted counts, slots) are never read there, so a call does not synchronise
with the device and can be captured in a CUDA graph: the kernels clamp them instead (each sequence's token
range to [0, T] and ``max_draft_tokens``, ``accepted[n]`` to [0, T_n]; a slot outside [0, P-1] skips the
sequence), as ``docs/speculative.md`` says of the ops where values are not read. Shapes the kernels do not
support (head dims outside ``kernel_head_dims``) run the PyTorch reference with a one-time warning.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..spec import COMMIT, VERIFY
from ..validate import validate_commit, validate_verify
from .launch import KernelUnsupported, _ptr, _stream, dtype_code
from .library import GdnCommitParams, GdnVerifyParams, error_text

_ATTRS4 = ("gate_mode", "use_qk_l2norm", "scale", "l2norm_eps")


def verify_params(q, k, v, g, beta, cu_seqlens, state, slots, A_log, dt_bias, o, c_k, c_delta, c_g, *,
                  gate_mode: int, use_qk_l2norm: int, scale: float, l2norm_eps: float,
                  state_mode: int) -> GdnVerifyParams:
    p = GdnVerifyParams()
    p.T, p.Hk, p.K = q.shape
    p.Hv, p.V = v.shape[1], v.shape[2]
    p.N = cu_seqlens.shape[0] - 1
    p.P = state.shape[0]
    p.ioType, p.gateType = dtype_code(q.dtype), dtype_code(g.dtype)
    p.gateMode, p.useQkL2norm, p.stateMode = int(gate_mode), int(use_qk_l2norm), int(state_mode)
    p.scale, p.l2normEps = float(scale), float(l2norm_eps)
    p.q, p.k, p.v, p.g, p.beta = _ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta)
    p.cuSeqlens, p.state, p.slots = _ptr(cu_seqlens), _ptr(state), _ptr(slots)
    p.ALog, p.dtBias = _ptr(A_log), _ptr(dt_bias)
    p.o, p.commitK, p.commitDelta, p.commitG = _ptr(o), _ptr(c_k), _ptr(c_delta), _ptr(c_g)
    return p


def commit_params(state, c_k, c_delta, c_g, cu_seqlens, accepted, slots, *, state_mode: int) -> GdnCommitParams:
    p = GdnCommitParams()
    p.T, p.Hk, p.K = c_k.shape
    p.Hv, p.V = c_delta.shape[1], c_delta.shape[2]
    p.N = cu_seqlens.shape[0] - 1
    p.P = state.shape[0]
    p.stateMode = int(state_mode)
    p.commitK, p.commitDelta, p.commitG = _ptr(c_k), _ptr(c_delta), _ptr(c_g)
    p.cuSeqlens, p.accepted, p.slots, p.state = _ptr(cu_seqlens), _ptr(accepted), _ptr(slots), _ptr(state)
    return p


def _launch(lib, name: str, p, device: torch.device) -> None:
    launch_fn = getattr(lib, f"gdn{name}LaunchC")
    supports = getattr(lib, f"gdn{name}SupportsC")
    with torch.cuda.device(device):
        rc = launch_fn(ctypes.byref(p), ctypes.c_void_p(_stream(device)))
    if rc < 0:
        raise KernelUnsupported(f"gdn {name.lower()} kernel: unsupported parameters: "
                                f"{(supports(ctypes.byref(p)) or b'').decode()}")
    if rc != 0:
        raise RuntimeError(f"gdn {name.lower()} kernel launch failed: {error_text(lib, rc)}")


def launch_verify(lib, p: GdnVerifyParams, device: torch.device) -> None:
    _launch(lib, "Verify", p, device)


def launch_commit(lib, p: GdnCommitParams, device: torch.device) -> None:
    _launch(lib, "Commit", p, device)


def make_cuda_ops(lib, same_device, contiguous, fallback):
    """The three CUDA implementations, closing over the loaded library and the package's helpers."""

    def verify_cuda(q, k, v, g, beta, cu_seqlens, state, slots=None, A_log=None, dt_bias=None, gate_mode=0,
                    use_qk_l2norm=0, scale=0.0, l2norm_eps=1e-6, state_mode=0):
        attrs = VERIFY.attrs(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=l2norm_eps,
                             state_mode=state_mode)
        args = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, state=state, slots=slots, A_log=A_log,
                    dt_bias=dt_bias)
        validate_verify(args, attrs, check_values=False)
        dev = same_device(tuple(args), tuple(args.values()))
        q, k, v, g, beta, cu_seqlens, state, slots, A_log, dt_bias = (contiguous(t) for t in args.values())
        f32 = dict(dtype=torch.float32, device=dev)
        o = torch.empty_like(v)
        c_k, c_delta, c_g = torch.empty(k.shape, **f32), torch.empty(v.shape, **f32), torch.empty(g.shape, **f32)
        p = verify_params(q, k, v, g, beta, cu_seqlens, state, slots, A_log, dt_bias, o, c_k, c_delta, c_g,
                          state_mode=attrs["state_mode"], **{a: attrs[a] for a in _ATTRS4})
        try:
            launch_verify(lib, p, dev)
        except KernelUnsupported as e:
            fallback("verify", str(e))
            outs = reference.verify_ref(q, k, v, g, beta, cu_seqlens, state, slots, A_log, dt_bias,
                                        state_mode=attrs["state_mode"], check_values=False,
                                        **{a: attrs[a] for a in _ATTRS4})
            return tuple(t.contiguous() for t in outs)
        return o, c_k, c_delta, c_g

    def _commit_into(work, c_k, c_delta, c_g, cu_seqlens, accepted, slots, state_mode) -> Optional[str]:
        names = ("state", "commit_k", "commit_delta", "commit_g", "cu_seqlens", "accepted", "slots")
        tensors = (work, c_k, c_delta, c_g, cu_seqlens, accepted, slots)
        validate_commit(dict(zip(names, tensors)), COMMIT.attrs(state_mode=state_mode), check_values=False)
        dev = same_device(names, tensors)
        c_k, c_delta, c_g, cu_seqlens, accepted, slots = (contiguous(t) for t in tensors[1:])
        p = commit_params(work, c_k, c_delta, c_g, cu_seqlens, accepted, slots, state_mode=int(state_mode))
        try:
            launch_commit(lib, p, dev)
        except KernelUnsupported as e:
            fallback("commit", str(e))
            work.copy_(reference.commit_ref(work, c_k, c_delta, c_g, cu_seqlens, accepted, slots,
                                            state_mode=state_mode, check_values=False))
        return None

    def commit_cuda(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None, state_mode=0):
        new = state.contiguous().clone()  # (a fresh allocation: 256-byte aligned)
        _commit_into(new, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots, state_mode)
        return new

    def commit_inplace_cuda(state, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots=None,
                            state_mode=0):
        direct = state.is_contiguous() and state.data_ptr() % 16 == 0
        work = state if direct else state.contiguous().clone()
        _commit_into(work, commit_k, commit_delta, commit_g, cu_seqlens, accepted, slots, state_mode)
        if not direct:
            state.copy_(work)

    return verify_cuda, commit_cuda, commit_inplace_cuda
