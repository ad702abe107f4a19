"""An export folder is bound to its sidecar (files, sizes, sha256, graph I/O), written all at once, and its output
path is checked before any work; bf16 folders that no runtime here can run are reported NOT CHECKED (exit 9)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from gdn_deploy.checkpoint import save_checkpoint  # noqa: E402
from gdn_deploy.errors import ExitCode, LoadError  # noqa: E402
from gdn_deploy.export import metadata as md  # noqa: E402
from gdn_deploy.export.check_cli import main as check_main  # noqa: E402
from gdn_deploy.export.cli import main as export_main  # noqa: E402
from gdn_deploy.export.integrity import verify_folder  # noqa: E402
from gdn_deploy.model import GDNConfig, GDNLM  # noqa: E402
from gdn_deploy.runtime.folder import ExportFolder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DECODE_LOOP = REPO / "samples" / "decode_loop.py"


def _lm():
    torch.manual_seed(0)
    lm = GDNLM(GDNConfig(hidden_size=16, num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, vocab_size=40,
                         num_layers=2, intermediate_size=24))
    lm.reset_parameters()
    return lm.eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(_lm(), tmp_path_factory.mktemp("integrity") / "tiny.pt")


@pytest.fixture(scope="module")
def good(ckpt):
    out = ckpt.parent / "good"
    assert export_main([str(ckpt), "-o", str(out), "--no-verify", "-q"]) == 0
    return out


def _copy(good: Path, tmp_path: Path) -> Path:
    d = tmp_path / "export"
    shutil.copytree(good, d)
    return d


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _decode_loop(folder: Path, *extra: str):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the three prompts decode_loop would pick itself (and say so on stderr) unless the caller gives some
    demo = [] if "--ids" in extra else ["--ids", "1", "--ids", "2,3,4,5,6", "--ids", "7,8,9,10,11,12,13,14,15,16,17"]
    return subprocess.run([sys.executable, str(DECODE_LOOP), "--model", str(folder), "-n", "2", "-q", *demo, *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# ---- the sidecar binds the folder --------------------------------------------------------------------------
def test_sidecar_lists_every_file_with_size_and_sha256(good):
    meta = md.read_metadata(good)
    on_disk = sorted(p.name for p in good.iterdir() if p.name != md.SIDECAR_NAME)
    assert sorted(meta["files"]) == on_disk
    assert {"prefill.onnx", "decode.onnx", "prefill.trt.onnx", "prefill_inputs.json", "decode_reference.json"} \
        <= set(on_disk)
    for name, entry in meta["files"].items():
        assert entry == md.file_digest(good / name)
        assert entry["bytes"] == (good / name).stat().st_size > 0
    assert meta["sidecar_sha256"] == md.sidecar_digest(meta)
    assert verify_folder(good, meta, hashes=True) == len(on_disk)


def _edit(d: Path, fn, *, rebind_sidecar: bool) -> None:
    meta = json.loads((d / md.SIDECAR_NAME).read_text())
    fn(meta)
    if rebind_sidecar:                      # a careful forger: the sidecar's own checksum recomputed
        meta["sidecar_sha256"] = md.sidecar_digest(meta)
    (d / md.SIDECAR_NAME).write_text(json.dumps(meta))


def _state_shape(meta):
    meta["graphs"]["decode"]["inputs"][1]["shape"][1] = 3          # conv_state_0's channels


def _head_count(meta):
    meta["model"]["config"]["num_v_heads"] = 4


def _drop_output(meta):
    meta["graphs"]["prefill"]["outputs"].pop()


def _dtype(meta):
    meta["graphs"]["decode"]["inputs"][0]["dtype"] = "int32"


def _state_entry(meta):                     # a hybrid-style state list that disagrees with the decode graph
    meta["states"] = [{"layer": 0, "kind": "gdn", "role": "conv", "dtype": "float32", "prefill_output":
                       "conv_state_out_0", "decode_input": "conv_state_0", "decode_output": "conv_state_out_0",
                       "decode_shape": ["B", 48, 5], "prefill_shape": ["N", 48, 3]}]


@pytest.mark.parametrize("edit, rebind, word", [
    (_state_shape, False, "edited after the export"),
    (_head_count, False, "edited after the export"),
    (_state_shape, True, "decode.onnx: input conv_state_0 has shape"),
    (_drop_output, True, "prefill.onnx: its outputs"),
    (_dtype, True, "decode.onnx: input input_ids is INT64"),
    (_state_entry, True, "state conv_state_0 has decode_shape"),
])
def test_an_edited_sidecar_is_refused_everywhere(good, tmp_path, capsys, edit, rebind, word):
    d = _copy(good, tmp_path)
    _edit(d, edit, rebind_sidecar=rebind)
    assert check_main([str(d)]) == ExitCode.LOAD
    assert word in _one_line(capsys.readouterr().err)
    with pytest.raises(LoadError, match=word.split(":")[-1].strip()):
        ExportFolder(d)
    r = _decode_loop(d, "--backend", "onnxruntime")
    assert r.returncode == ExitCode.LOAD and word in _one_line(r.stderr), r.stderr


def test_a_sidecar_without_checksums_is_refused(good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    _edit(d, lambda m: (m.pop("files"), m.pop("sidecar_sha256")), rebind_sidecar=False)
    assert check_main([str(d)]) == ExitCode.LOAD
    assert "lists no file checksums" in _one_line(capsys.readouterr().err)


def test_a_truncated_graph_is_exit_3_not_4(good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    data = (d / "prefill.onnx").read_bytes()
    (d / "prefill.onnx").write_bytes(data[: len(data) // 3])
    assert check_main([str(d)]) == ExitCode.LOAD
    assert "prefill.onnx" in _one_line(capsys.readouterr().err)
    r = _decode_loop(d, "--backend", "onnxruntime")
    assert r.returncode == ExitCode.LOAD and "prefill.onnx" in _one_line(r.stderr), r.stderr
    _edit(d, lambda m: m["files"]["prefill.onnx"].update(md.file_digest(d / "prefill.onnx")), rebind_sidecar=True)
    assert check_main([str(d)]) == ExitCode.LOAD            # sizes and hashes agree now: the ONNX read catches it
    line = _one_line(capsys.readouterr().err)
    assert "prefill.onnx: not a readable ONNX model" in line or "prefill.onnx: its inputs" in line, line


def test_same_size_change_is_caught_by_gdn_check_hashes(good, tmp_path, capsys):
    """Loading to run compares sizes (cheap); gdn-check compares every sha256."""
    d = _copy(good, tmp_path)
    ref = d / "decode_reference.json"
    text = ref.read_text()
    i = next(i for i, c in enumerate(text) if c.isdigit() and c not in "09")
    ref.write_text(text[:i] + str(int(text[i]) + 1) + text[i + 1:])
    assert ref.stat().st_size == (good / "decode_reference.json").stat().st_size
    ExportFolder(d)                                          # same sizes: runs
    assert check_main([str(d)]) == ExitCode.LOAD
    assert "decode_reference.json: its sha256 differs" in _one_line(capsys.readouterr().err)


def test_a_foreign_graph_file_is_refused(good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    shutil.copyfile(d / "decode.onnx", d / "prefill.onnx")
    assert check_main([str(d)]) == ExitCode.LOAD
    assert "prefill.onnx" in _one_line(capsys.readouterr().err)


def test_gdn_build_onnx_only_keeps_the_folder_bound(good, tmp_path, capsys):
    from gdn_deploy.plugins.build_cli import main as build_main
    d = _copy(good, tmp_path)
    (d / "prefill.trt.onnx").unlink()
    _edit(d, lambda m: (m["files"].pop("prefill.trt.onnx"), m["graphs"]["prefill"].pop("tensorrt_file")),
          rebind_sidecar=True)
    assert build_main([str(d), "--onnx-only"]) == 0, capsys.readouterr().err
    meta = md.read_metadata(d)
    assert meta["graphs"]["prefill"]["tensorrt_file"] == "prefill.trt.onnx"
    assert verify_folder(d, meta, hashes=True) == len(meta["files"])
    (d / "decode.onnx").write_bytes(b"x")
    assert build_main([str(d), "--onnx-only"]) == ExitCode.LOAD
    assert "decode.onnx: 1 bytes" in capsys.readouterr().err


# ---- output paths: checked before any work ----------------------------------------------------------------
def test_output_that_is_a_file_is_a_usage_error_before_loading(tmp_path, capsys):
    f = tmp_path / "out.txt"
    f.write_text("mine")
    # the model does not exist: the output is checked first, so the error names -o
    assert export_main([str(tmp_path / "missing.pt"), "-o", str(f)]) == ExitCode.USAGE
    assert "-o" in _one_line(capsys.readouterr().err) and f.read_text() == "mine"
    assert export_main([str(tmp_path / "missing.pt"), "-o", str(f / "sub")]) == ExitCode.USAGE
    assert "not a folder" in _one_line(capsys.readouterr().err)


def test_output_folder_with_other_content_is_refused(tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    assert export_main(["default", "-o", str(d)]) == ExitCode.USAGE
    assert "neither empty nor an export folder" in _one_line(capsys.readouterr().err)
    assert (d / "notes.txt").read_text() == "keep"


def test_read_only_output_is_a_usage_error(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("running as root: permission bits do not stop root, nothing to refuse")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        for out in (ro / "new", ro):
            assert export_main(["default", "-o", str(out)]) == ExitCode.USAGE
            assert "cannot write" in _one_line(capsys.readouterr().err)
    finally:
        os.chmod(ro, 0o755)


# ---- atomic exports ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError("injected failure"), KeyboardInterrupt()])
def test_a_failed_export_leaves_the_old_folder_as_it_was(good, ckpt, tmp_path, monkeypatch, capsys, exc):
    from gdn_deploy.export import model_export
    d = _copy(good, tmp_path)
    before = _snapshot(d)
    calls = []

    def fail_on_second_graph(plan, target, path, opts, **kw):
        calls.append(plan.name)
        Path(path).write_bytes(b"half a graph")
        if len(calls) == 2:
            raise exc
        return 18
    monkeypatch.setattr(model_export, "_export_graph", fail_on_second_graph)
    monkeypatch.setattr(model_export, "write_tensorrt_onnx", lambda path: None)
    code = export_main([str(ckpt), "-o", str(d)])
    assert calls == ["prefill", "decode"]
    err = capsys.readouterr().err
    if isinstance(exc, KeyboardInterrupt):
        assert code == ExitCode.INTERRUPTED and _one_line(err) == "gdn-export: interrupted"
    else:
        assert code == ExitCode.EXPORT and "injected failure" in _one_line(err)
    assert _snapshot(d) == before
    assert _leftovers(tmp_path) == []
    assert check_main([str(d), "-q"]) == 0


def test_a_new_export_replaces_the_old_one_only_when_complete(good, ckpt, tmp_path, capsys):
    d = _copy(good, tmp_path)
    (d / "prefill.engine").write_bytes(b"an engine of the old graphs")
    assert export_main([str(ckpt), "-o", str(d), "--graphs", "decode", "--no-verify", "-q"]) == 0
    meta = md.read_metadata(d)
    assert list(meta["graphs"]) == ["decode"]
    assert sorted(p.name for p in d.iterdir()) == sorted([md.SIDECAR_NAME, *meta["files"]])
    assert not (d / "prefill.onnx").exists() and not (d / "prefill.engine").exists()
    assert _leftovers(tmp_path) == []
    # decode.onnx, decode.trt.onnx, weights.data, decode_inputs.json, decode_reference.json
    assert verify_folder(d, meta, hashes=True) == len(meta["files"]) == 5


# ---- bf16 on onnxruntime's CPU provider: checked for real, or NOT CHECKED (exit 9), never a silent PASS ----------
@pytest.fixture(scope="module")
def bf16(ckpt):
    out = ckpt.parent / "bf16"
    assert export_main([str(ckpt), "-o", str(out), "--precision", "bf16", "-q"]) == 0
    return out


def test_bf16_folder_is_checked_on_cpu_with_float32_arithmetic(bf16, capsys):
    assert check_main([str(bf16)]) == 0
    out = capsys.readouterr().out
    assert "gdn-check: PASS" in out and "float32 arithmetic" in out
    assert "skipped" not in out.replace("TensorRT: skipped", "")
    rows = [ln for ln in out.splitlines() if "max abs" in ln]
    assert len(rows) == 10 and all(ln.endswith("PASS") for ln in rows)        # logits + 4 states, both graphs


def test_bf16_folder_generates_with_onnxruntime_on_cpu(bf16):
    for backend in ("onnxruntime", "torch"):
        r = _decode_loop(bf16, "--backend", backend)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("->") == 3 and r.stderr == ""


def _no_kernel(*args, **kwargs):
    raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Expand(13)")


def test_a_check_no_runtime_could_run_is_not_checked_not_pass(bf16, ckpt, tmp_path, monkeypatch, capsys):
    """A runtime without the kernels (simulated: onnxruntime raising its NOT_IMPLEMENTED) checks nothing: gdn-check
    and gdn-export say NOT CHECKED / not checked and exit 9; the export's files are in place."""
    from gdn_deploy.export import verify
    monkeypatch.setattr(verify, "run_onnxruntime", _no_kernel)
    assert check_main([str(bf16)]) == ExitCode.NOT_CHECKED
    out = capsys.readouterr().out
    assert "gdn-check: NOT CHECKED" in out and "PASS" not in out and "Expand(13)" in out
    d = tmp_path / "unchecked"
    assert export_main([str(ckpt), "-o", str(d), "--precision", "bf16", "--graphs", "decode", "-q"]) == 9
    captured = capsys.readouterr()
    assert "gdn-export: not checked:" in _one_line(captured.err) and "PASS" not in captured.out
    assert verify_folder(d, md.read_metadata(d), hashes=True) == 5    # decode + .trt, weights.data, inputs, reference


def test_tiny_hf_model_in_bf16_exports_checks_and_generates_on_cpu(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests"))
    import hf_tiny_models
    hf = tmp_path / "hf"
    hf_tiny_models.save(hf_tiny_models.build("qwen3_5", torch.Generator().manual_seed(3)), hf)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "gdn_deploy.export.cli", str(hf), "-o", str(tmp_path / "o"),
                        "--precision", "bf16", "-q"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "check PASS" in r.stdout
    r = _decode_loop(tmp_path / "o", "--backend", "onnxruntime", "--ids", "1,2,3", "--ids", "5", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("->") == 2
