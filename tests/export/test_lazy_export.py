"""Lazy whole-model export (gdn_deploy.export.lazy_export): a HF folder traced with placeholder weights, every
initializer streamed from the checkpoint into weights.data; onnxruntime on those graphs equals the float32
reference of the eagerly loaded model (placeholders left in a graph would make it fail)."""
from __future__ import annotations

import json

import onnx
import pytest
import torch

from conftest import seed_for

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.export.lazy_export import NOT_CHECKED_LAZY, is_lazy  # noqa: E402
from gdn_deploy.export.loading import load_targets  # noqa: E402
from gdn_deploy.errors import NotChecked  # noqa: E402
from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.export.runtimes import compare_outputs, run_onnxruntime  # noqa: E402
from gdn_deploy.export.verify import reference_feed, reference_outputs  # noqa: E402
from gdn_deploy.export.weights_file import WEIGHTS_FILE, initializer_refs  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402


@pytest.fixture(scope="module", params=["qwen3_5_moe"])
def lazy_export(request, tmp_path_factory):
    family = request.param
    gen = torch.Generator().manual_seed(seed_for(f"lazy_export::{family}"))
    root = tmp_path_factory.mktemp(f"lazy_{family}")
    tiny.save(tiny.build(family, gen, **tiny.EPS_CONDITIONED), root / "hf")
    lazy = load_targets(str(root / "hf"), lazy=True)[0]
    assert is_lazy(lazy)
    assert all(all(s == 0 for s in p.stride()) for p in lazy.module.parameters())
    with pytest.raises(NotChecked, match="NOT CHECKED"):   # written, but no float32 reference: exit 9, not PASS
        export_model(lazy, root / "out", ExportOptions())
    return root


def test_lazy_export_streams_the_real_weights(lazy_export):
    root = lazy_export
    out = root / "out"
    meta = json.loads((out / "gdn_model.json").read_text())
    assert meta["not_checked"] == NOT_CHECKED_LAZY
    assert (out / WEIGHTS_FILE).is_file() and not list(out.glob("*.onnx.data"))
    assert not list(out.glob("*_reference.json"))
    eager = load_targets(str(root / "hf"), lazy=False)[0]
    tol = SPEC.check_tolerance("float32")
    for g in ("prefill", "decode"):
        feed = reference_feed(eager, g)
        ref = reference_outputs(eager, g, feed)
        got = run_onnxruntime(out / meta["graphs"][g]["file"], feed)
        bad = [r for r in compare_outputs(ref, got, tol) if not r["ok"]]
        assert not bad, (g, bad[:3])
    # every parameter once; the rest of weights.data are constants the optimizer folded, each small (it folds
    # tensors under its size limit only: with real-size weights they are a negligible share)
    params = {n: p.numel() * 4 for n, p in eager.module.named_parameters()}
    ranges: dict[tuple, set] = {}
    for info in meta["graphs"].values():
        for f in (info["file"], info["tensorrt_file"]):
            model = onnx.load(str(out / f), load_external_data=False)
            for name, r in initializer_refs(model).items():
                ranges.setdefault(r, set()).add(name.split(".", 1)[-1])
    of_params = [r for r, names in ranges.items() if names & set(params)]
    folded = [r for r in ranges if r not in of_params]
    assert sum(r[2] for r in of_params) <= sum(params.values())
    assert all(r[2] < (1 << 20) for r in folded)
    assert (out / WEIGHTS_FILE).stat().st_size <= 1.1 * sum(params.values()) + sum(r[2] for r in folded)


def test_auto_picks_eager_loading_for_small_folders(lazy_export, monkeypatch):
    root = lazy_export
    assert not is_lazy(load_targets(str(root / "hf"), lazy=None)[0])
    monkeypatch.setenv("GDN_LAZY_BYTES", "1000")
    assert is_lazy(load_targets(str(root / "hf"), lazy=None)[0])
    assert not is_lazy(load_targets(str(root / "hf"), lazy=None, blocks=True)[0])    # blocks load eagerly


