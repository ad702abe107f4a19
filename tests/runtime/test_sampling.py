"""gdn_deploy.runtime.sampling / streaming and their use in runtime.generation: each filter against an independent
float64 reference and against Hugging Face transformers' logits processors, seeded reproducibility, stop strings,
streamed text, per-prompt budgets (a fake backend: a deterministic toy LM, so the loop logic is tested alone)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gdn_deploy.errors import UsageError
from gdn_deploy.runtime.folder import StateSpec
from gdn_deploy.runtime.generation import generate
from gdn_deploy.runtime.sampling import (Sampler, SamplingConfig, apply_repetition_penalty, min_p_filter,
                                         top_k_filter, top_p_filter)
from gdn_deploy.runtime.streaming import TextStream


def _logits(gen, B=6, V=50, ties=True):
    x = torch.randn(B, V, generator=gen) * 2.0
    if ties:                                   # a tie at the top and one in the middle of row 0
        x[0, 3] = x[0, 7] = x[0].max() + 1.0
        x[0, 11] = x[0, 12]
    return x


def _probs64(row):
    z = np.exp(row - row.max())
    return z / z.sum()


def _finite(x: torch.Tensor) -> np.ndarray:
    return torch.isfinite(x).numpy()


# ---- each filter against an independent reference --------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 5, 49, 50, 0])
def test_top_k_matches_sorted_reference(gen, k):
    x = _logits(gen)
    got = _finite(top_k_filter(x, k))
    for r, row in enumerate(x.double().numpy()):
        if k == 0 or k >= len(row):
            want = np.ones(len(row), bool)
        else:
            kth = sorted(row.tolist(), reverse=True)[k - 1]
            want = np.array([v >= kth for v in row])
        assert (got[r] == want).all(), (r, k)


def _cut_between(values, j):
    """A threshold halfway between sorted values j-1 and j (far from both: no rounding decides the test)."""
    return 0.5 * (values[j - 1] + values[j])


@pytest.mark.parametrize("where", [1, 2, 5, 20])
def test_top_p_matches_cumulative_reference(gen, where):
    x = _logits(gen, ties=False)
    for r, row in enumerate(x.double().numpy()):
        p = _probs64(row)
        order = np.argsort(-p, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(p[order])])      # mass strictly before each ranked token
        top_p = _cut_between(before, where)                         # keeps exactly `where` tokens
        got = _finite(top_p_filter(x[r:r + 1], float(top_p)))[0]
        want = np.zeros(len(row), bool)
        for rank, tok in enumerate(order):
            if before[rank] < top_p:
                want[tok] = True
        assert want.sum() == where and (got == want).all(), (r, top_p)
    assert _finite(top_p_filter(x, 1.0)).all()
    tiny = _finite(top_p_filter(x, 1e-9))                           # only the most likely token stays
    assert (tiny.sum(1) == 1).all() and (tiny.argmax(1) == x.argmax(1).numpy()).all()


@pytest.mark.parametrize("where", [1, 3, 10])
def test_min_p_matches_reference(gen, where):
    x = _logits(gen, ties=False)
    for r, row in enumerate(x.double().numpy()):
        p = _probs64(row)
        ratios = np.sort(p / p.max())[::-1]                        # 1 first
        min_p = _cut_between(ratios, where)
        got = _finite(min_p_filter(x[r:r + 1], float(min_p)))[0]
        want = p >= min_p * p.max()
        assert want.sum() == where and (got == want).all()


def test_repetition_penalty_matches_loop_reference(gen):
    x = _logits(gen)
    x[1, :5] = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0])
    seen = torch.rand(x.shape, generator=gen) < 0.3
    seen[1, :5] = True
    got = apply_repetition_penalty(x, seen, 1.7)
    want = x.clone().double()
    for r in range(x.shape[0]):
        for v in range(x.shape[1]):
            if seen[r, v]:
                s = float(x[r, v])
                want[r, v] = s * 1.7 if s < 0 else s / 1.7
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


def test_sampler_seen_mask_tracks_prompt_and_generated(gen):
    V = 20
    s = Sampler(SamplingConfig(repetition_penalty=100.0), [[1, 2], [5]], V)
    x = torch.zeros(2, V)
    x[:, 1] = x[:, 5] = x[:, 9] = 1.0
    x[:, 9] = 0.5
    # greedy with a strong penalty: prompt 0 saw 1 (not 5) -> 5; prompt 1 saw 5 -> 1
    assert s(x, [0, 1]).tolist() == [5, 1]
    # both have now seen 1 and 5 -> 9; and only prompt 1 is left in the batch
    assert s(x[1:], [1]).tolist() == [9]


# ---- against Hugging Face's processors ---------------------------------------------------------------------------
HF_CASES = [dict(temperature=0.7), dict(temperature=1.3, top_k=7), dict(temperature=1.0, top_p=0.8),
            dict(temperature=0.9, min_p=0.05), dict(temperature=1.0, repetition_penalty=1.3, top_k=20, top_p=0.9),
            dict(temperature=0.5, top_k=3, top_p=0.5, min_p=0.2, repetition_penalty=0.8)]


@pytest.mark.parametrize("case", HF_CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in HF_CASES])
def test_filtered_distribution_equals_transformers(gen, case):
    tf = pytest.importorskip("transformers")
    B, V = 5, 64
    x = _logits(gen, B, V)
    prompts = [torch.randint(0, V, (L,), generator=gen).tolist() for L in (1, 3, 8, 2, 5)]
    hf_ids = torch.tensor([p + [p[-1]] * (8 - len(p)) for p in prompts])      # same token sets per row
    procs = []
    if case.get("repetition_penalty", 1.0) != 1.0:
        procs.append(tf.RepetitionPenaltyLogitsProcessor(case["repetition_penalty"]))
    procs.append(tf.TemperatureLogitsWarper(case["temperature"]))
    if case.get("top_k"):
        procs.append(tf.TopKLogitsWarper(case["top_k"]))
    if case.get("top_p"):
        procs.append(tf.TopPLogitsWarper(case["top_p"]))
    if case.get("min_p"):
        procs.append(tf.MinPLogitsWarper(case["min_p"]))
    want = x.clone()
    for p in procs:
        want = p(hf_ids, want)
    got = Sampler(SamplingConfig(seed=0, **case), prompts, V).process(x, list(range(B)))
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    torch.testing.assert_close(got.softmax(-1), want.softmax(-1), rtol=1e-5, atol=1e-7)


# ---- drawing ------------------------------------------------------------------------------------------------------
def test_greedy_default_is_argmax_and_ignores_seed(gen):
    x = _logits(gen, 8, 100).to(torch.bfloat16)
    want = x.float().argmax(-1)
    for cfg in (None, SamplingConfig(), SamplingConfig(seed=5, top_k=3)):
        assert torch.equal(Sampler(cfg, [[0]] * 8, 100)(x, list(range(8))), want)


def test_seed_reproduces_and_draws_only_kept_tokens(gen):
    x = torch.randn(64, 1000, generator=gen) * 0.1                       # nearly flat: draws vary a lot
    cfg = SamplingConfig(temperature=1.0, top_k=50, seed=1234)
    a = [Sampler(cfg, [[0]] * 64, 1000)(x, range(64)) for _ in range(2)]
    assert torch.equal(a[0], a[1])
    b = Sampler(SamplingConfig(temperature=1.0, top_k=50, seed=1235), [[0]] * 64, 1000)(x, range(64))
    assert not torch.equal(a[0], b)
    kept = torch.topk(x, 50, dim=-1).indices
    assert (kept == a[0][:, None]).any(1).all()
    s = Sampler(SamplingConfig(temperature=1.0, seed=9), [[0]] * 64, 1000)
    steps = [s(x, range(64)) for _ in range(3)]
    assert not torch.equal(steps[0], steps[1])                          # the generator advances between steps


def test_draw_frequencies_follow_the_filtered_distribution(gen):
    """5 tokens of known probabilities, top-k 3: 40000 draws (400 sequences x 100 steps) land within 5 sigma of
    the renormalised probabilities."""
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    x = p.log().repeat(400, 1)
    s = Sampler(SamplingConfig(temperature=1.0, top_k=3, seed=int(torch.randint(0, 2 ** 31, (1,), generator=gen))),
                [[0]] * 400, 5)
    ids = torch.cat([s(x, range(400)) for _ in range(100)])
    freq = torch.bincount(ids, minlength=5).double() / 40000
    want = torch.tensor([0.4, 0.3, 0.15, 0.0, 0.0], dtype=torch.float64) / 0.85
    sigma = (want * (1 - want) / 40000).sqrt()
    assert ((freq - want).abs() <= 5 * sigma + 1e-12).all(), freq


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2.0),
                                 dict(top_k=-1), dict(repetition_penalty=0.0), dict(seed=-3),
                                 dict(temperature=float("nan"))])
def test_bad_settings_are_usage_errors(bad):
    with pytest.raises(UsageError) as e:
        SamplingConfig(**bad)
    assert "\n" not in str(e.value) and "--" in str(e.value)


# ---- streamed text and stop strings ------------------------------------------------------------------------------
def _utf8(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def _pieces(stream, ids):
    out = []
    for t in ids:
        out.append(stream.push(t))
        if stream.stopped:
            break
    out.append(stream.finish())
    return out


def test_stream_holds_back_incomplete_utf8():
    ids = list("aé€😀b".encode())
    s = TextStream(_utf8)
    pieces = _pieces(s, ids)
    assert "".join(pieces) == s.text == "aé€😀b"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[:3] == ["a", "", "é"]                      # é's first byte is held back


def test_stream_truly_invalid_bytes_come_out_at_the_end():
    s = TextStream(_utf8)
    assert "".join(_pieces(s, [104, 0xFF, 0xC3])) == _utf8([104, 0xFF, 0xC3]) == s.text


@pytest.mark.parametrize("text,stops,want", [
    ("hello END world", ["END"], "hello "),
    ("hello ENough END", ["END"], "hello ENough "),
    ("abcab", ["cabx"], "abcab"),
    ("xx\n\nyy", ["\n\n", "yy"], "xx"),
    ("ENDING", ["END"], ""),
    ("no stop here", ["zz"], "no stop here"),
])
def test_stream_stop_strings(text, stops, want):
    s = TextStream(_utf8, stops)
    pieces = _pieces(s, list(text.encode()))
    assert "".join(pieces) == s.text == want
    assert s.stopped == (want != text)
    done = ""
    for p in pieces:                                         # nothing emitted was later part of a stop string
        done += p
        assert not any(st in done for st in stops)


# ---- the generation loop on a toy backend --------------------------------------------------------------------------
class _ToyLM:
    """A deterministic toy LM: state = running hash of the sequence's ids, logits = a fixed function of it."""
    device = torch.device("cpu")

    def __init__(self, V):
        self.V = V
        self.w = torch.linspace(0.3, 7.0, V, dtype=torch.float64)

    def _logits(self, st):
        return (torch.sin(st.double() * self.w) * 4.0).float()

    def run(self, graph, feed):
        if graph == "prefill":
            ids, cu = feed["input_ids"], feed["cu_seqlens"].tolist()
            st = torch.tensor([[float(sum((j + 1) * int(t) for j, t in enumerate(ids[a:b].tolist())) % 9973)]
                               for a, b in zip(cu[:-1], cu[1:])])
            return {"logits": self._logits(st), "state": st}
        st = (feed["state_in"] * 31 + feed["input_ids"][:, None].double() + feed["positions"][:, None]) % 9973
        return {"logits": self._logits(st), "state_out": st}


