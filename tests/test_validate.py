"""Contract validation (gdn_deploy.validate): every rule id of the spec is triggered by at least one case
below, with a ContractError (a ValueError) whose message names the offending argument.
A new rule in gdn_ops.json without a case here makes test_every_spec_rule_is_covered fail."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from conftest import call_prefill_ref, make_decode_inputs, make_prefill_inputs
from gdn_deploy.reference import decode_ref, prefill_ref
from gdn_deploy.spec import COMMIT, DECODE, PREFILL, SPEC, VERIFY, ContractError
from gdn_deploy.validate import (Dims, tolerance_for, validate_commit, validate_decode, validate_prefill,
                                 validate_verify)

HK, HV, K, V = 2, 4, 8, 4
LENS = [3, 0, 5]
T = sum(LENS)


def prefill_args(gate_mode=0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    d = make_prefill_inputs(g, LENS, Hk=HK, Hv=HV, K=K, V=V, dtype=torch.float32, gate_mode=gate_mode)
    return {n: d.get(n) for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state", "A_log", "dt_bias")}


def decode_args(gate_mode=0, pool=False, B=3, P=5) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    d = make_decode_inputs(g, B, Hk=HK, Hv=HV, K=K, V=V, dtype=torch.float32, gate_mode=gate_mode,
                           pool_size=P if pool else None)
    return {n: d.get(n) for n in ("q", "k", "v", "g", "beta", "state", "slots", "A_log", "dt_bias")}


def setv(name, value):
    return lambda a: a.__setitem__(name, value(a) if callable(value) else value)


def poke(name, index, value):
    def f(a):
        t = a[name].clone()
        t.view(-1)[index] = value
        a[name] = t
    return f


# (case id, op, attribute overrides, mutation of the valid args, expected rule, text the message must name)
CASES: list[tuple[str, str, dict, Callable, str, str]] = [
    # rank
    ("q_2d", "prefill", {}, setv("q", lambda a: a["q"][:, 0]), "rank", "q:"),
    ("q_not_tensor", "prefill", {}, setv("q", lambda a: a["q"].tolist()), "rank", "q:"),
    ("v_4d", "decode", {}, setv("v", lambda a: a["v"][None]), "rank", "v:"),
    ("g_3d", "prefill", {}, setv("g", lambda a: a["g"][..., None]), "rank", "g:"),
    ("cu_2d", "prefill", {}, setv("cu_seqlens", lambda a: a["cu_seqlens"][None]), "rank", "cu_seqlens:"),
    ("h0_3d", "prefill", {}, setv("initial_state", lambda a: a["initial_state"][0]), "rank", "initial_state:"),
    ("state_3d", "decode", {}, setv("state", lambda a: a["state"][0]), "rank", "state:"),
    ("A_log_2d", "prefill", {"gate_mode": 1}, setv("A_log", lambda a: a["A_log"][None]), "rank", "A_log:"),
    ("slots_2d", "decode_pool", {}, setv("slots", lambda a: a["slots"][None]), "rank", "slots:"),
    # dims
    ("k_head_dim", "prefill", {}, setv("k", lambda a: a["k"][..., :K - 1]), "dim", "k:"),
    ("k_heads", "decode", {}, setv("k", lambda a: a["k"][:, :1]), "dim", "k:"),
    ("v_tokens", "prefill", {}, setv("v", lambda a: a["v"][:-1]), "dim", "v:"),
    ("g_heads", "prefill", {}, setv("g", lambda a: a["g"][:, :HV - 1]), "dim", "g:"),
    ("beta_rows", "decode", {}, setv("beta", lambda a: a["beta"][:-1]), "dim", "beta:"),
    ("h0_N", "prefill", {}, setv("initial_state", lambda a: a["initial_state"][:-1]), "dim", "initial_state:"),
    ("h0_K", "prefill", {}, setv("initial_state", lambda a: a["initial_state"][:, :, :-1]), "dim", "initial_state:"),
    ("h0_V", "prefill", {}, setv("initial_state", lambda a: a["initial_state"][..., :-1]), "dim", "initial_state:"),
    ("state_B_dense", "decode", {}, setv("state", lambda a: a["state"][:-1]), "dim", "state:"),
    ("state_Hv", "decode_pool", {}, setv("state", lambda a: a["state"][:, :-1]), "dim", "state:"),
    ("A_log_len", "decode", {"gate_mode": 1}, setv("A_log", lambda a: a["A_log"][:-1]), "dim", "A_log:"),
    ("dt_bias_len", "prefill", {"gate_mode": 1}, setv("dt_bias", lambda a: a["dt_bias"][:-1]), "dim", "dt_bias:"),
    ("slots_len", "decode_pool", {}, setv("slots", lambda a: a["slots"][:-1]), "dim", "slots:"),
    ("empty_head_K0", "prefill", {}, lambda a: [a.__setitem__(n, a[n][..., :0]) for n in ("q", "k")]
     + [a.__setitem__("initial_state", a["initial_state"][:, :, :0])], "dim", "q:"),
    # dtypes
    ("q_int", "prefill", {}, setv("q", lambda a: a["q"].to(torch.int32)), "dtype_io", "q:"),
    ("q_float64", "decode", {}, setv("q", lambda a: a["q"].double()), "dtype_io", "q:"),
    ("k_half_vs_q_float", "prefill", {}, setv("k", lambda a: a["k"].half()), "dtype_io", "k:"),
    ("v_bf16_vs_q_float", "decode", {}, setv("v", lambda a: a["v"].bfloat16()), "dtype_io", "v:"),
    ("g_int", "prefill", {}, setv("g", lambda a: a["g"].to(torch.int64)), "dtype_fixed", "g:"),
    ("beta_float64", "decode", {}, setv("beta", lambda a: a["beta"].double()), "dtype_fixed", "beta:"),
    # g float32 with beta bf16 is what HF Qwen3.5 / Qwen3-Next compute; the kernels read both with one type
    ("beta_bf16_vs_g_float", "prefill", {}, setv("beta", lambda a: a["beta"].bfloat16()), "dtype_gate", "beta:"),
    ("beta_half_vs_g_float_raw", "decode_pool", {"gate_mode": 1}, setv("beta", lambda a: a["beta"].half()),
     "dtype_gate", "beta:"),
    ("cu_int64", "prefill", {}, setv("cu_seqlens", lambda a: a["cu_seqlens"].long()), "dtype_fixed", "cu_seqlens:"),
    ("h0_half", "prefill", {}, setv("initial_state", lambda a: a["initial_state"].half()), "dtype_fixed",
     "initial_state:"),
    ("h0_float64", "prefill", {}, setv("initial_state", lambda a: a["initial_state"].double()), "dtype_fixed",
     "initial_state:"),
    ("state_bf16", "decode", {}, setv("state", lambda a: a["state"].bfloat16()), "dtype_fixed", "state:"),
    ("A_log_half", "prefill", {"gate_mode": 1}, setv("A_log", lambda a: a["A_log"].half()), "dtype_fixed", "A_log:"),
    ("slots_int64", "decode_pool", {}, setv("slots", lambda a: a["slots"].long()), "dtype_fixed", "slots:"),
    # heads
    ("gva_3_over_2", "prefill", {}, lambda a: [a.__setitem__(n, a[n][:, :3]) for n in ("v", "g", "beta")]
     + [a.__setitem__("initial_state", a["initial_state"][:, :3])], "gva", "Hv=3"),
    ("gva_Hk_0", "decode", {}, lambda a: [a.__setitem__(n, a[n][:, :0]) for n in ("q", "k")], "gva", "Hk=0"),
    # cu_seqlens values
    ("cu_not_from_0", "prefill", {}, poke("cu_seqlens", 0, 1), "cu_seqlens", "cu_seqlens:"),
    ("cu_decreasing", "prefill", {}, poke("cu_seqlens", 1, 6), "cu_seqlens", "cu_seqlens:"),
    ("cu_short_of_T", "prefill", {}, poke("cu_seqlens", -1, T - 1), "cu_seqlens", "cu_seqlens:"),
    ("cu_past_T", "prefill", {}, poke("cu_seqlens", -1, T + 2), "cu_seqlens", "cu_seqlens:"),
    ("cu_empty", "prefill", {}, setv("cu_seqlens", torch.zeros(0, dtype=torch.int32)), "cu_seqlens", "cu_seqlens:"),
    # slots values
    ("slot_eq_P", "decode_pool", {}, poke("slots", 0, 5), "slots", "slots:"),
    ("slot_below_minus1", "decode_pool", {}, poke("slots", 1, -2), "slots", "slots:"),
    ("slot_duplicate", "decode_pool", {}, lambda a: a.__setitem__("slots", torch.tensor([2, 4, 2], dtype=torch.int32)),
     "slots", "slots:"),
    # non-finite values
    ("nan_g", "prefill", {}, poke("g", 3, float("nan")), "nonfinite", "g:"),
    ("nan_beta", "decode", {}, poke("beta", 0, float("nan")), "nonfinite", "beta:"),
    ("nan_q", "prefill", {}, poke("q", 7, float("nan")), "nonfinite", "q:"),
    ("inf_k", "decode_pool", {}, poke("k", 2, float("inf")), "nonfinite", "k:"),
    ("inf_v", "prefill", {}, poke("v", 0, float("-inf")), "nonfinite", "v:"),
    ("nan_h0", "prefill", {}, poke("initial_state", 5, float("nan")), "nonfinite", "initial_state:"),
    ("nan_state_dense", "decode", {}, poke("state", 5, float("nan")), "nonfinite", "state:"),
    ("nan_raw_a", "prefill", {"gate_mode": 1}, poke("g", 0, float("nan")), "nonfinite", "g:"),
    ("inf_A_log", "decode", {"gate_mode": 1}, poke("A_log", 0, float("inf")), "nonfinite", "A_log:"),
    ("nan_dt_bias", "prefill", {"gate_mode": 1}, poke("dt_bias", 1, float("nan")), "nonfinite", "dt_bias:"),
    # gate range (precomputed mode only)
    ("g_positive", "prefill", {}, poke("g", 4, 0.01), "gate_range", "g:"),
    ("g_positive_decode", "decode", {}, poke("g", 0, 1.0), "gate_range", "g:"),
    # attributes
    ("gate_mode_2", "prefill", {"gate_mode": 2}, lambda a: None, "attribute", "gate_mode:"),
    ("gate_mode_half", "decode", {"gate_mode": 0.5}, lambda a: None, "attribute", "gate_mode:"),
    ("scale_inf", "prefill", {"scale": float("inf")}, lambda a: None, "attribute", "scale:"),
    ("eps_inf", "decode", {"l2norm_eps": float("inf")}, lambda a: None, "attribute", "l2norm_eps:"),
    ("l2norm_flag_neg", "decode", {"use_qk_l2norm": -1}, lambda a: None, "attribute", "use_qk_l2norm:"),
    ("state_mode_3", "decode", {"state_mode": 3}, lambda a: None, "attribute", "state_mode:"),
    ("scale_negative", "prefill", {"scale": -0.5}, lambda a: None, "attribute", "scale:"),
    ("scale_nan", "decode", {"scale": float("nan")}, lambda a: None, "attribute", "scale:"),
    ("eps_zero", "prefill", {"l2norm_eps": 0.0}, lambda a: None, "attribute", "l2norm_eps:"),
    ("eps_negative", "decode", {"l2norm_eps": -1e-6}, lambda a: None, "attribute", "l2norm_eps:"),
    # presence of conditional inputs
    ("raw_without_A_log", "prefill", {"gate_mode": 1}, setv("A_log", None), "missing", "A_log:"),
    ("raw_without_dt_bias", "decode", {"gate_mode": 1}, setv("dt_bias", None), "missing", "dt_bias:"),
    ("pool_without_slots", "decode_pool", {}, setv("slots", None), "missing", "slots:"),
    ("no_initial_state", "prefill", {}, setv("initial_state", None), "missing", "initial_state:"),
    ("A_log_in_precomputed", "prefill", {},
     setv("A_log", torch.zeros(HV)), "unexpected", "A_log:"),
    ("dt_bias_in_precomputed", "decode", {}, setv("dt_bias", torch.zeros(HV)), "unexpected", "dt_bias:"),
    ("slots_in_dense", "decode", {}, setv("slots", torch.arange(3, dtype=torch.int32)), "unexpected", "slots:"),
    # speculative verify / commit
    ("draft_too_long", "verify", {}, lambda a: a.update(verify_long_draft()), "draft_len", "cu_seqlens:"),
    ("accepted_negative", "commit", {}, poke("accepted", 0, -1), "accepted", "accepted:"),
    ("accepted_too_many", "commit", {}, poke("accepted", 2, LENS[2] + 1), "accepted", "accepted:"),
    ("accepted_int64", "commit", {}, setv("accepted", lambda a: a["accepted"].long()), "dtype_fixed", "accepted:"),
    ("commit_slots_range", "commit", {"state_mode": 1}, poke("slots", 0, 99), "slots", "slots:"),
]


def verify_long_draft() -> dict[str, Any]:
    """Verify args with one sequence of max_draft_tokens + 1 tokens."""
    g = torch.Generator().manual_seed(2)
    d = make_prefill_inputs(g, [1, SPEC.max_draft_tokens + 1], Hk=HK, Hv=HV, K=K, V=V, dtype=torch.float32)
    d["state"] = d.pop("initial_state")
    return d


def verify_args(pool=False) -> dict[str, Any]:
    a = prefill_args()
    a["state"] = a.pop("initial_state")
    if pool:
        a["state"] = torch.zeros(5, HV, K, V)
        a["slots"] = torch.tensor([4, -1, 0], dtype=torch.int32)
    return a


def commit_args(pool=False) -> dict[str, Any]:
    a = verify_args(pool)
    return dict(state=a["state"], commit_k=torch.zeros(T, HK, K), commit_delta=torch.zeros(T, HV, V),
                commit_g=torch.zeros(T, HV), cu_seqlens=a["cu_seqlens"],
                accepted=torch.tensor(LENS, dtype=torch.int32), slots=a.get("slots"))


def run_case(op: str, attr_over: dict, mutate: Callable, **kw):
    gate_mode = int(attr_over.get("gate_mode", 0)) if attr_over.get("gate_mode") in (0, 1) else 0
    if op == "prefill":
        args, attrs, fn = prefill_args(gate_mode), PREFILL.attrs(), validate_prefill
    elif op == "verify":
        pool = bool(attr_over.get("state_mode", 0))
        args, attrs, fn = verify_args(pool), VERIFY.attrs(state_mode=int(pool)), validate_verify
    elif op == "commit":
        pool = bool(attr_over.get("state_mode", 0))
        args, attrs, fn = commit_args(pool), COMMIT.attrs(state_mode=int(pool)), validate_commit
    else:
        pool = op == "decode_pool"
        args = decode_args(gate_mode, pool=pool)
        attrs, fn = DECODE.attrs(state_mode=int(pool)), validate_decode
    attrs.update(attr_over)
    mutate(args)
    return fn(args, attrs, **kw)


@pytest.mark.parametrize("op,pool", [("verify", False), ("verify", True), ("commit", False), ("commit", True)])
def test_valid_speculative_inputs_pass(op, pool):
    dims = run_case(op, {"state_mode": int(pool)}, lambda a: None)
    assert dims == Dims(T, len(LENS), HK, HV, K, V)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_triggers(case):
    _, op, attr_over, mutate, rule, named = case
    with pytest.raises(ValueError) as ei:
        run_case(op, attr_over, mutate)
    err = ei.value
    assert isinstance(err, ContractError) and err.rule == rule, f"got [{getattr(err, 'rule', None)}] {err}"
    msg = str(err)
    assert msg.startswith(f"[gdn:{rule}] ")
    assert named in msg, msg


def test_every_spec_rule_is_covered():
    covered = {c[4] for c in CASES}
    assert set(SPEC.errors) - covered == set(), "validation rules without a test case"
    assert covered - set(SPEC.errors) == set(), "test cases for rules the spec does not have"


def test_unknown_attribute_name():
    with pytest.raises(ContractError) as ei:
        PREFILL.attrs(state_mode=1)       # a decode-only attribute
    assert ei.value.rule == "attribute" and "state_mode" in str(ei.value)


@pytest.mark.parametrize("op,gate_mode", [("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1),
                                          ("decode_pool", 0), ("decode_pool", 1)])
def test_valid_inputs_pass_and_report_dims(op, gate_mode):
    dims = run_case(op, {"gate_mode": gate_mode}, lambda a: None)
    assert isinstance(dims, Dims)
    if op == "prefill":
        assert dims == Dims(T=T, N=len(LENS), Hk=HK, Hv=HV, K=K, V=V)
    else:
        assert dims == Dims(T=3, N=5 if op == "decode_pool" else 3, Hk=HK, Hv=HV, K=K, V=V)


def test_raw_gates_may_be_positive():
    """In gate_mode 1 the g/beta inputs carry raw a/b: any finite sign is fine."""
    run_case("prefill", {"gate_mode": 1}, lambda a: a.__setitem__("g", a["g"].abs() + 1))


def test_slot_minus_one_and_empty_cases_are_valid():
    run_case("decode_pool", {}, lambda a: a.__setitem__("slots", torch.tensor([-1, 4, -1], dtype=torch.int32)))
    run_case("prefill", {}, lambda a: a.__setitem__("cu_seqlens", torch.tensor([0, 0, 0, T], dtype=torch.int32)))


@pytest.mark.parametrize("case_id", ["cu_not_from_0", "cu_decreasing", "cu_short_of_T", "slot_eq_P", "slot_duplicate",
                                     "nan_g", "g_positive", "nan_state_dense"])
def test_value_checks_skipped_when_disabled(case_id):
    _, op, attr_over, mutate, _, _ = next(c for c in CASES if c[0] == case_id)
    run_case(op, attr_over, mutate, check_values=False)


def test_float64_only_with_allow_float64():
    a = {n: (t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
         for n, t in prefill_args().items()}
    with pytest.raises(ContractError):
        validate_prefill(a, PREFILL.attrs())
    validate_prefill(a, PREFILL.attrs(), allow_float64=True)


def test_mixed_gate_dtype_is_allowed():
    """g/beta have their own type constraint G: half gates with float32 q/k/v are valid."""
    run_case("prefill", {}, lambda a: [a.__setitem__(n, a[n].half()) for n in ("g", "beta")])


def test_reference_entry_points_validate():
    """prefill_ref / decode_ref run the same checks (with float64 allowed)."""
    inp = make_prefill_inputs(torch.Generator().manual_seed(3), [4])
    inp["A_log"] = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ContractError, match="A_log"):
        call_prefill_ref(inp)
    a = decode_args(pool=True)
    with pytest.raises(ContractError, match="slots"):
        decode_ref(*(a[n] for n in ("q", "k", "v", "g", "beta", "state")), None, state_mode=1)
    with pytest.raises(ValueError, match="form"):
        p = prefill_args()
        prefill_ref(*(p[n] for n in ("q", "k", "v", "g", "beta", "cu_seqlens", "initial_state")), form="fast")


def test_tolerance_for_reads_spec():
    assert tolerance_for(torch.float32) == SPEC.tolerances["kernel_vs_fp64"]["float32"]
    assert tolerance_for(torch.bfloat16) == SPEC.tolerances["kernel_vs_fp64"]["bfloat16"]
