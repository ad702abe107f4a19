"""One weights file per export folder (gdn_deploy.export.weights_file): every graph and TensorRT copy reads the same
``weights.data``; tensors deduplicated by content, small ones inline; onnxruntime runs the rewritten graphs unchanged.
"""
from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from conftest import seed_for

ort = pytest.importorskip("onnxruntime")

from gdn_deploy.export.weights_file import (ALIGN_BYTES, INLINE_BYTES, WEIGHTS_FILE, external_locations,  # noqa: E402
                                            initializer_refs, share_weights)


def _matmul_model(weights: dict[str, np.ndarray], order: list[str]) -> onnx.ModelProto:
    """y = x @ W[order[0]] @ W[order[1]] ... (every weight square [n, n], float32)."""
    n = next(iter(weights.values())).shape[0]
    nodes, prev = [], "x"
    for i, name in enumerate(order):
        out = "y" if i == len(order) - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, name], [out], name=f"mm{i}"))
        prev = out
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", n])],
                              [numpy_helper.from_array(w, name) for name, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture
def two_graphs(tmp_path):
    """Graph a (inline weights) and graph b (its own b.onnx.data) sharing W under other names, with a transposed
    copy, a 1 MiB tensor (aligned), and a small tensor that stays inline."""
    rng = np.random.default_rng(seed_for("weights_file::two_graphs"))
    n = 512
    W = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)           # 1 MiB
    V = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    S = rng.standard_normal((8, 8), dtype=np.float32)                        # 256 B: stays inline
    a = _matmul_model({"W": W, "V": V}, ["W", "V"])
    a.graph.initializer.append(numpy_helper.from_array(S, "small"))
    b = _matmul_model({"W_again": W.copy(), "Wt": np.ascontiguousarray(W.T)}, ["W_again", "Wt"])
    onnx.save_model(a, str(tmp_path / "a.onnx"))
    onnx.save_model(b, str(tmp_path / "b.onnx"), save_as_external_data=True, location="b.onnx.data",
                    size_threshold=0)
    x = rng.standard_normal((3, n), dtype=np.float32)
    want = {"a.onnx": _run(tmp_path / "a.onnx", x), "b.onnx": _run(tmp_path / "b.onnx", x)}
    return tmp_path, x, want, n * n * 4


def test_graphs_share_one_file_and_still_run(two_graphs):
    folder, x, want, mib = two_graphs
    res = share_weights(folder, ["a.onnx", "b.onnx"])
    assert sorted(p.name for p in folder.iterdir()) == ["a.onnx", "b.onnx", WEIGHTS_FILE]   # b.onnx.data removed
    assert res.unique_tensors == 3 and res.references == 4          # W, V, W^T; W read by both graphs
    a, b = (onnx.load(str(folder / f), load_external_data=False) for f in ("a.onnx", "b.onnx"))
    ra, rb = initializer_refs(a), initializer_refs(b)
    assert ra["W"] == rb["W_again"] and rb["Wt"] not in (ra["W"], ra["V"])
    assert external_locations(a) == external_locations(b) == {WEIGHTS_FILE}
    assert "small" not in ra and len(a.graph.initializer[-1].raw_data) == 256
    assert all(off % ALIGN_BYTES == 0 for _, off, _ in [*ra.values(), *rb.values()])
    # every tensor once, plus at most one alignment pad per tensor
    assert 3 * mib <= res.file_bytes == (folder / WEIGHTS_FILE).stat().st_size < 3 * mib + 3 * ALIGN_BYTES
    for name, ref in want.items():
        np.testing.assert_array_equal(_run(folder / name, x), ref)
    # two sessions alive at once on the same file
    sa, sb = (ort.InferenceSession(str(folder / f), providers=["CPUExecutionProvider"]) for f in ("a.onnx", "b.onnx"))
    np.testing.assert_array_equal(sa.run(None, {"x": x})[0], want["a.onnx"])
    np.testing.assert_array_equal(sb.run(None, {"x": x})[0], want["b.onnx"])


def test_sharing_again_is_idempotent(two_graphs):
    folder, x, want, _ = two_graphs
    first = share_weights(folder, ["a.onnx", "b.onnx"])
    data = (folder / WEIGHTS_FILE).read_bytes()
    second = share_weights(folder, ["a.onnx", "b.onnx"])
    assert (second.file_bytes, second.unique_tensors) == (first.file_bytes, first.unique_tensors)
    assert (folder / WEIGHTS_FILE).read_bytes() == data
    for name, ref in want.items():
        np.testing.assert_array_equal(_run(folder / name, x), ref)


