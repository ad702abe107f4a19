"""torch.ops.gdn.verify / commit / commit_ (CPU): equal to the reference, in place on the pool (untouched rows
bit-exact), opcheck of the fake implementations, and the CUDA dispatch's clear error."""
from __future__ import annotations

import pytest
import torch

import gdn_deploy.ops  # noqa: F401
from conftest import make_prefill_inputs
from gdn_deploy.reference import commit_ref, verify_ref
from gdn_deploy.spec import ContractError

ORDER = ("q", "k", "v", "g", "beta", "cu_seqlens", "state", "slots", "A_log", "dt_bias")


def pool_inputs(gen, lens, gate_mode=1):
    d = make_prefill_inputs(gen, lens, Hk=2, Hv=4, K=8, V=8, dtype=torch.float32, gate_mode=gate_mode,
                            use_qk_l2norm=1)
    d.pop("initial_state")
    P = len(lens) + 2
    d["state"] = torch.randn(P, 4, 8, 8, generator=gen)
    d["slots"] = torch.randperm(P, generator=gen)[:len(lens)].to(torch.int32)
    return d


def test_verify_commit_ops_equal_reference_and_update_in_place(gen):
    lens = [4, 1, 0, 7]
    d = pool_inputs(gen, lens)
    d["slots"][2] = -1
    attrs = dict(gate_mode=1, use_qk_l2norm=1, state_mode=1)
    got = torch.ops.gdn.verify(*(d.get(n) for n in ORDER), **attrs)
    want = verify_ref(*(d.get(n) for n in ORDER), **attrs)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    acc = torch.tensor([2, 1, 0, 7], dtype=torch.int32)
    pool = d["state"].clone()
    expect = commit_ref(pool, *got[1:], d["cu_seqlens"], acc, d["slots"], state_mode=1)
    functional = torch.ops.gdn.commit(pool, *got[1:], d["cu_seqlens"], acc, d["slots"], state_mode=1)
    assert torch.equal(functional, expect) and torch.equal(pool, d["state"])
    torch.ops.gdn.commit_(pool, *got[1:], d["cu_seqlens"], acc, d["slots"], state_mode=1)
    assert torch.equal(pool, expect)
    untouched = sorted(set(range(pool.shape[0])) - {int(d["slots"][0]), int(d["slots"][1]), int(d["slots"][3])})
    assert torch.equal(pool[untouched], d["state"][untouched])


def test_commit_op_refuses_bad_counts_on_cpu(gen):
    d = pool_inputs(gen, [3])
    o, ck, cd, cg = torch.ops.gdn.verify(*(d.get(n) for n in ORDER), gate_mode=1, use_qk_l2norm=1, state_mode=1)
    with pytest.raises(ContractError, match="accepted"):
        torch.ops.gdn.commit_(d["state"], ck, cd, cg, d["cu_seqlens"], torch.tensor([4], dtype=torch.int32),
                              d["slots"], state_mode=1)


def test_opcheck(gen):
    d = pool_inputs(gen, [2, 3])
    args = tuple(d.get(n) for n in ORDER)
    kw = dict(gate_mode=1, use_qk_l2norm=1, state_mode=1)
    torch.library.opcheck(torch.ops.gdn.verify.default, args, kw,
                          test_utils=("test_schema", "test_faketensor"))
    _, ck, cd, cg = torch.ops.gdn.verify(*args, **kw)
    cargs = (d["state"].clone(), ck, cd, cg, d["cu_seqlens"], torch.tensor([1, 3], dtype=torch.int32), d["slots"])
    for op in (torch.ops.gdn.commit.default, torch.ops.gdn.commit_.default):
        torch.library.opcheck(op, cargs, {"state_mode": 1}, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_without_kernels_raise_a_clear_error(gen):
    from gdn_deploy import kernels
    if kernels.status().available:
        pytest.skip("the CUDA kernels are available (tests/kernels/test_verify_kernel.py runs them)")
    d = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in pool_inputs(gen, [2]).items()}
    with pytest.raises(NotImplementedError, match="CUDA kernel library is not available"):
        torch.ops.gdn.verify(*(d.get(n) for n in ORDER), gate_mode=1, use_qk_l2norm=1, state_mode=1)
