"""Whole hybrid causal LMs exported from tiny random Hugging Face folders (built in the test, no downloads):
onnxruntime graphs against PyTorch and HF, generation with the runtime, the sidecar's state list, the op set.

Each family is exported once per session (``_export``); the export runs its own verification (onnxruntime vs
float32 PyTorch on a ragged prefill and a decode step at random positions, every output incl. states, spec's
fp32 tolerance: |a-b| <= 1e-4 + 1e-3|b| and 1e-4 norm-relative).
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

from conftest import rel_err, seed_for

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402
from greedy_agreement import unexplained_difference  # noqa: E402

from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.export.loading import load_targets  # noqa: E402
from gdn_deploy.export.op_allowlist import ORT_BODY_OPS, graph_op_problems  # noqa: E402
from gdn_deploy.runtime.backends import make_backend  # noqa: E402
from gdn_deploy.runtime.folder import ExportFolder  # noqa: E402
from gdn_deploy.runtime.generation import fresh_prefill_feed, generate  # noqa: E402
from gdn_deploy.runtime.states import pack_prompts  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_vl", "qwen3_5_moe", "olmo_hybrid"]
TOL = SPEC.check_tolerance("float32")
_CACHE: dict = {}


# Models for the fp32 comparisons are built with tiny.EPS_CONDITIONED (a CI run failed on 9.4e-4 on qwen3_5_moe
# logits with the default eps); the fp16 test keeps the default, which its measured bound refers to.
def _export(family, tmp_path_factory, conditioned=True, **opts):
    key = (family, conditioned, tuple(sorted(opts.items())))
    if key not in _CACHE:
        gen = torch.Generator().manual_seed(seed_for(f"hybrid_export::{family}"))
        root = tmp_path_factory.mktemp(f"{family}_export")
        hf = tiny.build(family, gen, **(tiny.EPS_CONDITIONED if conditioned else {}))
        tiny.save(hf, root / "hf")
        target = load_targets(str(root / "hf"))[0]
        res = export_model(target, root / "out", ExportOptions(**opts))
        _CACHE[key] = (hf, root / "hf", root / "out", res, gen)
    return _CACHE[key]


def _hf_generate(hf, prompt, n):
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n,
                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def _close(a, b, what):
    excess = float(((a - b).abs() - (TOL["atol"] + TOL["rtol"] * b.abs())).max())
    assert excess <= 0 and rel_err(a, b) <= TOL["rel"], \
        f"{what}: max |diff| {float((a - b).abs().max()):.2e}, rel {rel_err(a, b):.1e}"


@pytest.mark.parametrize("family", FAMILIES)
def test_onnxruntime_generation_equals_hf(family, tmp_path_factory):
    """Export verified; 3 prompts (lengths 1, 6, 11) in one onnxruntime prefill + one decode call per step give
    HF's greedy tokens for 24 new tokens; prefill logits within tolerance of HF's; the torch backend agrees."""
    hf, _, out, res, gen = _export(family, tmp_path_factory)
    assert res.verification and all(r["ok"] for rows in res.verification.values() for r in rows)
    folder = ExportFolder(out)
    assert folder.kind == "hybrid"
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11)]
    got = generate(folder, make_backend("onnxruntime", folder), prompts, 24, eos_token_ids=[])
    ref = generate(folder, make_backend("torch", folder), prompts, 24, eos_token_ids=[])
    assert got.decode_steps == 23
    # both fp32 paths differ from float64 by rounding, which some random models amplify (OLMo's beta in [0, 2]):
    # over 60 random OLMo models the exported graph's last-token logits were up to 1.1e-4 from HF run in float64
    # (HF's own fp32 run: up to 4.5e-5, our torch backend 1.3e-4), and one CI run saw 2.8e-4 against HF fp32 at
    # norm rel 5.2e-5; so the element-wise bound is 10x the export check's atol, the norm-relative bound the export
    # check's own
    with torch.no_grad():
        hf_last = torch.stack([hf(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts])
    err = (got.prefill_logits - hf_last).abs()
    assert float(err.max()) <= 10 * TOL["atol"] + TOL["rtol"] * float(hf_last.abs().max()) and \
        rel_err(got.prefill_logits, hf_last) <= TOL["rel"], \
        f"{family} onnxruntime prefill logits vs HF: max |diff| {float(err.max()):.2e}, " \
        f"rel {rel_err(got.prefill_logits, hf_last):.1e}"
    for i, p in enumerate(prompts):       # equal tokens, except that fp32 paths may part at a near-tie (HF's logits)
        want = _hf_generate(hf, p, 24)
        hf_logits = _hf_logits_after(hf, p, want)
        for what, toks in (("onnxruntime", got.tokens[i]), ("torch backend", ref.tokens[i])):
            why = unexplained_difference(toks, want, hf_logits, TOL["atol"], TOL["rtol"])
            assert why is None, f"{family} prompt {i}, {what} vs HF: {why}"


def _hf_logits_after(hf, prompt, want):
    def at(j):
        with torch.no_grad():
            return hf(input_ids=torch.tensor([prompt + want[:j]])).logits[0, -1]
    return at


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_graphs_use_allowed_ops_only(family, tmp_path_factory):
    _, _, out, _, _ = _export(family, tmp_path_factory)
    meta = json.loads((out / "gdn_model.json").read_text())
    for g, info in meta["graphs"].items():
        model = onnx.load(str(out / info["tensorrt_file"]), load_external_data=False)
        assert graph_op_problems(model) == [], (g, graph_op_problems(model)[:5])
        gdn = [n for n in model.graph.node if n.domain == "gdn"]
        assert len(gdn) == len(meta["model"]["config"]["layer_types"]) - meta["model"]["layer_types"].count(
            "full_attention")
        ort_graph = onnx.load(str(out / info["file"]), load_external_data=False)
        assert graph_op_problems(ort_graph, onnxruntime=True) == []
        if g in ("prefill", "decode"):      # MoE layers: one com.microsoft::MoE node each (gdn_deploy.export.onnx_moe)
            moe = [n for n in ort_graph.graph.node if n.op_type == "MoE" and n.domain == "com.microsoft"]
            want = meta["model"]["mlp_types"].count("moe") if meta["model"].get("moe", {}).get(g) == "op" else 0
            assert len(moe) == want, (g, len(moe), want)


def _ancestors(made: dict, names) -> set[str]:
    """Names of the nodes that compute ``names`` (node outputs by ``made``: output -> node)."""
    seen, todo = set(), list(names)
    while todo:
        n = made.get(todo.pop())
        if n is not None and n.name not in seen:
            seen.add(n.name)
            todo += list(n.input)
    return seen


@pytest.mark.parametrize("family", FAMILIES)
def test_state_side_chains_run_inside_their_layer(family, tmp_path_factory, tmp_path):
    """onnxruntime's default execution order runs each state's side chain (the nodes only that state output needs,
    e.g. a GDN layer's new conv state gathered from its [T, conv_dim] window table) in layer order and before the
    logits: the table is freed inside its layer (export/onnx_schedule.py). Before, the walk ran every side chain
    after the logits, holding every GDN layer's table until the end. The order is onnxruntime's own, read from
    its profile."""
    import onnxruntime as ort
    _, _, out, _, _ = _export(family, tmp_path_factory)
    path = out / json.loads((out / "gdn_model.json").read_text())["graphs"]["prefill"]["file"]
    model = onnx.load(str(path), load_external_data=False)
    made = {o: n for n in model.graph.node for o in n.output}
    main = _ancestors(made, ["logits"])
    chains = [(o.name, _ancestors(made, [o.name]) - main) for o in model.graph.output if o.name != "logits"]
    shared = {n for i, (_, a) in enumerate(chains) for _, b in chains[i + 1:] for n in a & b}   # e.g. indices
    chains = [(o, c - shared) for o, c in chains if c - shared]
    assert len(chains) >= 2, chains          # every family here has several GDN layers with a conv-state chain
    so = ort.SessionOptions()
    so.execution_order = ort.ExecutionOrder.DEFAULT
    so.enable_profiling, so.profile_file_prefix = True, str(tmp_path / "order")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    folder = ExportFolder(out)
    ids, cu, pos = pack_prompts([[1, 2, 3, 4, 5]])
    run_onnxruntime(sess, fresh_prefill_feed(folder, ids, cu, pos, capacity=8))
    events = json.loads(Path(sess.end_profiling()).read_text())
    order = [e["name"][:-len("_kernel_time")] for e in events
             if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    pos = {name: k for k, name in enumerate(order)}
    logits_at = pos[made["logits"].name]
    found = [(o, [pos[n] for n in c if n in pos]) for o, c in chains]   # (onnxruntime fuses some nodes)
    assert all(at for _, at in found), found
    spans = [(min(at), max(at), o) for o, at in found]
    assert all(last < logits_at for _, last, _ in spans), (family, spans, logits_at)
    spans.sort()
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), (family, spans)


@pytest.mark.parametrize("family", FAMILIES)
def test_rms_norms_fuse_in_onnxruntime(family, tmp_path_factory, tmp_path):
    """Every RMS norm of the graphs onnxruntime runs is in the form its SimplifiedLayerNormFusion takes
    (export/onnx_norm_form.py; the outputs against PyTorch: the export's verification and the tests above): no
    ``Mul(x, Reciprocal(Sqrt(v)))`` is left in the main graph and the optimized session holds one
    SimplifiedLayerNormalization per norm (per ReduceMean of the exported graph)."""
    import onnxruntime as ort
    _, _, out, _, _ = _export(family, tmp_path_factory)
    meta = json.loads((out / "gdn_model.json").read_text())
    for g in ("prefill", "decode"):
        model = onnx.load(str(out / meta["graphs"][g]["file"]), load_external_data=False)
        made = {o: n for n in model.graph.node for o in n.output}
        left = [n.name for n in model.graph.node if n.op_type == "Mul" and any(
            made.get(x) is not None and made[x].op_type == "Reciprocal" and made[x].input[0] in made
            and made[made[x].input[0]].op_type == "Sqrt" for x in n.input)]
        assert left == [], (g, left[:3])
        norms = sum(n.op_type == "ReduceMean" for n in model.graph.node)
        assert norms > 0
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / f"{g}_optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{g}_opt.data")
        ort.InferenceSession(str(out / meta["graphs"][g]["file"]), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(str(tmp_path / f"{g}_optimized.onnx"), load_external_data=False)
        fused = sum(n.op_type == "SimplifiedLayerNormalization" for n in opt.graph.node)
        assert fused == norms, (family, g, fused, norms)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_bodies_equal_pytorch(family, tmp_path_factory, tmp_path):
    """The decode graph onnxruntime runs holds the fused LinearAttention step (sidecar ``decode_body``) and its
    TensorRT copy the plugin node; on a fresh decode feed (batch 5 at ragged positions, random states) the fused
    step and the standard-op step each give the float32 PyTorch outputs, logits and every state."""
    from gdn_deploy.export.onnx_functions import (DECODE_BODIES, add_function_bodies, function_body,
                                                  onnxruntime_has_linear_attention)
    from gdn_deploy.export.runtimes import onnxruntime_session, run_onnxruntime
    from gdn_deploy.export.verify import reference_feed, reference_outputs
    _, hf_dir, out, _, _ = _export(family, tmp_path_factory)
    has_la = onnxruntime_has_linear_attention()
    info = json.loads((out / "gdn_model.json").read_text())["graphs"]["decode"]
    assert info["decode_body"] == ("linear_attention" if has_la else "ops")
    model = onnx.load(str(out / info["file"]), load_external_data=False)
    fused = {(n.domain, n.op_type) for f in model.functions for n in f.node if n.domain not in ("", "ai.onnx")}
    assert fused == (set(ORT_BODY_OPS) if has_la else set())
    trt = onnx.load(str(out / info["tensorrt_file"]), load_external_data=False)
    assert not trt.functions and any(n.domain == "gdn" for n in trt.graph.node)
    target = load_targets(str(hf_dir))[0]
    feed = reference_feed(target, "decode", seed=seed_for(f"decode_bodies::{family}"), sizes={"batch": 5})
    ref = reference_outputs(target, "decode", feed)
    for f in out.iterdir():                   # the weights and everything else, next to the rewritten graph
        if f.is_file() and f.name != info["file"]:
            (tmp_path / f.name).hardlink_to(f)
    for body in DECODE_BODIES if has_la else ("ops",):
        add_function_bodies(model, function_body(model) or "chunked", body)
        onnx.save(model, str(tmp_path / info["file"]))
        sess = onnxruntime_session(tmp_path / info["file"], ("CPUExecutionProvider",), None)
        got = run_onnxruntime(sess, {i.name: feed[i.name] for i in sess.get_inputs()})
        assert set(got) == set(ref)
        for name, want in ref.items():
            _close(got[name].float(), want, f"{family} decode ({body}) {name}")


def test_op_check_can_fail():
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    m = helper.make_model(helper.make_graph([helper.make_node("NonZero", ["x"], ["y"], name="nz")], "g", [x], [y]))
    assert graph_op_problems(m) == ["nz: NonZero is not in ALLOWED_OPS (onnxruntime CPU + TensorRT 10.x parser)"]


def test_sidecar_describes_every_state(tmp_path_factory):
    _, _, out, _, _ = _export("qwen3_next", tmp_path_factory)
    meta = json.loads((out / "gdn_model.json").read_text())
    states = meta["states"]
    assert [(s["layer"], s["kind"]) for s in states][::2] == [(0, "gdn"), (1, "attention"), (2, "gdn"), (3, "gdn"),
                                                              (4, "attention")]
    dec = onnx.load(str(out / "decode.onnx"), load_external_data=False)
    pre = onnx.load(str(out / "prefill.onnx"), load_external_data=False)

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    dec_in, dec_out = {v.name: v for v in dec.graph.input}, {v.name: v for v in dec.graph.output}
    pre_out = {v.name: v for v in pre.graph.output}
    for s in states:
        assert dims(dec_in[s["decode_input"]]) == s["decode_shape"] == dims(dec_out[s["decode_output"]])
        assert dims(pre_out[s["prefill_output"]]) == s["prefill_shape"]
    pre_in = {v.name: v for v in pre.graph.input}
    for s in states:
        assert s["prefill_input"] == s["decode_input"] and dims(pre_in[s["prefill_input"]]) == s["prefill_shape"]
    assert [v.name for v in pre.graph.input][:4] == ["input_ids", "cu_seqlens", "positions", "pad_index"]
    assert dims(pre_in["pad_index"]) == ["N", "L"]
    assert dims(pre_out["logits"]) == ["N", 96]
    assert meta["dims"]["S"].startswith("KV-cache capacity")
    assert meta["attention"]["onnxruntime"]["op"] == "com.microsoft::GroupQueryAttention"
    assert meta["attention"]["tensorrt"]["files"] == ["prefill.trt.onnx", "decode.trt.onnx"]
    ops = {(n.domain, n.op_type) for n in pre.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") in ops and ("", "Attention") not in ops
    assert meta["profiles"]["decode"]["key_cache_1"]["max"][2] == 4096
    assert meta["generation"]["prefill_logits"] == "last" and meta["model"]["mlp_types"][3] == "dense"


def test_all_logits_and_external_data(tmp_path_factory, monkeypatch):
    """--all-logits: prefill logits of every token; graphs exported with external data end up reading the one
    weights.data (no <graph>.onnx.data left)."""
    import gdn_deploy.export.model_export as me
    monkeypatch.setattr(me, "EXTERNAL_DATA_BYTES", 0)
    hf, _, out, res, gen = _export("qwen3_5_moe", tmp_path_factory, all_logits=True)
    assert (out / "weights.data").is_file() and not list(out.glob("*.onnx.data"))
    assert all(r["ok"] for rows in res.verification.values() for r in rows)
    folder = ExportFolder(out)
    be = make_backend("onnxruntime", folder)
    prompts = [[3, 4, 5], [7]]
    from gdn_deploy.lm.model import padded_view
    from gdn_deploy.runtime.generation import empty_state_feed, pack_prompts
    ids, cu, pos = pack_prompts(prompts)
    logits = be.run("prefill", {"input_ids": ids, "cu_seqlens": cu, "positions": pos, "pad_index": padded_view(cu),
                                **empty_state_feed(folder, 2, 3)})["logits"]
    with torch.no_grad():
        ref = torch.cat([hf(input_ids=torch.tensor([p])).logits[0] for p in prompts])
    assert logits.shape == (4, 96)
    _close(logits, ref, "all-token logits")
    assert generate(folder, be, prompts, 5, eos_token_ids=[]).tokens == [_hf_generate(hf, p, 5) for p in prompts]


def test_fp16_export_as_accurate_as_pytorch_fp16(tmp_path_factory):
    """fp16 graphs in onnxruntime vs the float32 reference: within the spec's fp16 tolerance, or (where these
    random models' gated norms amplify fp16 rounding past it: some output in about one seed in four) of the same
    order as PyTorch's own fp16 error on the same inputs: at most 5x its norm-relative error. The exported graph and
    eager PyTorch round to fp16 at different points (the graph after each ONNX op it is made of); over 34 seeds
    onnxruntime's error reached 3.55x PyTorch's (the same at every onnxruntime optimisation level; fp16 MatMuls
    accumulate in fp32 in both), and the earlier bound of 1.5x failed 2 of the 34."""
    from gdn_deploy.export import metadata as md
    from gdn_deploy.export.runtimes import compare_outputs
    from gdn_deploy.export.verify import load_reference
    _, _, out, _, _ = _export("olmo_hybrid", tmp_path_factory, conditioned=False, precision="fp16", verify=False)
    meta = md.read_metadata(out)
    assert meta["dtypes"]["activations"] == "float16"
    assert {s["dtype"] for s in meta["states"]} == {"float32", "float16"}      # GDN states fp32, KV caches fp16
    folder = ExportFolder(out)
    ort, pt = make_backend("onnxruntime", folder), make_backend("torch", folder)
    tol = SPEC.check_tolerance("float16")
    for g in ("prefill", "decode"):
        feed, ref = load_reference(out, g, meta["graphs"][g])
        rows = {r["name"]: r for r in compare_outputs(ref, ort.run(g, feed), tol)}
        own = {r["name"]: r for r in compare_outputs(ref, {k: v.float() for k, v in pt.run(g, feed).items()}, tol)}
        for name, r in rows.items():
            assert r.get("max_abs") is not None and (r["ok"] or r["rel"] <= 5.0 * own[name]["rel"]), (g, name, r,
                                                                                                     own[name])


def test_interop_is_refused_for_hybrid_models(tmp_path_factory):
    from gdn_deploy.errors import UsageError
    _, hf_dir, _, _, _ = _export("qwen3_5", tmp_path_factory)
    with pytest.raises(UsageError, match="--interop com.microsoft: LinearAttention replaces the gdn ops of pure-GDN"):
        export_model(load_targets(str(hf_dir))[0], tmp_path_factory.mktemp("x"), ExportOptions(interop="com.microsoft"))


def test_gdn_check_on_a_whole_model_folder(tmp_path_factory, capsys):
    """gdn-check runs every graph of the folder on its stored feed (states included) and, with --from-model,
    rebuilds the reference from the Hugging Face folder the sidecar names."""
    from gdn_deploy.export.check_cli import main as gdn_check
    _, _, out, _, _ = _export("qwen3_5_moe", tmp_path_factory)
    assert gdn_check([str(out)]) == 0
    text = capsys.readouterr().out
    assert "key_cache_out_1" in text and "rec_state_out_0" in text and "gdn-check: PASS" in text
    assert gdn_check([str(out), "--from-model", "--seed", "5", "-q"]) == 0


def _chunks(seq, k):
    """``seq`` cut into exactly k non-empty pieces (len(seq) >= k)."""
    cuts = [round(i * len(seq) / k) for i in range(k + 1)]
    return [seq[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


@pytest.mark.parametrize("k", [1, 2, 5])
def test_continued_prefill_equals_one_prefill(k, tmp_path_factory):
    """Two ragged prompts (7 and 12 tokens) fed in k chunks (prefill continuing from the states the previous chunk
    returned) give one prefill's last logits and states (KV caches on the filled slots) in onnxruntime."""
    from gdn_deploy.runtime.conversation import prefill
    _, _, out, _, gen = _export("qwen3_next", tmp_path_factory)
    folder = ExportFolder(out)
    be = make_backend("onnxruntime", folder)
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (7, 12)]
    cap = 16
    ref_logits, ref = prefill(folder, be, prompts, capacity=cap)
    pieces = [_chunks(p, k) for p in prompts]
    states, past = None, [0, 0]
    for j in range(k):
        logits, states = prefill(folder, be, [pieces[0][j], pieces[1][j]], states, past, capacity=cap)
        past = [past[i] + len(pieces[i][j]) for i in range(2)]
    _close(logits, ref_logits, f"logits after {k} chunks")
    for s in folder.states:
        a, b = states[s.prefill_input], ref[s.prefill_input]
        if s.kind == "attention":
            for i, p in enumerate(prompts):
                _close(a[i, :, :len(p)], b[i, :, :len(p)], f"{s.prefill_input} row {i}")
        else:
            _close(a, b, s.prefill_input)


def test_multi_turn_equals_hf_on_the_whole_conversation(tmp_path_factory):
    """Three turns through Conversation (each prefill continues; onnxruntime) give HF's greedy reply to the
    concatenated conversation at every turn."""
    from gdn_deploy.runtime.conversation import Conversation
    hf, _, out, _, gen = _export("qwen3_next", tmp_path_factory)
    folder = ExportFolder(out)
    chat = Conversation(folder, make_backend("onnxruntime", folder), eos_token_ids=[])
    history: list[int] = []
    for L in (5, 1, 4):
        turn = torch.randint(0, 96, (L,), generator=gen).tolist()
        got = chat.turn(turn, 6)
        history += turn
        want = _hf_generate(hf, history, 6)
        why = unexplained_difference(got, want, _hf_logits_after(hf, history, want), TOL["atol"], TOL["rtol"])
        assert why is None, f"turn of {L} tokens: {why}"
        history += got


def test_bad_past_states_are_refused(tmp_path_factory):
    """Past states of the wrong layer count, dtype or capacity: one UsageError line, nothing run."""
    from gdn_deploy.errors import UsageError
    from gdn_deploy.runtime.conversation import prefill
    _, _, out, _, _ = _export("qwen3_next", tmp_path_factory)
    folder = ExportFolder(out)
    be = make_backend("onnxruntime", folder)
    _, st = prefill(folder, be, [[1, 2, 3]], capacity=6)
    fewer = dict(st)
    fewer.pop(folder.states[-1].prefill_input)
    with pytest.raises(UsageError, match="past states: expected 10 tensors"):
        prefill(folder, be, [[4]], fewer, [3])
    key = next(s.prefill_input for s in folder.states if s.kind == "attention")
    with pytest.raises(UsageError, match=f"past state {key}: dtype float16, the graphs take float32"):
        prefill(folder, be, [[4]], dict(st, **{key: st[key].half()}), [3])
    with pytest.raises(UsageError, match="sequence 0: past length 3 \\+ 4 new tokens exceed the KV-cache capacity 6"):
        prefill(folder, be, [[4, 5, 6, 7]], st, [3])
    with pytest.raises(UsageError, match="expected 1 integers"):
        prefill(folder, be, [[4]], st, [3, 1])
