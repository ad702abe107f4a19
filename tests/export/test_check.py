"""gdn-check: Polygraphy comparison PyTorch vs onnxruntime (TensorRT skipped without the module)."""
from __future__ import annotations

import importlib.util
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
from gdn_deploy.model import GDNConfig, GDNLM  # noqa: E402

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    torch.manual_seed(0)
    lm = GDNLM(GDNConfig(hidden_size=16, num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, vocab_size=40,
                         num_layers=2, intermediate_size=24))          # GVA ratio 1 (the other tests: 2 and 4)
    lm.reset_parameters()
    ckpt = save_checkpoint(lm.eval(), d / "tiny.pt")
    out = d / "onnx"
    assert export_main([str(ckpt), "-o", str(out), "--no-verify", "-q"]) == 0
    return out


def test_check_passes_on_a_good_export(export_dir, capsys):
    code = check_main([str(export_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gdn-check: PASS" in out
    assert out.count("PASS") >= 10 and "FAIL" not in out          # one line per output, both graphs
    assert "max abs" in out and "mean abs" in out and "max rel" in out
    if not HAVE_TRT:
        assert "TensorRT: skipped (the tensorrt Python module is not installed)" in out
    for f in ("inputs.json", "torch_outputs.json", "decode_inputs.json", "decode_torch_outputs.json"):
        assert (export_dir / f).is_file(), f


def test_plain_polygraphy_reuses_the_saved_files(export_dir, capsys):
    if not (export_dir / "inputs.json").is_file():
        assert check_main([str(export_dir)]) == 0
        capsys.readouterr()
    exe = shutil.which("polygraphy")
    if exe is None:
        pytest.skip("the polygraphy command is not on PATH")
    cmd = [exe, "run", str(export_dir / "prefill.onnx"), "--onnxrt",
           "--load-inputs", str(export_dir / "inputs.json"),
           "--load-outputs", str(export_dir / "torch_outputs.json"),
           "--atol", "1e-4", "--rtol", "1e-3"]
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
    bad = tmp_path / "bad"
    shutil.copytree(export_dir, bad)
    _corrupt_largest_weight(bad / "prefill.onnx")
    code = check_main([str(bad), "--graphs", "prefill"])
    out = capsys.readouterr().out
    assert code == 5, out
    assert "FAIL" in out and "gdn-check: FAIL" in out


def test_check_errors(tmp_path, capsys):
    assert check_main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err
    (tmp_path / "gdn_model.json").write_text("{broken")
    assert check_main([str(tmp_path)]) == 2
    assert "not readable JSON" in capsys.readouterr().err


def test_help_documents_the_trt_workflow(capsys):
    with pytest.raises(SystemExit):
        check_main(["--help"])
    out = capsys.readouterr().out
    assert "--trt --onnxrt --plugins" in out and "--load-outputs" in out
