"""Self-speculative generation (torch backend): tokens identical to plain greedy decoding on every family, with
MTP heads of random weights (low acceptance), prompt-lookup drafts and drafts forced right (K accepted every step);
EOS inside an accepted run; the verify step against decode steps; attention over a cache against prefill; the MTP
loader (Qwen3.5 dense / MoE, Qwen3-Next layouts written into tiny folders) and its missing-weights error."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import rel_err

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from gdn_deploy.lm.generate import greedy_generate, pack_prompts  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.lm.model import decode_states_from_prefill  # noqa: E402
from gdn_deploy.lm.mtp import MTPHead, MTPWeightsMissing, load_mtp_head  # noqa: E402
from gdn_deploy.lm.speculative_steps import attend_cached, commit, verify_step  # noqa: E402
from gdn_deploy.runtime.speculative import (MTPDrafter, NgramDrafter, OracleDrafter,  # noqa: E402
                                            TorchMTPRunner, speculative_generate)

MTP_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: intra-op threads only add contention on a busy machine (20x slower measured)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_mtp(folder, model, gen, mlp_type: str) -> None:
    """Random mtp.* tensors in the checkpoint layout (per-expert MoE weights) as an extra safetensors file."""
    head = MTPHead(model.hybrid_config, 1, mlp_type)
    sd = {}
    for k, t in head.state_dict().items():
        t = torch.randn(t.shape, generator=gen) / (t.shape[-1] ** 0.5 if t.dim() > 1 else 1.0)
        if t.dim() == 1:
            t = 0.2 * t
        if k.endswith("experts.gate_up_proj"):
            inner = t.shape[1] // 2
            for e in range(t.shape[0]):
                sd[f"mtp.{k[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = t[e, :inner].contiguous()
                sd[f"mtp.{k[:-len('gate_up_proj')]}{e}.up_proj.weight"] = t[e, inner:].contiguous()
        elif k.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                sd[f"mtp.{k[:-len('down_proj')]}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            sd[f"mtp.{k}"] = t.contiguous()
    save_file(sd, str(folder / "mtp.safetensors"))


def load(family, gen, tmp_path, mtp: bool):
    hf = tiny.build(family, gen)
    tiny.save(hf, tmp_path)
    model = load_hf_causal_lm(tmp_path)
    if mtp:
        write_mtp(tmp_path, model, gen, "moe" if family in ("qwen3_next", "qwen3_5_moe") else "dense")
    return model.double()


def prompts_for(gen, vocab, lens=(1, 6, 11)):
    return [torch.randint(0, vocab, (L,), generator=gen).tolist() for L in lens]


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"])
def test_speculative_equals_greedy(family, gen, tmp_path):
    has_mtp = family in MTP_FAMILIES
    model = load(family, gen, tmp_path, has_mtp)
    prompts = prompts_for(gen, model.hybrid_config.vocab_size)
    n = 10
    want = greedy_generate(model, prompts, n)
    future = greedy_generate(model, prompts, n + 4)          # drafts forced right past the last needed token
    runs = [("ngram", 2, NgramDrafter()), ("oracle", 1, OracleDrafter(future, prompts)),
            ("oracle", 3, OracleDrafter(future, prompts))]
    if has_mtp:
        head = load_mtp_head(tmp_path, model)
        assert next(head.parameters()).dtype == torch.float64
        runs.append(("mtp", 3, MTPDrafter(TorchMTPRunner(model, head), max(map(len, prompts)) + n + 4)))
    for name, K, drafter in runs:
        res = speculative_generate(model, prompts, n, drafter, draft_tokens=K)
        assert res.tokens == want, (name, K)
        if name == "oracle":   # forced right: every draft accepted, K + 1 tokens per call
            assert res.acceptance_rate == 1.0 and res.tokens_per_call == K + 1
            assert res.target_calls == -(-(n - 1) // (K + 1))
        assert 0.0 <= res.acceptance_rate <= 1.0 and res.row_steps >= res.target_calls


def test_eos_inside_an_accepted_run(gen, tmp_path):
    model = load("qwen3_5", gen, tmp_path, False)
    prompts = prompts_for(gen, model.hybrid_config.vocab_size, (4, 7))
    free = greedy_generate(model, prompts, 12)
    eos = [free[1][5]]                       # stops prompt 1 at its 6th token (or earlier if the id came before)
    want = greedy_generate(model, prompts, 12, eos_token_ids=eos)
    res = speculative_generate(model, prompts, 12, OracleDrafter(free, prompts), draft_tokens=4, eos_token_ids=eos)
    assert res.tokens == want and res.finished[1]
    assert want[1][-1] == eos[0] and len(want[1]) <= 6


def test_verify_step_and_commit_equal_decode_steps(gen, tmp_path):
    model = load("qwen3_next", gen, tmp_path, False)
    c = model.hybrid_config
    prompts = prompts_for(gen, c.vocab_size, (3, 5))
    ids, cu = pack_prompts(prompts)
    L, cap = 4, 16
    nxt = torch.randint(0, c.vocab_size, (2, L), generator=gen)
    with torch.no_grad():
        _, st = model.forward_prefill(ids, cu)
        st = decode_states_from_prefill(c, st, cu, cap)
        pos0 = torch.tensor([3, 5])
        hidden, st_v, pend = verify_step(model, nxt, pos0, copy.deepcopy(st))
        logits_v = model._logits(hidden)
        for j in range(L + 1):                 # land after j tokens, then compare with j decode steps
            acc = torch.tensor([j, max(j - 1, 0)])
            landed = commit(copy.deepcopy(st_v), pend, L, acc)
            for b in range(2):
                s_dec, pos = [tuple(x[b:b + 1] for x in s) for s in st], pos0[b:b + 1]
                for t in range(int(acc[b])):
                    lg, s_dec = model.forward_decode(nxt[b, t:t + 1], pos, s_dec)
                    assert rel_err(lg[0], logits_v[b, t]) < 1e-12
                    pos = pos + 1
                for kind, s_l, s_d in zip(c.layer_types, landed, s_dec):
                    if kind == "linear_attention":
                        assert rel_err(s_l[0][b], s_d[0][0]) < 1e-12 and rel_err(s_l[1][b], s_d[1][0]) < 1e-12


def test_attend_cached_equals_prefill_attention(gen, tmp_path):
    model = load("qwen3_5", gen, tmp_path, False)
    layer = next(l for l in model.layers if l.layer_type == "full_attention")
    attn, c = layer.self_attn, model.hybrid_config.attention
    L = 6
    x = torch.randn(L, model.hybrid_config.hidden_size, generator=gen, dtype=torch.float64)
    pos = torch.arange(L)
    from gdn_deploy.lm.attention import packed_causal_mask
    y_ref, _, _ = attn.prefill(x, pos, packed_causal_mask(torch.tensor([0, L], dtype=torch.int32), L))
    cache = torch.zeros(1, c.num_kv_heads, 9, c.head_dim, dtype=torch.float64)
    y, kc, _ = attend_cached(attn, x[None], pos[None], cache, cache.clone())
    assert rel_err(y[0], y_ref) < 1e-12
    assert torch.count_nonzero(kc[:, :, L:]) == 0            # nothing written past the tokens' positions


def test_mtp_missing_weights(gen, tmp_path):
    model = load("qwen3_5", gen, tmp_path, False)
    with pytest.raises(MTPWeightsMissing, match="no mtp"):
        load_mtp_head(tmp_path, model)
