"""Layer stamping (gdn_deploy/export/layer_stamping.py) against tracing every layer.

For each family, a tiny random HF model of 7 layers (the first layer of each kind traced, the others cloned) is
exported twice:
stamped (with the export's own check: onnxruntime vs the float32 PyTorch reference, every output and state) and
with ``stamp=False``. The two prefill and decode graphs must be the same graph after canonical renaming (node ops,
domains, attributes and wiring in the same topological order; inputs, outputs and parameters by name; folded
constants by value; the same function bodies) and give the same outputs on onnxruntime for fresh ragged prompts
of lengths 1, 6, 3 (prefill) and a decode step at random positions.
"""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from conftest import rel_err, seed_for

pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.export.hybrid_graphs import hybrid_io  # noqa: E402
from gdn_deploy.export.layer_stamping import NotStampable, stamp_plan  # noqa: E402
from gdn_deploy.export.loading import load_targets  # noqa: E402
from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.lm.model import padded_view  # noqa: E402

FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid"]
LAYERS = (tiny.LAYERS * 2)[:7]      # lin full lin lin full lin full: layers 0 and 1 traced (and qwen3_next's dense 3)
_CACHE: dict = {}


def _exports(family, tmp_path_factory, precision="fp32"):
    if (family, precision) not in _CACHE:
        gen = torch.Generator().manual_seed(seed_for(f"layer_stamping::{family}"))
        root = tmp_path_factory.mktemp(f"stamp_{family}_{precision}")
        hf = tiny.build(family, gen, num_hidden_layers=len(LAYERS), layer_types=list(LAYERS),
                        **tiny.EPS_CONDITIONED)
        tiny.save(hf, root / "hf")
        target = load_targets(str(root / "hf"))[0]
        logs: list[str] = []
        stamped = export_model(target, root / "stamped", ExportOptions(precision=precision), log=logs.append)
        full = export_model(target, root / "full", ExportOptions(precision=precision, stamp=False, verify=False))
        _CACHE[family, precision] = (target, stamped, full, logs, gen)
    return _CACHE[family, precision]


def _canonical(path):
    """A graph as a list of comparable rows; values renamed in order of definition."""
    m = onnx.load(str(path))
    g = m.graph
    names: dict[str, str] = {"": ""}
    rows: list = []
    for v in g.input:
        names[v.name] = f"input:{v.name}"
        rows.append(("input", v.name, v.type.SerializeToString()))
    for t in g.initializer:
        a = numpy_helper.to_array(t)
        digest = hashlib.sha256(a.tobytes() + str((a.dtype, a.shape)).encode()).hexdigest()[:16]
        names[t.name] = f"param:{t.name}" if t.name.startswith("net.") else f"const:{digest}"
        if t.name.startswith("net."):
            rows.append(("param", t.name, digest))
    k = 0
    body = []
    for n in g.node:
        ins = tuple(names[i] for i in n.input)
        for o in n.output:
            names[o] = f"v{k}" if o else ""
            k += 1
        attrs = tuple(sorted(a.SerializeToString() for a in n.attribute))
        body.append((n.domain, n.op_type, ins, tuple(names[o] for o in n.output), attrs))
    outs = [(v.name, names[v.name], v.type.SerializeToString()) for v in g.output]
    funcs = sorted(f.SerializeToString() for f in m.functions)
    opsets = sorted((o.domain, o.version) for o in m.opset_import)
    return sorted(rows), body, outs, funcs, opsets


def _prefill_feed(model, gen, lengths=(1, 6, 3)):
    T = sum(lengths)
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    pad = padded_view(cu)
    S = pad.shape[1] + 4
    feed = {"input_ids": torch.randint(0, model.hybrid_config.vocab_size, (T,), generator=gen),
            "cu_seqlens": cu, "positions": torch.cat([torch.arange(n) for n in lengths]), "pad_index": pad}
    ins, _ = hybrid_io(model, "prefill")
    for t in ins[4:]:
        shape = [len(lengths) if d == "N" else S if d == "S" else d for d in t["shape"]]
        x = torch.zeros(shape) if "S" in t["shape"] else torch.randn(shape, generator=gen) * 0.3
        feed[t["name"]] = x.to(torch.float32)
    return feed


def _decode_feed(model, gen, batch=3, S=9):
    pos = torch.randint(0, S, (batch,), generator=gen)
    feed = {"input_ids": torch.randint(0, model.hybrid_config.vocab_size, (batch,), generator=gen),
            "positions": pos}
    ins, _ = hybrid_io(model, "decode")
    for t in ins[2:]:
        shape = [batch if d == "B" else S if d == "S" else d for d in t["shape"]]
        x = torch.randn(shape, generator=gen) * 0.3
        if "S" in t["shape"]:
            keep = torch.arange(S)[None, :] < pos[:, None]
            x = torch.where(keep[:, None, :, None], x, torch.zeros(()))
        feed[t["name"]] = x
    return feed


def _run(path, feed):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {k: v.numpy() for k, v in feed.items()})))


