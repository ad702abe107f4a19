"""States bound to onnxruntime in place (gdn_deploy/runtime/ort_binding.py): generation, chat and continued prefill
with binding equal the tensor-in, tensor-out path on every family; the KV caches are one buffer across steps (the
GroupQueryAttention kernel's shared past/present path: slots it does not write keep their contents, which the
unshared path clears); GDN recurrent states of the fused decode step are one buffer too, the other GDN states
alternate between two buffers; graphs of the standard-Attention form keep the
old path."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_folder_states_close, prefill_then_continue, rel_err

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.runtime.backends import make_backend  # noqa: E402
from gdn_deploy.runtime.generation import fresh_prefill_feed, generate, pack_prompts, state_holder  # noqa: E402
from gdn_deploy.runtime.ort_binding import GQA_OP, BoundStates, bound_states_for, in_place_caches  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_vl", "qwen3_5_moe", "olmo_hybrid"]
def _folder(family, tmp_path_factory):
    return tiny.exported_folder(family, tmp_path_factory, "ort_binding")


def _backends(folder, gqa=True):
    """Backends with and without binding; ``gqa``: the folder's onnxruntime graphs hold GroupQueryAttention (else
    the standard form: binding must fall back to tensors)."""
    bound, plain = (make_backend("onnxruntime", folder, bind_states=b, threads=1) for b in (True, False))
    assert (bound_states_for(folder, bound) is not None) == gqa and bound_states_for(folder, plain) is None
    assert isinstance(state_holder(folder, bound), BoundStates) == gqa        # what generate/Conversation use
    assert not isinstance(state_holder(folder, plain), BoundStates)
    return bound, plain


@pytest.mark.parametrize("family", FAMILIES)
def test_bound_generation_equals_unbound(family, tmp_path_factory):
    """Ragged prompts (1, 6, 11, 65 tokens), one stopping early at an eos id (the batch shrinks): the same tokens
    and prefill logits with and without binding. The tiny OLMo's heads of 12 take the standard-Attention form:
    there binding falls back to tensors (checked by _backends)."""
    folder, gen = _folder(family, tmp_path_factory)
    gqa = folder.meta["attention"]["onnxruntime"]["op"] == GQA_OP
    assert gqa == (family != "olmo_hybrid")
    bound, plain = _backends(folder, gqa)
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11, 65)]
    free = generate(folder, plain, prompts, 10, eos_token_ids=[])
    eos = free.tokens[1][2]
    a, b = (generate(folder, be, prompts, 10, eos_token_ids=[eos]) for be in (bound, plain))
    assert a.tokens == b.tokens and a.finished == b.finished
    assert a.finished[1] and len(a.tokens[1]) <= 3
    assert rel_err(a.prefill_logits, b.prefill_logits) <= 1e-6
    assert a.decode_steps == b.decode_steps > 0


def _step_feed(folder, tokens, positions):
    return {"input_ids": torch.tensor(tokens, dtype=torch.long), "positions": torch.tensor(positions)}


def test_caches_are_updated_in_place(tmp_path_factory):
    """Decode steps through BoundStates: each KV cache stays the same tensor (same storage) across steps; a value
    planted in a slot no position reaches survives (the kernel took the shared-buffer path: the unshared path
    zero-fills the present cache, as the plain run shows); each step's logits and cache rows equal the plain
    run's; GDN conv states alternate between two buffers, recurrent states of the fused (LinearAttention) decode
    step stay in one buffer (the CPU kernel updates them in place) and equal the plain run's."""
    folder, gen = _folder("qwen3_5", tmp_path_factory)
    bound_be, plain = _backends(folder)
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (3, 9)]
    ids, cu, pos = pack_prompts(prompts)
    S = 16
    feed = fresh_prefill_feed(folder, ids, cu, pos, S)
    bound = BoundStates(folder, bound_be)
    bound.load({k: v.clone() for k, v in feed.items()})
    got = bound.run("prefill", feed)
    ref = plain.run("prefill", feed)
    assert rel_err(got["logits"], ref["logits"]) <= 1e-6
    plain_states = {s.decode_input: ref[s.prefill_output] for s in folder.states}
    kv = [s for s in folder.states if s.kind == "attention"]
    gdn = [s for s in folder.states if s.kind == "gdn"]
    assert kv and gdn
    caches = {s.decode_input: bound.current[s.decode_input] for s in kv}
    ptrs = {k: v.data_ptr() for k, v in caches.items()}
    gdn_ptrs = {s.decode_input: {bound.current[s.decode_input].data_ptr(), bound.spare[s.decode_input].data_ptr()}
                for s in gdn}
    fused = folder.meta["graphs"]["decode"].get("decode_body") == "linear_attention"
    rec = {s.decode_input for s in gdn if s.role == "recurrent"}
    assert bound.in_place_recurrent["decode"] == (rec if fused else set())     # the fused step's states
    assert not bound.in_place_recurrent["prefill"]
    for k, x in caches.items():                  # no position reaches slot S-1 in these steps
        x[:, :, S - 1] = 1234.5
        plain_states[k] = plain_states[k].clone()
        plain_states[k][:, :, S - 1] = 1234.5
    positions = [len(p) for p in prompts]
    tokens = [int(t) for t in got["logits"].argmax(-1)]
    for step in range(4):
        before = {s.decode_input: bound.current[s.decode_input].data_ptr() for s in gdn}
        out = bound.run("decode", _step_feed(folder, tokens, positions))
        res = plain.run("decode", {**_step_feed(folder, tokens, positions), **plain_states})
        plain_states = {s.decode_input: res[s.decode_output] for s in folder.states}
        assert rel_err(out["logits"], res["logits"]) <= 1e-6, step
        for s in kv:
            x = bound.current[s.decode_input]
            assert x is caches[s.decode_input] and x.data_ptr() == ptrs[s.decode_input]
            assert bool((x[:, :, S - 1] == 1234.5).all()), f"{s.decode_input}: slot S-1 overwritten"
            p = res[s.decode_output]
            assert bool((p[:, :, S - 1] == 0).all())       # the unshared path rewrote the whole present cache
            for i, n in enumerate(positions):
                assert rel_err(x[i, :, :n + 1], p[i, :, :n + 1]) <= 1e-6
        for s in gdn:
            now = bound.current[s.decode_input].data_ptr()
            if s.decode_input in bound.in_place_recurrent["decode"]:
                assert now == before[s.decode_input]
            else:
                assert now != before[s.decode_input] and now in gdn_ptrs[s.decode_input]
            assert rel_err(bound.current[s.decode_input], res[s.decode_output]) <= 1e-6
        positions = [n + 1 for n in positions]
        tokens = [int(t) for t in out["logits"].argmax(-1)]


