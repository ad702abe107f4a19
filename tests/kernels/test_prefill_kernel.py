"""CUDA prefill kernel (launchGdnPrefill through ctypes) against the float64 reference.

Every check draws fresh random inputs, poisons o and final_state with NaN before the launch and
checks that every element was written; the reference sees exactly the values the kernel sees (the
low-precision inputs upcast to float64, run through the exact chunked form on the GPU).
16-bit I/O runs the chunked tensor-core kernels (every scan the device runs, by name: mma.sync with 2 and
4 warps per CTA, and the wgmma scan on sm_90 with an sm_90a build, after and beside the prep kernel, by bulk
tensor copies and by cp.async); float32 I/O runs the exact fp32 kernel.
"""
from __future__ import annotations

import pytest
import torch

from conftest import make_prefill_inputs, rel_err
from gdn_deploy.reference import prefill_ref
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, SCAN_CONFIGS, op_attrs, scan_configs, to_device

ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
RAGGED = [0, 1, 63, 64, 65, 1000]


def _params(kernels, d, attrs, o, final, initial_state="given"):
    h0 = d["initial_state"] if initial_state == "given" else None
    return kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], h0, o, final,
                                         d.get("A_log"), d.get("dt_bias"), **attrs)


def _launch(kernels, p, ws, scan="auto", tma=True):
    kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), scan=scan, tma=tma)


def _run(kernels, d, attrs, *, scan="auto", tma=True, initial_state="given"):
    """Launch on NaN-poisoned outputs; returns (o, final_state)."""
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p = _params(kernels, d, attrs, o, final, initial_state)
    assert kernels.launch.prefill_supports(kernels.LIB, p) == ""
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None  # poisoned scratch
    _launch(kernels, p, ws, scan, tma)
    torch.cuda.synchronize()
    return o, final


def _check(o, final, ref, attrs, io_dtype, *, zero_state=False):
    h0 = torch.zeros_like(ref["initial_state"]) if zero_state else ref["initial_state"]
    args = [ref.get(n) for n in ORDER]
    args[6] = h0
    ro, rs = prefill_ref(*args, form="chunked", **attrs)
    assert not torch.isnan(o).any(), "o has unwritten (NaN-poisoned) elements"
    assert not torch.isnan(final).any(), "final_state has unwritten (NaN-poisoned) elements"
    tol = tolerance_for(io_dtype)
    eo, es = rel_err(o, ro), rel_err(final, rs)
    assert eo <= tol, f"o rel err {eo:.3e} > {tol}"
    assert es <= tol, f"final_state rel err {es:.3e} > {tol}"
    return eo, es


# the wgmma scan beside the prep by cp.async: test_prefill_beside_long_sequences, test_garbage_indices.py
FP64_SCANS = tuple(c for c in SCAN_CONFIGS if c != ("wgmma_beside", False))


# (seqlens, Hk, Hv, K, V, io, gate dtype, gate_mode, l2norm)
CASES = [
    (RAGGED, 2, 4, 128, 128, "bf16", "f32", 0, 1),
    (RAGGED, 2, 4, 128, 128, "f16", "bf16", 1, 1),
    (RAGGED, 2, 4, 128, 128, "f32", "f16", 1, 0),
    (RAGGED, 2, 2, 64, 64, "bf16", "bf16", 0, 0),
    (RAGGED, 1, 4, 256, 256, "bf16", "f32", 1, 1),
    (RAGGED, 1, 4, 256, 256, "f16", "f32", 0, 1),
    (RAGGED, 1, 4, 256, 256, "f32", "f32", 0, 1),
    (RAGGED, 2, 4, 64, 64, "f32", "bf16", 0, 1),
    ([130, 7, 300], 2, 4, 128, 64, "f16", "f16", 0, 1),
    ([130, 7, 300], 2, 4, 64, 256, "bf16", "f32", 1, 1),
    ([200, 5], 4, 8, 128, 128, "bf16", "f32", 0, 1),
    ([130, 7, 300], 1, 4, 128, 128, "bf16", "f32", 1, 1),  # 4 value heads per prep item (K = 128)
    ([130, 7, 300], 1, 3, 128, 128, "f16", "f32", 0, 1),   # an odd group of value heads
]


