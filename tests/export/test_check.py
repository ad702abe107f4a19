"""gdn-check on export folders: self-contained, the same verdict as gdn-export's own check, plain Polygraphy."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from gdn_deploy.checkpoint import save_checkpoint  # noqa: E402
from gdn_deploy.export.check_cli import main as check_main  # noqa: E402
from gdn_deploy.export.cli import main as export_main  # noqa: E402
from gdn_deploy.export.metadata import read_metadata  # noqa: E402
from gdn_deploy.model import GDNConfig, GDNLM  # noqa: E402

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


def _lm():
    torch.manual_seed(0)
    lm = GDNLM(GDNConfig(hidden_size=16, num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, vocab_size=40,
                         num_layers=2, intermediate_size=24))          # GVA ratio 1 (the other tests: 2 and 4)
    lm.reset_parameters()
    return lm.eval()


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    ckpt = save_checkpoint(_lm(), d / "tiny.pt")
    out = d / "onnx"
    assert export_main([str(ckpt), "-o", str(out), "--no-verify", "-q"]) == 0
    return out


def test_export_folder_holds_its_check_files(export_dir):
    meta = read_metadata(export_dir)
    assert meta["source"]["model"] == "../tiny.pt"                  # relative: the folder can move with its model
    for g, info in meta["graphs"].items():
        c = info["check"]
        assert (c["inputs"], c["reference"]) == (f"{g}_inputs.json", f"{g}_reference.json")
        assert (export_dir / c["inputs"]).is_file() and (export_dir / c["reference"]).is_file()
        assert c["reference_dtype"] == "float32" and c["tolerance"] == {"atol": 1e-4, "rtol": 1e-3, "rel": 1e-4}


def test_check_passes_on_a_good_export(export_dir, capsys):
    code = check_main([str(export_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gdn-check: PASS" in out
    assert out.count("PASS") >= 10 and "FAIL" not in out          # one line per output, both graphs
    assert "max abs" in out and "norm rel" in out
    if not HAVE_TRT:
        assert "TensorRT: skipped (the tensorrt Python module is not installed)" in out


def test_a_copied_folder_is_checked_without_the_model(export_dir, tmp_path, capsys):
    copy = tmp_path / "elsewhere" / "export"
    shutil.copytree(export_dir, copy)          # ../tiny.pt does not exist next to the copy
    assert check_main([str(copy)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert check_main([str(copy), "--from-model"]) == 3          # the model is needed only for --from-model
    err = capsys.readouterr().err
    assert "tiny.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_from_model_rewrites_the_reference(export_dir, tmp_path, capsys):
    d = tmp_path / "export"
    shutil.copytree(export_dir, d)
    shutil.copy(export_dir.parent / "tiny.pt", tmp_path / "tiny.pt")
    before = (d / "prefill_inputs.json").read_bytes()
    assert check_main([str(d), "--from-model", "--seed", "7"]) == 0, capsys.readouterr().out
    assert (d / "prefill_inputs.json").read_bytes() != before      # a fresh feed, checked again


def test_plain_polygraphy_runs_right_after_an_export(export_dir):
    exe = shutil.which("polygraphy")
    if exe is None:
        pytest.skip("the polygraphy command is not on PATH")
    tol = read_metadata(export_dir)["graphs"]["prefill"]["check"]["tolerance"]
    cmd = [exe, "run", str(export_dir / "prefill.onnx"), "--onnxrt",
           "--load-inputs", str(export_dir / "prefill_inputs.json"),
           "--load-outputs", str(export_dir / "prefill_reference.json"),
           "--atol", str(tol["atol"]), "--rtol", str(tol["rtol"])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    assert "PASSED" in r.stdout + r.stderr


def _corrupt_largest_weight(path: Path) -> str:
    m = onnx.load(str(path))
    init = max((i for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT),
               key=lambda i: int(np.prod(i.dims)))
    arr = onnx.numpy_helper.to_array(init).copy()
    arr.reshape(-1)[: max(1, arr.size // 4)] += 0.5
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    onnx.save_model(m, str(path))
    return init.name


def test_check_fails_on_a_corrupted_weight(export_dir, tmp_path, capsys):
    from gdn_deploy.export.metadata import write_metadata
    bad = tmp_path / "bad"
    shutil.copytree(export_dir, bad)
    _corrupt_largest_weight(bad / "prefill.onnx")
    assert check_main([str(bad), "--graphs", "prefill"]) == 3     # the file no longer is the one the export wrote
    assert "prefill.onnx" in capsys.readouterr().err
    write_metadata(bad, read_metadata(bad))     # a consistent folder with a wrong weight: the numbers catch it
    code = check_main([str(bad), "--graphs", "prefill"])
    out = capsys.readouterr().out
    assert code == 5, out
    assert "FAIL" in out and "gdn-check: FAIL" in out


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_export_and_check_give_the_same_verdict(tmp_path, capsys, precision):
    """gdn-export's verification is gdn-check's check: same inputs, same float32 reference, same numbers."""
    out = tmp_path / precision
    assert export_main(["default", "-o", str(out), "--precision", precision]) == 0, capsys.readouterr().err
    export_lines = [ln for ln in capsys.readouterr().out.splitlines() if "max abs" in ln]
    assert check_main([str(out)]) == 0
    check_lines = [ln for ln in capsys.readouterr().out.splitlines() if "max abs" in ln]
    assert export_lines and export_lines == check_lines
    tol = read_metadata(out)["graphs"]["prefill"]["check"]["tolerance"]
    assert tol["rel"] == {"fp16": 2.0 ** -11 * 16, "fp32": 1e-4}[precision]


def test_check_errors(tmp_path, capsys):
    assert check_main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert check_main([str(tmp_path / "empty")]) == 2            # neither an export folder nor a model
    err = capsys.readouterr().err
    assert "not an export folder (no gdn_model.json) and not a model" in err and "config.json is missing" not in err
    (tmp_path / "gdn_model.json").write_text("{broken")
    assert check_main([str(tmp_path)]) == 3                       # an export folder that cannot be loaded
    assert "not readable JSON" in capsys.readouterr().err


def test_missing_reference_files_say_what_to_do(export_dir, tmp_path, capsys):
    d = tmp_path / "export"
    shutil.copytree(export_dir, d)
    (d / "decode_reference.json").unlink()
    assert check_main([str(d)]) == 3
    err = capsys.readouterr().err
    assert "decode_reference.json" in err and "--from-model" in err


def test_help_documents_plain_polygraphy(capsys):
    with pytest.raises(SystemExit):
        check_main(["--help"])
    out = capsys.readouterr().out
    assert "--load-inputs OUT/prefill_inputs.json" in out and "--load-outputs OUT/prefill_reference.json" in out
    assert "exit codes" in out and "--from-model" in out


def test_sidecar_is_valid_json_with_relative_files(export_dir):
    meta = json.loads((export_dir / "gdn_model.json").read_text())
    for info in meta["graphs"].values():
        assert not Path(info["file"]).is_absolute() and not Path(info["check"]["inputs"]).is_absolute()