def test_threshold_keeps_small_tensors_inline(two_graphs):
    folder, x, want, mib = two_graphs
    res = share_weights(folder, ["a.onnx", "b.onnx"], inline_bytes=mib + 1)   # everything stays (or goes back) inline
    assert res.unique_tensors == 0 and res.file_bytes == 0
    assert not (folder / "b.onnx.data").exists()
    for name, ref in want.items():
        assert external_locations(onnx.load(str(folder / name), load_external_data=False)) == set()
        np.testing.assert_array_equal(_run(folder / name, x), ref)
    assert INLINE_BYTES == 1024


def test_truncated_external_file_is_refused(two_graphs):
    folder, _, _, _ = two_graphs
    path = folder / "b.onnx.data"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="ends early"):
        share_weights(folder, ["a.onnx", "b.onnx"])
    assert not (folder / WEIGHTS_FILE).exists() and not (folder / (WEIGHTS_FILE + ".tmp")).exists()
    assert external_locations(onnx.load(str(folder / "b.onnx"), load_external_data=False)) == {"b.onnx.data"}


# --- a whole exported model -----------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    gen = torch.Generator().manual_seed(seed_for("weights_file::exported"))
    root = tmp_path_factory.mktemp("weights_file")
    hf = tiny.build("qwen3_5", gen, vocab_size=3000, **tiny.EPS_CONDITIONED)   # tied embedding: ~60% of the bytes
    tiny.save(hf, root / "hf")
    target = load_targets(str(root / "hf"))[0]
    res = export_model(target, root / "out", ExportOptions(external_data=False))   # inline graphs, then shared
    weight_bytes = sum(p.numel() * p.element_size() for p in target.module.parameters())
    return root / "out", res, weight_bytes


def test_export_folder_holds_the_weights_once(exported):
    out, res, weight_bytes = exported
    meta = json.loads((out / "gdn_model.json").read_text())
    graphs = [f for g in meta["graphs"].values() for f in (g["file"], g["tensorrt_file"])]
    assert sorted(graphs) == ["decode.onnx", "decode.trt.onnx", "prefill.onnx", "prefill.trt.onnx"]
    assert not list(out.glob("*.onnx.data")) and (out / WEIGHTS_FILE) in res.files
    data = (out / WEIGHTS_FILE).stat().st_size
    assert weight_bytes * 0.9 <= data <= 1.1 * weight_bytes, (data, weight_bytes)
    for f in graphs:
        model = onnx.load(str(out / f), load_external_data=False)
        assert external_locations(model) == {WEIGHTS_FILE}
        inline = sum(len(t.raw_data) for t in model.graph.initializer)
        assert inline < 64 * 1024, (f, inline)           # only small constants stay in the graphs
        assert all(len(t.raw_data) < INLINE_BYTES for t in model.graph.initializer)
    # the TensorRT copies read the very ranges their onnxruntime graphs read
    for g in meta["graphs"].values():
        plain, trt = (initializer_refs(onnx.load(str(out / g[k]), load_external_data=False))
                      for k in ("file", "tensorrt_file"))
        assert plain == trt and plain
    # the export's own check (what gdn-check runs) passed on the rewritten graphs
    assert res.verification and all(r["ok"] for rows in res.verification.values() for r in rows)


def test_gdn_check_and_two_sessions_on_the_shared_file(exported, capsys):
    from gdn_deploy.export.check_cli import main as gdn_check
    from gdn_deploy.export.verify import load_reference
    out, _, _ = exported
    assert gdn_check([str(out), "-q"]) == 0
    meta = json.loads((out / "gdn_model.json").read_text())
    sessions = {g: ort.InferenceSession(str(out / info["file"]), providers=["CPUExecutionProvider"])
                for g, info in meta["graphs"].items()}
    for g, sess in sessions.items():            # both alive, both reading weights.data
        feed, ref = load_reference(out, g, meta["graphs"][g])
        got = sess.run(None, {k: v.numpy() for k, v in feed.items()})
        names = [o.name for o in sess.get_outputs()]
        got = dict(zip(names, got))
        ref = ref if isinstance(ref, dict) else dict(ref)
        for name in names[:1]:
            want = np.asarray(ref[name])
            assert np.abs(got[name] - want).max() <= 1e-4 + 1e-3 * np.abs(want).max(), (g, name)


