"""The contract's beta range [0, 2] (precomputed gates, OLMo-Hybrid's negative eigenvalues) on the CUDA kernels:
prefill (fp32 exact kernel, and the 16-bit tensor-core scans incl. the wgmma one on sm_90a) and decode against
the float64 reference, with strong and weak gates. Outputs are NaN-poisoned before each launch."""
from __future__ import annotations

import pytest
import torch

from conftest import call_decode_ref, make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.reference import prefill_ref
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, op_attrs, to_device

ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
GATES = {"strong": (-3.0, -0.5), "weak": (-0.01, 0.0)}
BETAS = {"uniform_0_2": (0.0, 2.0), "near_2": (1.9, 2.0)}


def _prefill(kernels, d):
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    attrs = op_attrs(0, 1)
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], d["initial_state"],
                                      o, final, None, None, **attrs)
    assert kernels.launch.prefill_supports(kernels.LIB, p) == ""
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
    kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"))
    torch.cuda.synchronize()
    return o, final


@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("betas", list(BETAS))
@pytest.mark.parametrize("K,V,io", [(128, 128, "bf16"), (128, 128, "f32"), (64, 64, "f16"), (64, 128, "bf16")])
def test_prefill_kernel_beta_up_to_two(kernels, gen, gates, betas, K, V, io):
    inp = make_prefill_inputs(gen, [0, 1, 63, 64, 65, 700], Hk=2, Hv=4, K=K, V=V, use_qk_l2norm=1,
                              g_range=GATES[gates], beta_range=BETAS[betas])
    d, r = to_device(inp, DT[io], torch.float32)
    o, final = _prefill(kernels, d)
    ro, rs = prefill_ref(*[r.get(n) for n in ORDER], form="chunked", **op_attrs(0, 1))
    assert not torch.isnan(o).any() and not torch.isnan(final).any(), "unwritten (NaN-poisoned) outputs"
    tol = tolerance_for(DT[io])
    assert rel_err(o, ro) <= tol, f"o rel err {rel_err(o, ro):.3e} > {tol}"
    assert rel_err(final, rs) <= tol, f"final_state rel err {rel_err(final, rs):.3e} > {tol}"


@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("betas", list(BETAS))
@pytest.mark.parametrize("io", ["f32", "bf16"])
@pytest.mark.parametrize("K,V", [(64, 64), (128, 128)])
def test_decode_kernel_beta_up_to_two(kernels, gen, gates, betas, io, K, V):
    inp = make_decode_inputs(gen, 5, Hk=2, Hv=4, K=K, V=V, use_qk_l2norm=1, g_range=GATES[gates],
                             beta_range=BETAS[betas])
    d, r = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(0, 1)
    o = torch.full_like(d["v"], float("nan"))
    s_out = torch.full_like(d["state"], float("nan"))
    p = kernels.launch.decode_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], s_out, o, None,
                                     None, None, state_mode=0, **attrs)
    kernels.launch.launch_decode(kernels.LIB, p, d["q"].device, 0)
    torch.cuda.synchronize()
    ro, rs = call_decode_ref(r, state_mode=0, **attrs)
    assert not torch.isnan(o).any() and not torch.isnan(s_out).any(), "unwritten (NaN-poisoned) outputs"
    assert rel_err(o, ro) <= tolerance_for(DT[io]), f"o rel err {rel_err(o, ro):.3e}"
    assert rel_err(s_out, rs) <= 1e-4, f"state rel err {rel_err(s_out, rs):.3e}"


def test_torch_ops_many_decode_steps_beta_two_stay_bounded(kernels, gen):
    """64 decode steps with beta = 2 and no decay (reflections): kernel == float64 reference step by step."""
    inp = make_decode_inputs(gen, 3, Hk=2, Hv=4, K=128, V=128, use_qk_l2norm=1, g_range=(0.0, 0.0),
                             beta_range=(2.0, 2.0))
    d, r = to_device(inp, torch.float32, torch.float32)
    s, s_ref = d["state"], r["state"]
    for _ in range(64):
        q, k, v = (torch.randn(d[n].shape, generator=gen).to("cuda") for n in ("q", "k", "v"))
        o, s = torch.ops.gdn.decode(q, k, v, d["g"], d["beta"], s, gate_mode=0, use_qk_l2norm=1)
        ro, s_ref = call_decode_ref(dict(q=q.double(), k=k.double(), v=v.double(), g=r["g"], beta=r["beta"],
                                         state=s_ref), state_mode=0, **op_attrs(0, 1))
    assert rel_err(s, s_ref) <= 1e-4 and float(s.abs().max()) < 1e3
