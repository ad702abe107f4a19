"""Context-parallel chunked prefill (scan "cp", gdnPrefillCp.cuh) against the float64 reference.

Every context-parallel scan ("cp": output pass on wgmma where it runs; "cp_mma": on mma.sync; "cp_wg": both passes
on wgmma). Long sequences cut
into segments at chunk boundaries (the last segment holds the partial chunk), scanned at once and
combined exactly through each segment's transition: 64K-token single sequences at every head dim with strong gates
(g down to -40 per token), weak gates and beta in [0, 2] from non-zero initial states; ragged batches with empty,
one-chunk and partial-chunk sequences at forced segment counts (segments empty, one chunk long, ending inside the
partial chunk); final_state aliasing initial_state; CUDA-graph replay. Every launch runs on NaN-poisoned outputs and a
0xFF-poisoned workspace.
"""
from __future__ import annotations

import pytest
import torch

from conftest import make_prefill_inputs, rel_err
from gdn_deploy.reference import prefill_ref
from gdn_deploy.validate import tolerance_for

from ._gpu_util import DT, op_attrs, to_device

ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")
GATES = {"strong": dict(g_range=(-40.0, 0.0), beta_range=(0.0, 2.0)),
         "weak": dict(g_range=(-1e-3, 0.0), beta_range=(0.0, 2.0)),
         "typical": dict(g_range=(-1.0, -0.01), beta_range=(0.0, 1.0))}


def _run(kernels, d, attrs, segments, *, scan="cp", alias_state=False):
    """Launch context-parallel scan `scan` with `segments` (0: its automatic count; None: the automatic launch) on
    poisoned outputs and workspace."""
    o = torch.full_like(d["v"], float("nan"))
    if alias_state:
        final = d["initial_state"].clone()
        h0 = final
    else:
        final = torch.full_like(d["initial_state"], float("nan"))
        h0 = d["initial_state"]
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], h0, o, final,
                                      d.get("A_log"), d.get("dt_bias"), **attrs)
    assert kernels.launch.prefill_supports(kernels.LIB, p) == ""
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p, segments)
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda") if nbytes else None
    kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), scan=scan, segments=segments)
    torch.cuda.synchronize()
    return o, final


def _scans(kernels, K):
    """The context-parallel scans that differ here: "cp" (output pass on wgmma where it runs), "cp_mma" and "cp_wg"
    (both passes on wgmma)."""
    wg = kernels.launch.prefill_scan_runs(kernels.LIB, "wgmma", K)
    return ("cp", "cp_mma", "cp_wg") if wg else ("cp",)


def _check(o, final, ref, attrs, io_dtype):
    ro, rs = prefill_ref(*[ref.get(n) for n in ORDER], form="chunked", **attrs)
    assert not torch.isnan(o).any(), "o has unwritten (NaN-poisoned) elements"
    assert not torch.isnan(final).any(), "final_state has unwritten (NaN-poisoned) elements"
    tol = tolerance_for(io_dtype)
    eo, es = rel_err(o, ro), rel_err(final, rs)
    assert eo <= tol, f"o rel err {eo:.3e} > {tol}"
    assert es <= tol, f"final_state rel err {es:.3e} > {tol}"
    return eo, es


@pytest.mark.gpu
@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("K,V,Hk,Hv", [(64, 64, 2, 4), (128, 128, 1, 2), (256, 256, 1, 2)])
def test_cp_64k_single_sequence(kernels, gen, gates, K, V, Hk, Hv):
    """One 65536 + 37-token sequence (the partial chunk in the last segment): the automatic launch, and each
    context-parallel scan at its automatic segment count and at 11."""
    inp = make_prefill_inputs(gen, [65536 + 37], Hk, Hv, K, V, use_qk_l2norm=1, **GATES[gates])
    d, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    for scan, segments in [("auto", None)] + [(s, g) for s in _scans(kernels, K) for g in (0, 11)]:
        o, final = _run(kernels, d, attrs, segments, scan=scan)
        eo, es = _check(o, final, ref, attrs, torch.bfloat16)
        print(f"64K K={K} {gates} {scan} G={segments}: o {eo:.2e}, final_state {es:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("gates", ["strong", "weak"])
@pytest.mark.parametrize("seqlens,Hk,Hv,K,V", [([4096 + 37], 2, 8, 128, 128), ([8192 - 5], 4, 8, 64, 64),
                                                ([4096, 4000], 2, 8, 128, 128), ([8192 + 1], 2, 4, 256, 256),
                                                ([4096 + 37], 2, 4, 256, 256)])
def test_cp_auto_short_sequences(kernels, gen, gates, seqlens, Hk, Hv, K, V):
    """The automatic launch at few-head shapes of 4K-8K tokens: one sequence runs context parallel in segments of at
    least 16 chunks (kCpMinChunks; 4 segments at 4K, 7 at 8K - 5, 8 at K = 256 8K + 1, where pass 1 runs on mma.sync);
    the two sequences of 4096 and 4000 tokens average 63 chunks, short of 4 segments, and take the one-pass scan
    (the rule's edge). The workspace the automatic launch asks for holds its segments, and the outputs match the
    float64 reference from non-zero initial states."""
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, use_qk_l2norm=1, **GATES[gates])
    d, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    o, final = _run(kernels, d, attrs, None, scan="auto")
    _check(o, final, ref, attrs, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [2, 3, 7, 16])