@pytest.mark.parametrize("family", FAMILIES)
def test_stamped_graphs_equal_traced(family, tmp_path_factory):
    target, stamped, full, logs, gen = _exports(family, tmp_path_factory)
    traced = "[0, 1, 3]" if family == "qwen3_next" else "[0, 1]"
    assert sum(f"traced {traced.count(',') + 1} of 7 layers ({traced})" in line for line in logs) == 2, logs
    assert stamped.verification and all(r["ok"] for rows in stamped.verification.values() for r in rows)
    for graph in ("prefill", "decode"):
        a, b = _canonical(stamped.outdir / f"{graph}.onnx"), _canonical(full.outdir / f"{graph}.onnx")
        for part, x, y in zip(("initializers", "nodes", "outputs", "functions", "opsets"), a, b):
            if part == "nodes":
                assert len(x) == len(y), f"{family} {graph}: {len(x)} stamped nodes vs {len(y)} traced"
                for k, (p, q) in enumerate(zip(x, y)):
                    assert p == q, f"{family} {graph} node {k}: stamped {p[:4]} vs traced {q[:4]}"
            assert x == y, f"{family} {graph}: {part} differ"
        trt_a = _canonical(stamped.outdir / f"{graph}.trt.onnx")[1:3]
        assert trt_a == _canonical(full.outdir / f"{graph}.trt.onnx")[1:3], f"{family} {graph}.trt.onnx differs"


@pytest.mark.parametrize("family", FAMILIES)
def test_stamped_graphs_run_as_traced(family, tmp_path_factory):
    target, stamped, full, _, gen = _exports(family, tmp_path_factory)
    for graph, feed in (("prefill", _prefill_feed(target.module, gen)), ("decode", _decode_feed(target.module, gen))):
        got = _run(stamped.outdir / f"{graph}.onnx", feed)
        ref = _run(full.outdir / f"{graph}.onnx", feed)
        assert list(got) == list(ref)
        for name in ref:
            g, r = torch.from_numpy(got[name]).double(), torch.from_numpy(ref[name]).double()
            assert torch.isfinite(r).all() and r.abs().sum() > 0, f"{graph} {name}: reference is zero or not finite"
            assert rel_err(g, r) <= 1e-6, f"{family} {graph} {name}: rel {rel_err(g, r):.1e}"


_TYPES = {"tensor(float)": torch.float32, "tensor(bfloat16)": torch.bfloat16, "tensor(float16)": torch.float16,
          "tensor(int64)": torch.int64, "tensor(int32)": torch.int32}


def _run_any_dtype(sess, feed):
    """Run ``sess`` on torch ``feed``, each input cast to its type (bfloat16 included: run_onnxruntime)."""
    from gdn_deploy.export.runtimes import run_onnxruntime
    return run_onnxruntime(sess, {i.name: feed[i.name].to(_TYPES[i.type]) for i in sess.get_inputs()})


def test_bf16_stamped_runs_as_traced(tmp_path_factory):
    """bf16: torch.export casts each layer's new conv state to the float32 state output after the last layer; the
    casts are stamped with their layers. The export's own check passes (every output and state against float32
    PyTorch), inputs and outputs come in the traced graphs' order, the nodes are the traced graphs' but for Casts
    the optimizer folds differently (of constants), and both graphs give the same outputs and states on fresh
    ragged prompts and a decode step (onnxruntime CPU computing the bf16 graphs in float32)."""
    from collections import Counter

    from gdn_deploy.export.bf16_cpu import cpu_session
    target, stamped, full, logs, gen = _exports("qwen3_5", tmp_path_factory, "bf16")
    assert sum("traced 2 of 7 layers ([0, 1])" in line for line in logs) == 2, logs
    assert stamped.verification and all(r["ok"] for rows in stamped.verification.values() for r in rows)
    for graph, feed in (("prefill", _prefill_feed(target.module, gen)), ("decode", _decode_feed(target.module, gen))):
        a, b = (onnx.load(str(d.outdir / f"{graph}.onnx"), load_external_data=False) for d in (stamped, full))
        for part in ("input", "output"):
            assert [v.name for v in getattr(a.graph, part)] == [v.name for v in getattr(b.graph, part)], part
        ops = [Counter((n.domain, n.op_type) for n in m.graph.node if n.op_type != "Cast") for m in (a, b)]
        assert ops[0] == ops[1], f"{graph}: {ops[0] - ops[1]} / {ops[1] - ops[0]}"
        got, ref = (_run_any_dtype(cpu_session(d.outdir / f"{graph}.onnx"), feed) for d in (stamped, full))
        assert list(got) == list(ref)
        for name in ref:
            g, r = got[name].double(), ref[name].double()
            assert torch.isfinite(r).all() and r.abs().sum() > 0, f"{graph} {name}: reference is zero or not finite"
            assert rel_err(g, r) <= 1e-6, f"bf16 {graph} {name}: rel {rel_err(g, r):.1e}"


def _load(hf, tmp_path):
    tiny.save(hf, tmp_path / "hf")
    return load_targets(str(tmp_path / "hf"))[0]


def test_stamp_plan_prefix_and_templates(tmp_path):
    """The first layer of each kind is traced; every layer clones the traced layer of its kind."""
    gen = torch.Generator().manual_seed(0)
    hf = tiny.build("qwen3_next", gen, num_hidden_layers=9, layer_types=(tiny.LAYERS * 2)[:9])
    sp = stamp_plan(_load(hf, tmp_path).module)
    # qwen3_next: layer 3 has the dense MLP (mlp_only_layers), the others MoE
    assert sp.traced == [0, 1, 3] and sp.kind_of == [0, 1, 0, 2, 1, 0, 1, 0, 0]


def test_nothing_to_stamp(tmp_path):
    gen = torch.Generator().manual_seed(0)
    hf = tiny.build("qwen3_5", gen, num_hidden_layers=2, layer_types=tiny.LAYERS[:2])   # one GDN, one attention
    with pytest.raises(NotStampable, match="no layer kind repeats"):
        stamp_plan(_load(hf, tmp_path).module)