def test_gdn_check_of_a_lazy_folder_verifies_files_and_says_not_checked(lazy_export, capsys):
    """gdn-check: sizes, sha256 and graph I/O checked, numerics honestly NOT CHECKED (exit 9), not a LoadError about
    missing reference files; --from-model rebuilds the float32 model (it fits here) and checks: PASS."""
    import shutil

    from gdn_deploy.errors import ExitCode
    from gdn_deploy.export.check_cli import main as gdn_check
    root = lazy_export
    assert gdn_check([str(root / "out")]) == ExitCode.NOT_CHECKED
    out = capsys.readouterr().out
    assert "files:" in out and "NOT CHECKED" in out and "gdn-check: NOT CHECKED" in out
    copy = root / "out_from_model"                  # a sibling: the relative source path still resolves
    shutil.copytree(root / "out", copy)
    with open(copy / "weights.data", "r+b") as fh:   # tampered weights: refused before any numerics
        fh.seek(12345)
        b = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([b[0] ^ 1]))
    assert gdn_check([str(copy), "-q"]) != ExitCode.OK
    shutil.rmtree(copy)
    shutil.copytree(root / "out", copy)
    assert gdn_check([str(copy), "--from-model", "-q"]) == ExitCode.OK
    assert "not_checked" not in json.loads((copy / "gdn_model.json").read_text())
    assert gdn_check([str(copy), "-q"]) == ExitCode.OK      # the folder now holds its reference


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_streamed_reference_equals_the_in_memory_reference(family, precision, tmp_path):
    """Every module's weights read as it runs (NaN placeholders otherwise) give the in-memory model's float32
    reference of the weights in ``precision``: prefill (ragged) and decode, every output and state."""
    from gdn_deploy.export.lazy_export import cast_lazy_target, streamed_reference_outputs
    from gdn_deploy.export.targets import cast_target
    gen = torch.Generator().manual_seed(seed_for(f"streamed_reference::{family}"))
    tiny.save(tiny.build(family, gen), tmp_path / "hf")
    eager = cast_target(load_targets(str(tmp_path / "hf"), lazy=False)[0], precision)
    lazy = cast_lazy_target(load_targets(str(tmp_path / "hf"), lazy=True)[0], precision)
    for g in ("prefill", "decode"):
        feed = reference_feed(eager, g, seed=3)
        ref = reference_outputs(eager, g, feed)
        got = streamed_reference_outputs(lazy, g, feed, precision)
        assert set(got) == set(ref)
        for k in ref:
            err = float((got[k].double() - ref[k].double()).norm() / ref[k].double().norm().clamp_min(1e-30))
            assert err <= 1e-6, (g, k, err)
    assert all(all(s == 0 for s in p.stride()) for p in lazy.module.parameters())   # nothing stays loaded


def test_streamed_reference_refuses_a_weight_read_outside_its_layer(tmp_path):
    """A model reading a layer's weight outside that layer's own calls sees its NaN placeholder: the reference
    raises instead of being silently wrong (here the head adds 0 x a weight of layer 0)."""
    from gdn_deploy.export.lazy_export import cast_lazy_target, streamed_reference_outputs
    gen = torch.Generator().manual_seed(seed_for("streamed_reference::outside"))
    tiny.save(tiny.build("qwen3_5", gen), tmp_path / "hf")
    lazy = cast_lazy_target(load_targets(str(tmp_path / "hf"), lazy=True)[0], "fp32")
    feed = reference_feed(lazy, "prefill", seed=3)
    out = streamed_reference_outputs(lazy, "prefill", feed, "fp32")            # as the model is: finite
    assert all(torch.isfinite(v).all() for v in out.values())
    net = lazy.module
    weight = next(p for n, p in net.layers[0].named_parameters())
    real = net._logits
    net._logits = lambda h: real(h) + 0 * next(p for n, p in net.layers[0].named_parameters()).sum()
    assert weight.shape == next(net.layers[0].parameters()).shape
    with pytest.raises(ValueError, match="logits are not finite"):
        streamed_reference_outputs(lazy, "prefill", feed, "fp32")


def test_gdn_check_from_model_streams_the_reference_when_the_model_does_not_fit(lazy_export, monkeypatch, capsys):
    """gdn-check --from-model on a model whose float32 copy would not fit (GDN_LAZY_BYTES stands in for a small
    machine): the reference is computed layer by layer from the checkpoint, and the folder PASSes with it."""
    import shutil

    from gdn_deploy.errors import ExitCode
    from gdn_deploy.export.check_cli import main as gdn_check
    root = lazy_export
    copy = root / "out_streamed"
    shutil.copytree(root / "out", copy)
    monkeypatch.setenv("GDN_LAZY_BYTES", "1000")
    assert gdn_check([str(copy), "--from-model"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "reference computed layer by layer" in out and "gdn-check: PASS" in out
    assert (copy / "prefill_reference.json").is_file() and "not_checked" not in \
        json.loads((copy / "gdn_model.json").read_text())
    shutil.rmtree(copy)