@pytest.mark.parametrize("case", [
    ([0, 1, 63, 64, 65, 1000, 4097, 3000], 2, 4, 128, 128, "bf16", "f32", 0),
    ([0, 1, 63, 64, 65, 1000, 4097, 3000], 2, 4, 128, 64, "f16", "bf16", 1),
    ([2100, 0, 700, 129], 1, 2, 64, 256, "bf16", "f32", 1),
    ([2100, 5, 700], 1, 3, 256, 128, "f16", "f32", 0),
], ids=lambda c: f"N{len(c[0])}-Hk{c[1]}Hv{c[2]}-K{c[3]}V{c[4]}-{c[5]}-gm{c[7]}")
def test_cp_ragged_forced_segments(kernels, gen, segments, case):
    seqlens, Hk, Hv, K, V, io, gd, gm = case
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=gm, use_qk_l2norm=1)
    d, ref = to_device(inp, DT[io], DT[gd])
    attrs = op_attrs(gm, 1)
    for scan in _scans(kernels, K):
        o, final = _run(kernels, d, attrs, segments, scan=scan)
        _check(o, final, ref, attrs, DT[io])


@pytest.mark.gpu
@pytest.mark.parametrize("gates", ["strong", "weak"])
def test_cp_final_state_aliases_initial_state(kernels, gen, gates):
    inp = make_prefill_inputs(gen, [3000, 77, 1500], 2, 4, 128, 128, use_qk_l2norm=1, **GATES[gates])
    d, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 1)
    for scan in _scans(kernels, 128):
        o, final = _run(kernels, d, attrs, 5, scan=scan, alias_state=True)
        _check(o, final, ref, attrs, torch.bfloat16)


@pytest.mark.gpu
def test_cp_without_initial_state_and_no_l2norm(kernels, gen):
    inp = make_prefill_inputs(gen, [2500, 640], 2, 4, 128, 128, use_qk_l2norm=0, initial_state=False)
    d, ref = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(0, 0, scale=0.3)
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"], None, o, final,
                                      None, None, **attrs)
    nbytes = kernels.launch.prefill_workspace_bytes(kernels.LIB, p, 4)
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
    kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), segments=4)
    torch.cuda.synchronize()
    _check(o, final, ref, attrs, torch.bfloat16)


@pytest.mark.gpu
def test_cp_workspace_too_small_is_refused(kernels, gen):
    """A launch whose workspace lacks the segments' room fails with cudaErrorInvalidValue and writes nothing."""
    inp = make_prefill_inputs(gen, [2000], 1, 2, 128, 128, use_qk_l2norm=1)
    d, _ = to_device(inp, torch.bfloat16, torch.float32)
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                                      d["initial_state"], o, final, None, None, **op_attrs(0, 1))
    small = kernels.launch.prefill_workspace_bytes(kernels.LIB, p, 2)
    assert kernels.launch.prefill_workspace_bytes(kernels.LIB, p, 8) > small
    ws = torch.zeros(small, dtype=torch.uint8, device="cuda")
    with pytest.raises(RuntimeError, match="cudaErrorInvalidValue"):
        kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), segments=8)
    torch.cuda.synchronize()
    assert torch.isnan(o).all() and torch.isnan(final).all()


@pytest.mark.gpu
def test_cp_cuda_graph_replay_matches_eager(kernels, gen):
    seqlens, Hk, Hv, K, V = [4000, 63, 2000], 2, 4, 128, 128
    inp = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=1, use_qk_l2norm=1)
    d, _ = to_device(inp, torch.bfloat16, torch.float32)
    attrs = op_attrs(1, 1)
    o = torch.full_like(d["v"], float("nan"))
    final = torch.full_like(d["initial_state"], float("nan"))
    p = kernels.launch.prefill_params(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu_seqlens"],
                                      d["initial_state"], o, final, d["A_log"], d["dt_bias"], **attrs)
    ws = torch.empty(kernels.launch.prefill_workspace_bytes(kernels.LIB, p, 6), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), segments=6)  # warm-up
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            kernels.launch.launch_prefill(kernels.LIB, p, ws, torch.device("cuda"), segments=6)
    torch.cuda.synchronize()
    for _ in range(2):
        fresh = make_prefill_inputs(gen, seqlens, Hk, Hv, K, V, gate_mode=1, use_qk_l2norm=1)
        nd, _ = to_device(fresh, torch.bfloat16, torch.float32)
        for n in ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"):
            d[n].copy_(nd[n])
        o.fill_(float("nan"))
        final.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eo, ef = _run(kernels, d, attrs, 6)
        assert torch.equal(o, eo), "graph replay o differs from eager"
        assert torch.equal(final, ef), "graph replay final_state differs from eager"
