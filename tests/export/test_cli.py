"""gdn-export CLI: exit codes, one-line errors, outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from gdn_deploy.checkpoint import save_checkpoint  # noqa: E402
from gdn_deploy.export.cli import main  # noqa: E402
from gdn_deploy.model import GDNConfig, GDNLM  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _tiny_lm(seed=0):
    torch.manual_seed(seed)
    lm = GDNLM(GDNConfig(hidden_size=16, num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8, vocab_size=40,
                         num_layers=1, intermediate_size=24))
    lm.reset_parameters()
    return lm.eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(_tiny_lm(), d / "tiny.pt")


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, code_word: str):
    lines = [l for l in err.strip().splitlines() if l.startswith("gdn-export")]
    assert len(lines) == 1, err
    assert code_word in lines[0], err
    assert "Traceback" not in err


def test_help_has_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for text in ("examples:", "exit codes (the same for every gdn-deploy command)", "--allow-pickle", "UNSAFE",
                 "--precision", "--max-tokens", "default", "float32"):
        assert text in out, text


def test_missing_file_is_exit_2(tmp_path, capsys):
    code, _, err = _run(capsys, str(tmp_path / "nope.pt"), "-o", str(tmp_path / "o"))
    assert code == 2
    _one_line_error(err, "no such file")


def test_garbage_file_is_exit_3(tmp_path, capsys):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(os.urandom(300))
    code, _, err = _run(capsys, str(bad), "-o", str(tmp_path / "o"))
    assert code == 3
    _one_line_error(err, "cannot load")
    assert "garbage.pt: not a readable torch checkpoint" in err and "pickle" not in err   # not "pass --allow-pickle"
    code, _, err = _run(capsys, str(bad), "--allow-pickle", "-o", str(tmp_path / "o"))
    assert code == 3                                   # the load-failure code, with the file name
    _one_line_error(err, "garbage.pt: not a readable torch checkpoint")
    bad_st = tmp_path / "garbage.safetensors"
    bad_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    code, _, err = _run(capsys, str(bad_st), "-o", str(tmp_path / "o"))
    assert code == 3
    _one_line_error(err, "garbage.safetensors")


def test_pickle_needs_opt_in(tmp_path, capsys):
    pkl = tmp_path / "whole_module.pt"
    torch.save(_tiny_lm(), pkl)                      # a whole pickled nn.Module
    code, _, err = _run(capsys, str(pkl), "-o", str(tmp_path / "o"), "--graphs", "decode")
    assert code == 3
    _one_line_error(err, "--allow-pickle")
    assert not (tmp_path / "o" / "decode.onnx").exists()
    # opted in; --layer 0 also takes the block of layer 0 out of the LM
    code, out, err = _run(capsys, str(pkl), "--allow-pickle", "--layer", "0", "-o", str(tmp_path / "o"),
                          "--graphs", "decode")
    assert code == 0, err
    assert (tmp_path / "o" / "decode.onnx").is_file()
    meta = json.loads((tmp_path / "o" / "gdn_model.json").read_text())
    assert meta["model"]["kind"] == "block" and meta["source"]["allow_pickle"] is True
    assert [t["name"] for t in meta["graphs"]["decode"]["inputs"]] == ["x", "conv_state_0", "rec_state_0"]


def test_bad_precision_is_exit_2(ckpt, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(ckpt), "-o", str(tmp_path / "o"), "--precision", "fp64"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fp64'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,word", [
    (["--graphs", "prefill,everything"], "--graphs"),
    (["--max-seqs", "0"], "--max-seqs"),
    (["--layer", "7"], "--layer 7"),
])
def test_bad_options_are_exit_2(ckpt, tmp_path, capsys, argv, word):
    code, _, err = _run(capsys, str(ckpt), "-o", str(tmp_path / "o"), *argv)
    assert code == 2
    _one_line_error(err, word)


def test_export_verify_summary_and_sidecar(ckpt, tmp_path, capsys):
    out_dir = tmp_path / "o"
    code, out, err = _run(capsys, str(ckpt), "-o", str(out_dir), "--graphs", "decode", "--max-seqs", "16")
    assert code == 0, err
    for text in ("loading", "exporting graph decode", "checking the files", "writing",
                 "decode.onnx (+ *.trt.onnx for TensorRT) gdn_model.json + reference files; check PASS"):
        assert text in out, (text, out)
    meta = json.loads((out_dir / "gdn_model.json").read_text())
    assert meta["profiles"]["decode"]["input_ids"]["max"] == [16]
    assert (out_dir / meta["source"]["model"]).resolve() == ckpt.resolve()   # relative to the export folder
    assert len(meta["config_hash"]) == 64


def test_hf_folder(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                          linear_value_head_dim=8, num_hidden_layers=2,
                          layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
                          num_key_value_heads=1, head_dim=8, intermediate_size=32, moe_intermediate_size=16,
                          num_experts=2, num_experts_per_tok=1, vocab_size=32)
    torch.manual_seed(0)
    Qwen3NextForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    assert transformers is not None
    code, out, err = _run(capsys, str(tmp_path / "hf"), "-o", str(tmp_path / "o"), "--graphs", "decode", "--blocks")
    assert code == 0, err
    meta = json.loads((tmp_path / "o" / "gdn_model.json").read_text())
    assert meta["source"]["format"] == "hf" and meta["source"]["layer"] == 0 and meta["model"]["kind"] == "block"
    assert meta["model"]["heads"]["gva_ratio"] == 2
    code, out, err = _run(capsys, str(tmp_path / "hf"), "-o", str(tmp_path / "whole"))   # default: the whole LM
    assert code == 0, err
    meta = json.loads((tmp_path / "whole" / "gdn_model.json").read_text())
    assert meta["model"]["kind"] == "hybrid" and meta["model"]["layer_types"] == ["linear_attention", "full_attention"]
    code, _, err = _run(capsys, str(tmp_path / "hf"), "--layer", "1", "-o", str(tmp_path / "o1"))
    assert code == 2 and "not a Gated DeltaNet layer" in err


def test_debug_env_shows_traceback(tmp_path):
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"not a checkpoint")
    env = {**os.environ, "GDN_DEBUG": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "gdn_deploy.export.cli", str(bad), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 3
    assert "Traceback" in r.stderr


def test_quiet_is_quiet_and_default_shows_no_library_warnings(tmp_path):
    """-q prints only the summary; without -q the output has our progress lines but none of the torch /
    onnxscript warnings a user cannot act on (torchvision missing, LeafSpec, unused axis names)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "gdn_deploy.export.cli", "default", "--graphs", "decode"]
    r = subprocess.run(cmd + ["-o", str(tmp_path / "q"), "-q"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert [ln.split(":")[0] for ln in r.stdout.strip().splitlines()] == ["gdn-export", "gdn-export"], r.stdout
    r = subprocess.run(cmd + ["-o", str(tmp_path / "v")], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    for noise in ("torchvision", "LeafSpec", "will not be used", "Warning"):
        assert noise not in r.stdout + r.stderr, (noise, r.stderr[-2000:])
    assert "exporting graph decode" in r.stdout