def _case_id(c):
    return f"L{len(c[0])}-Hk{c[1]}Hv{c[2]}-K{c[3]}V{c[4]}-{c[5]}-g{c[6]}-gm{c[7]}-l2{c[8]}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_prefill_vs_fp64(kernels, gen, case):
    seqlens, Hk, Hv, K, V, io, gd, gm, l2 = case
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=gm, use_qk_l2norm=l2)
    d, ref = to_device(inp, DT[io], DT[gd])
    attrs = op_attrs(gm, l2)
    for scan, tma in (scan_configs(kernels, K, FP64_SCANS) if io != "f32" else [("auto", True)]):
        o, final = _run(kernels, d, attrs, scan=scan, tma=tma)
        _check(o, final, ref, attrs, DT[io])


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["bf16", "f16", "f32"])
def test_prefill_scale_and_no_initial_state(kernels, gen, io):
    inp = make_prefill_inputs(gen, [70, 129], 2, 4, 128, 128, use_qk_l2norm=1)
    d, ref = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(0, 1, scale=0.3)
    o, final = _run(kernels, d, attrs, initial_state=None)
    _check(o, final, ref, attrs, DT[io], zero_state=True)


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["bf16", "f32"])
@pytest.mark.parametrize("regime", ["decay~1,beta~1", "decay~0,beta~0", "mixed"])
def test_prefill_extreme_gates(kernels, gen, io, regime):
    kw = {"decay~1,beta~1": dict(g_range=(-1e-4, 0.0), beta_range=(0.99, 1.0)),
          "decay~0,beta~0": dict(g_range=(-30.0, -5.0), beta_range=(0.0, 1e-3)),
          "mixed": dict(g_range=(-20.0, 0.0), beta_range=(0.0, 1.0))}[regime]
    inp = make_prefill_inputs(gen, [1, 64, 300], 2, 4, 128, 128, use_qk_l2norm=1, **kw)
    d, ref = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(0, 1)
    o, final = _run(kernels, d, attrs)
    _check(o, final, ref, attrs, DT[io])


@pytest.mark.gpu
def test_prefill_all_empty_sequences_copy_state(kernels, gen):
    inp = make_prefill_inputs(gen, [0, 0, 0], 2, 4, 128, 128, use_qk_l2norm=1)
    for io in ("bf16", "f32"):
        d, _ = to_device(inp, DT[io], torch.float32)
        o, final = _run(kernels, d, op_attrs(0, 1))
        assert o.numel() == 0
        assert torch.equal(final, d["initial_state"])


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["bf16", "f32"])
def test_prefill_64k_tokens(kernels, gen, io):
    inp = make_prefill_inputs(gen, [65536], 1, 2, 128, 128, gate_mode=1, use_qk_l2norm=1)
    d, ref = to_device(inp, DT[io], torch.bfloat16 if io == "bf16" else torch.float32)
    attrs = op_attrs(1, 1)
    o, final = _run(kernels, d, attrs)
    eo, es = _check(o, final, ref, attrs, DT[io])
    print(f"64K {io}: o rel err {eo:.2e}, final_state rel err {es:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp.async"])
def test_prefill_beside_long_sequences(kernels, gen, tma):
    """The scan beside the prep kernel (the prep's throttle, ready counters across blocks of 4 chunks) on
    sequences of 79, 33 and 11 chunks and an empty one, by bulk tensor copies and by cp.async."""
    if not kernels.launch.prefill_scan_runs(kernels.LIB, "wgmma_beside", 128):
        pytest.skip("the wgmma scan needs an sm_90a build on an sm_90 GPU")
    inp = make_prefill_inputs(gen, [5000, 2100, 0, 700], 2, 4, 128, 128, use_qk_l2norm=1)
    d, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    o, final = _run(kernels, d, attrs, scan="wgmma_beside", tma=tma)
    _check(o, final, ref, attrs, torch.bfloat16)