def _toy(V=128, eos=()):
    spec = StateSpec(0, "gdn", "toy", "float32", None, "state", "state_in", "state_out", ["B", 1])
    folder = SimpleNamespace(vocab_size=V, max_positions=0, eos_token_ids=list(eos), interop=False,
                             has_positions=True, prefill_continues=False, states=[spec])
    return folder, _ToyLM(V)


def _text(ids):
    return "".join(chr(97 + t % 26) for t in ids)


def test_generate_greedy_rows_equal_alone_and_budgets():
    folder, be = _toy()
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9]]
    alone = [generate(folder, be, [p], 12).tokens[0] for p in prompts]
    res = generate(folder, be, prompts, [12, 5, 9])
    assert res.tokens == [alone[0], alone[1][:5], alone[2][:9]]
    assert res.stop_reasons == ["length"] * 3 and not any(res.finished)
    assert res.decode_tokens == 11 + 4 + 8 and res.tokens_per_second > 0


def test_generate_seeded_sampling_reproducible():
    folder, be = _toy()
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9]]
    cfg = SamplingConfig(temperature=1.5, top_k=40, top_p=0.95, min_p=0.01, repetition_penalty=1.2, seed=77)
    a, b = (generate(folder, be, prompts, 20, sampling=cfg) for _ in range(2))
    assert a.tokens == b.tokens and a.seed == 77
    greedy = generate(folder, be, prompts, 20).tokens
    assert a.tokens != greedy
    c = generate(folder, be, prompts, 20, sampling=SamplingConfig(temperature=1.5, top_k=40, seed=78))
    assert c.tokens != a.tokens