def test_chat_and_continued_prefill_equal_unbound(tmp_path_factory):
    """Three Conversation turns (lengths 5, 1, 4) and a batched continued prefill (two sequences continuing from
    different past lengths: onnxruntime CPU runs them one per call) give the same tokens, logits and states with
    and without binding."""
    from gdn_deploy.runtime.conversation import Conversation
    folder, gen = _folder("qwen3_next", tmp_path_factory)
    bound, plain = _backends(folder)
    chats = [Conversation(folder, be, eos_token_ids=[]) for be in (bound, plain)]
    for L in (5, 1, 4):
        turn = torch.randint(0, 96, (L,), generator=gen).tolist()
        assert chats[0].turn(turn, 6) == chats[1].turn(turn, 6)
    assert chats[0].fed == chats[1].fed
    for s in folder.states:
        a, b = chats[0].states[s.prefill_input], chats[1].states[s.prefill_input]
        n = len(chats[0].fed)
        if s.kind == "attention":
            a, b = a[:, :, :n], b[:, :, :n]
        assert rel_err(a, b) <= 1e-6, s.prefill_input
    first = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (3, 7)]
    more = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (4, 2)]
    res = [prefill_then_continue(folder, be, bound_states_for(folder, be), first, more, 12) for be in (bound, plain)]
    assert rel_err(res[0][0], res[1][0]) <= 1e-6
    assert_folder_states_close(folder, res[0][1], res[1][1], (7, 9), 1e-6)


def test_standard_attention_form_keeps_the_tensor_path(tmp_path_factory, tmp_path):
    """The standard-Attention form (ScatterND + Attention, what head sizes GroupQueryAttention refuses get) is not
    bound in place: in_place_caches refuses it, and refuses a cache that another op also reads."""
    import onnx

    from gdn_deploy.export.onnx_cache_attention import expand_cache_attention
    folder, _ = _folder("qwen3_5", tmp_path_factory)
    src = folder.graph_file("decode")
    assert in_place_caches(src, folder.states, "decode")
    m = onnx.load(str(src), load_external_data=False)
    assert expand_cache_attention(m) > 0
    onnx.save(m, str(tmp_path / "decode.onnx"))
    assert not in_place_caches(tmp_path / "decode.onnx", folder.states, "decode")
    m = onnx.load(str(src), load_external_data=False)
    key = next(s.decode_input for s in folder.states if s.kind == "attention")
    m.graph.node.append(onnx.helper.make_node("Identity", [key], ["extra_reader"]))
    onnx.save(m, str(tmp_path / "decode2.onnx"))
    assert not in_place_caches(tmp_path / "decode2.onnx", folder.states, "decode")


def test_recurrent_state_in_place_only_where_safe(tmp_path_factory, tmp_path):
    """in_place_recurrent takes the fused decode step's recurrent states and nothing else: not when another op also
    reads the state, not when the state output is not the LinearAttention node's present_state, never conv states
    or KV caches, and not the prefill graph (the chunked body reads the state in several ops)."""
    import onnx

    from gdn_deploy.runtime.ort_binding import in_place_recurrent
    folder, _ = _folder("qwen3_5", tmp_path_factory)
    src = folder.graph_file("decode")
    rec = [s.decode_input for s in folder.states if s.kind == "gdn" and s.role == "recurrent"]
    fused = folder.meta["graphs"]["decode"].get("decode_body") == "linear_attention"
    assert in_place_recurrent(src, folder.states, "decode") == (set(rec) if fused else set())
    assert not in_place_recurrent(folder.graph_file("prefill"), folder.states, "prefill")
    if not fused:
        pytest.skip("this onnxruntime has no LinearAttention: the decode graphs hold the standard-op step")
    m = onnx.load(str(src), load_external_data=False)
    m.graph.node.append(onnx.helper.make_node("Identity", [rec[0]], ["extra_reader"]))
    onnx.save(m, str(tmp_path / "decode_reader.onnx"))
    assert in_place_recurrent(tmp_path / "decode_reader.onnx", folder.states, "decode") == set(rec[1:])
    m = onnx.load(str(src), load_external_data=False)
    out = next(s.decode_output for s in folder.states if s.decode_input == rec[0])
    node = next(n for n in m.graph.node if out in n.output)
    node.output[list(node.output).index(out)] = "state_before_copy"
    m.graph.node.append(onnx.helper.make_node("Identity", ["state_before_copy"], [out]))
    onnx.save(m, str(tmp_path / "decode_copy.onnx"))
    assert in_place_recurrent(tmp_path / "decode_copy.onnx", folder.states, "decode") == set(rec[1:])