def _referenced_contents(folder) -> dict[str, dict[str, str]]:
    """graph file -> initializer name -> sha256 of the bytes it reads (external range or inline)."""
    import hashlib
    out = {}
    for f in sorted(folder.glob("*.onnx")):
        model = onnx.load(str(f), load_external_data=False)
        rows = {}
        for t in model.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                with open(folder / info["location"], "rb") as fh:
                    fh.seek(int(info["offset"]))
                    data = fh.read(int(info["length"]))
            else:
                data = t.raw_data
            rows[t.name] = hashlib.sha256(data).hexdigest()
        out[f.name] = rows
    return out


def test_streamed_weights_equal_the_shared_copy(exported, tmp_path):
    """external_data exports (the default) stream each initializer straight into weights.data
    (stream_weights.save_streamed): no <graph>.onnx.data on the way, and every graph reads the very bytes the
    inline path (external_data=False: inline graphs, then share_weights) gives it; with progress shown the files
    are the same."""
    import io
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.progress import Progress
    out, _, _ = exported
    target = load_targets(str(out.parent / "hf"))[0]

    class Recorded(Progress):                # every step's label, whether or not a line was due when it ran
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.labels: list[str] = []

        def begin(self, label: str) -> None:
            self.labels.append(label)
            super().begin(label)

    log = io.StringIO()
    progress = Recorded("gdn-export", stream=log, tty=False)
    progress.interval = 0.0                  # a line per update (bytes written); steps print on the ticker only
    res = export_model(target, tmp_path / "streamed", ExportOptions(external_data=True), progress=progress)
    streamed = tmp_path / "streamed"
    assert not list(streamed.glob("*.onnx.data")) and not list(streamed.glob("*.tmp"))
    assert _referenced_contents(streamed) == _referenced_contents(out)
    assert (streamed / WEIGHTS_FILE).stat().st_size == (out / WEIGHTS_FILE).stat().st_size
    assert res.verification and all(r["ok"] for rows in res.verification.values() for r in rows)
    for stage in ("tracing prefill", "translating decode to ONNX", "writing weights of prefill"):
        assert any(label.startswith(stage) for label in progress.labels), progress.labels
    text = log.getvalue()
    assert re.search(r"gdn-export: writing weights of \w+ .* / .* \(\d+%\)", text), text[-2000:]  # done / total


def test_streamed_sources_are_read_once(tmp_path):
    """A lazily loaded initializer (onnx_ir.LazyTensor with meta[SOURCE_KEY], as lazy_export attaches) is read once
    per export: the second graph holding the same source points at the range the first one wrote, without calling
    the loader; other sources with the same bytes still share by content; the files hold the right bytes."""
    import onnx_ir as ir
    from gdn_deploy.export.stream_weights import SOURCE_KEY, save_streamed
    from gdn_deploy.export.weights_file import WeightsWriter
    rng = np.random.default_rng(seed_for("streamed_sources"))
    values = {"a": rng.standard_normal((32, 32)).astype(np.float32),
              "b": rng.standard_normal((32, 32)).astype(np.float32)}
    values["c"] = values["b"].copy()                      # other source, same bytes
    calls = {k: 0 for k in values}

    def loader(k):
        calls[k] += 1
        return ir.tensor(values[k], name=k)

    def model(order):
        proto = _matmul_model({k: values[k] for k in order}, order)
        m = ir.from_proto(proto)
        for k in order:
            v = m.graph.initializers[k]
            v.const_value = ir.LazyTensor(lambda k=k: loader(k), dtype=ir.DataType.FLOAT, shape=ir.Shape([32, 32]),
                                          name=k)
            v.const_value.meta[SOURCE_KEY] = ("test", k)
        return m

    with WeightsWriter(tmp_path / WEIGHTS_FILE) as writer:
        save_streamed(model(["a", "b"]), tmp_path / "g1.onnx", writer)
        save_streamed(model(["b", "a", "c"]), tmp_path / "g2.onnx", writer)
    assert calls == {"a": 1, "b": 1, "c": 1}
    assert (tmp_path / WEIGHTS_FILE).stat().st_size == 2 * 32 * 32 * 4          # a and b once; c shares b's bytes
    x = rng.standard_normal((3, 32)).astype(np.float32)
    for name, order in (("g1.onnx", "ab"), ("g2.onnx", "bac")):
        got = ort.InferenceSession(str(tmp_path / name)).run(None, {"x": x})[0]
        want = x.astype(np.float64)
        for k in order:
            want = want @ values[k]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