@pytest.mark.gpu
def test_scans_fit_the_gpus_shared_memory(kernels, gen):
    """Which scans run follows the GPU's opt-in shared memory per block. On Hopper (227 KB) every mma.sync and
    context-parallel scan runs at K = 64, 128 and 256 and the wgmma scans at K <= 128, so no forced-scan test skips
    there; where 16-bit I/O at a head dim needs more than the GPU allows (A100 at K = 256; 99 KB parts at every K),
    the library refuses those params with its reason (the PyTorch op then falls back) and float32 I/O still runs."""
    props = torch.cuda.get_device_properties(0)
    # (opt-in limit per block: the SM's shared memory less the 1 KB reserved per block on sm_80 .. sm_120)
    optin = getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_multiprocessor - 1024)
    runs = kernels.launch.prefill_scan_runs
    if optin >= 227 * 1024:
        for K in (64, 128, 256):
            for scan in ("auto", "mma2", "mma4", "cp", "cp_mma", "cp_wg"):
                assert runs(kernels.LIB, scan, K), (scan, K)
        if (props.major, props.minor) == (9, 0) and runs(kernels.LIB, "wgmma", 64):
            assert all(runs(kernels.LIB, s, K) for s in ("wgmma", "wgmma_beside") for K in (64, 128))
        return
    for K in (64, 128, 256):
        if runs(kernels.LIB, "auto", K):
            continue
        for io in ("bf16", "f32"):
            inp = make_prefill_inputs(gen, [70, 3], 1, 2, K, K)
            d, ref = to_device(inp, DT[io], torch.float32)
            attrs = op_attrs(0, 0)
            if io == "bf16":
                p = _params(kernels, d, attrs, torch.empty_like(d["v"]), torch.empty_like(d["initial_state"]),
                            "given")
                assert "shared memory" in kernels.launch.prefill_supports(kernels.LIB, p)
            else:
                o, final = _run(kernels, d, attrs)
                _check(o, final, ref, attrs, DT[io])


@pytest.mark.gpu
def test_prefill_scan_names_and_unrunnable_scan(kernels, gen):
    """The library names its scans; a scan that cannot run for the params is refused, not silently replaced."""
    from gdn_deploy.kernels.library import prefill_scan_code, prefill_scan_names
    assert prefill_scan_names(kernels.LIB) == ("auto", "wgmma", "wgmma_beside", "mma2", "mma4", "cp", "cp_mma",
                                                 "cp_wg")
    with pytest.raises(ValueError, match="unknown"):
        prefill_scan_code(kernels.LIB, "fastest")
    assert not kernels.launch.prefill_scan_runs(kernels.LIB, "wgmma", 256)  # (K = 256: mma.sync only)
    inp = make_prefill_inputs(gen, [70], 1, 2, 256, 64)
    d, _ = to_device(inp, torch.bfloat16, torch.float32)
    with pytest.raises(RuntimeError, match="cudaErrorNotSupported"):
        _run(kernels, d, op_attrs(0, 0), scan="wgmma")


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["bf16", "f32"])
def test_prefill_cuda_graph_replay_matches_eager(kernels, gen, io):
    inp = make_prefill_inputs(gen, RAGGED, 2, 4, 128, 128, gate_mode=1, use_qk_l2norm=1)
    d, _ = to_device(inp, DT[io], torch.float32)
    attrs = op_attrs(1, 1)
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p = _params(kernels, d, attrs, o, final)
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda") if nbytes else None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        _launch(kernels, p, ws)  # warm-up outside capture (module load, smem attributes)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            _launch(kernels, p, ws)
    torch.cuda.synchronize()
    for _ in range(2):  # fresh inputs written in place, then replay vs an eager launch
        fresh = make_prefill_inputs(gen, RAGGED, 2, 4, 128, 128, gate_mode=1, use_qk_l2norm=1)
        nd, _ = to_device(fresh, DT[io], torch.float32)
        for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"):
            d[n].copy_(nd[n])
        o.fill_(float("nan"))
        final.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eo, ef = _run(kernels, d, attrs)
        assert torch.equal(o, eo), "graph replay o differs from eager"
        assert torch.equal(final, ef), "graph replay final_state differs from eager"


@pytest.mark.gpu
def test_prefill_unsupported_head_dim_has_reason(kernels, gen):
    inp = make_prefill_inputs(gen, [10], 1, 1, 96, 64)
    d, _ = to_device(inp, torch.bfloat16, torch.float32)
    p = _params(kernels, d, op_attrs(0, 0), torch.empty_like(d["v"]), torch.empty_like(d["initial_state"]))
    assert "head dim K" in kernels.launch.prefill_supports(kernels.LIB, p)