def test_sampled_tokens_do_not_depend_on_the_batch():
    """A sequence samples the same tokens alone, beside others, and when the others leave early."""
    folder, be = _toy()
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9]]
    cfg = SamplingConfig(temperature=1.2, top_p=0.95, seed=3)
    full = generate(folder, be, prompts, 16, sampling=cfg).tokens
    short = generate(folder, be, prompts, [16, 2, 5], sampling=cfg).tokens
    assert short == [full[0], full[1][:2], full[2][:5]]
    alone = generate(folder, be, prompts[:1], 16, sampling=cfg).tokens
    assert alone[0] == full[0]


def test_generate_stop_string_ends_only_its_sequence():
    folder, be = _toy()
    prompts = [[1, 2, 3], [7], [4, 4, 4, 4, 9]]
    free = generate(folder, be, prompts, 24, decode_text=_text)
    assert free.texts == [_text(t) for t in free.tokens]
    target = free.texts[1]
    stop = next(target[j:j + 3] for j in range(4, 20) if all(target[j:j + 3] not in t[:len(t)]
                                                              for t in (free.texts[0], free.texts[2])))
    streamed = {i: [] for i in range(3)}
    res = generate(folder, be, prompts, 24, decode_text=_text, stop_strings=[stop],
                   on_text=lambda i, piece: streamed[i].append(piece))
    cut = target.index(stop)
    assert res.stop_reasons == ["length", "stop", "length"] and res.finished == [False, True, False]
    assert res.texts[1] == target[:cut] and res.tokens[1] == free.tokens[1][:cut + 3]
    assert res.tokens[0] == free.tokens[0] and res.tokens[2] == free.tokens[2]
    assert all("".join(streamed[i]) == res.texts[i] for i in range(3))
    assert res.texts[0] == free.texts[0] and res.texts[2] == free.texts[2]


def test_generate_eos_and_stop_ids():
    folder, be = _toy()
    free = generate(folder, be, [[3, 1], [2]], 16).tokens
    eos = free[0][5]
    res = generate(folder, be, [[3, 1], [2]], 16, eos_token_ids=[eos], decode_text=_text, on_text=lambda i, p: None)
    n = free[0].index(eos) + 1
    assert res.tokens[0] == free[0][:n] and res.stop_reasons[0] == "eos"
    assert res.texts[0] == _text(free[0][:n - 1])            # the eos id's text is not streamed


def test_generate_bad_text_options():
    folder, be = _toy()
    with pytest.raises(UsageError, match="need a tokenizer"):
        generate(folder, be, [[1]], 4, stop_strings=["x"])
    with pytest.raises(UsageError, match="stop string must be non-empty"):
        generate(folder, be, [[1]], 4, stop_strings=[""], decode_text=_text)
    with pytest.raises(UsageError, match="2 budgets given for 1 prompts"):
        generate(folder, be, [[1]], [4, 5])
    with pytest.raises(UsageError, match="expected an integer >= 1"):
        generate(folder, be, [[1], [2]], [4, 0])
    assert math.isfinite(generate(folder, be, [[1]], 1).tokens_per_second)
