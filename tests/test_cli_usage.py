"""Command-line usage errors and small load errors are one line with the documented exit code (issue 31, items 7, 8):
every command's argparse errors (gdn-export, gdn-check, gdn-build, the spec tool, samples, benchmarks), every
benchmark's ``--help`` without a GPU, an empty ``model.pt``, a config.json whose model_type contradicts its
architectures, decode_loop's note when it falls back to demo prompts, and the quiet kernel build of test.sh.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / "benchmarks").glob("bench_*.py"))


def _run(args, tmp_path, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}   # --help must not need a GPU
    env.pop("GDN_DEBUG", None)
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=timeout)


def _one_line(r, code, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


BAD_OPTIONS = {
    "gdn-export --precision fp8": (["-m", "gdn_deploy.export.cli", "default", "--precision", "fp8"], "gdn-export",
                                   "invalid choice: 'fp8'"),
    "gdn-check --bogus": (["-m", "gdn_deploy.export.check_cli", "out", "--bogus"], "gdn-check", "--bogus"),
    "gdn-build --bogus": (["-m", "gdn_deploy.plugins.build_cli", "out", "--bogus"], "gdn-build", "--bogus"),
    "spec --bogus": (["-m", "gdn_deploy.spec", "--bogus"], "gdn_deploy.spec", "--bogus"),
    "decode_loop --backend foo": ([REPO / "samples" / "decode_loop.py", "--backend", "foo"], "decode_loop",
                                  "invalid choice: 'foo'"),
    "decode_loop -n": ([REPO / "samples" / "decode_loop.py", "-n"], "decode_loop", "expected one argument"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_argparse_errors_are_one_line_exit_2(case, tmp_path):
    args, prog, word = BAD_OPTIONS[case]
    line = _one_line(_run(args, tmp_path), 2, word, "--help")
    assert line.startswith(f"{prog}: error:") or line.startswith(f"python -m {prog}: error:"), line


def test_every_cli_module_parser_is_the_one_line_parser():
    """A new command cannot slip back to argparse's multi-line usage errors."""
    users = [p for d in ("gdn_deploy", "samples", "benchmarks") for p in (REPO / d).rglob("*.py")
             if "ArgumentParser(" in p.read_text() and p.name != "cli_util.py"]
    assert users == [], [str(p.relative_to(REPO)) for p in users]


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_help_and_bad_option_without_gpu(script, tmp_path):
    r = _run([script, "--help"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage:") and "Traceback" not in r.stderr, r.stderr[-2000:]
    _one_line(_run([script, "--no-such-option"], tmp_path), 2, f"{script.name}: error:")


@pytest.mark.parametrize("script", ["bench_timing_methods.py", "bench_prefill_variants.py", "bench_kernels.py"])
def test_gpu_benchmarks_without_gpu_say_so_in_one_line(script, tmp_path):
    if script == "bench_timing_methods.py":
        _one_line(_run([REPO / "benchmarks" / script, "9x9", "2"], tmp_path), 2, "cases must be among")
    r = _run([REPO / "benchmarks" / script], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "nothing to benchmark" in (r.stdout + r.stderr).lower()


def test_empty_model_pt_is_one_line_exit_3(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    _one_line(_run(["-m", "gdn_deploy.export.cli", tmp_path / "model.pt", "-o", tmp_path / "o", "-q"], tmp_path), 3,
              "gdn-export: cannot load:", "model.pt: the file is empty (0 bytes)")
    assert not (tmp_path / "o").exists()


def test_model_type_contradicting_architectures_is_named(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"], "model_type": "llama"}))
    _one_line(_run(["-m", "gdn_deploy.export.cli", hf, "-o", tmp_path / "o", "-q"], tmp_path), 3,
              "model_type 'llama' does not match architectures entry 'Qwen3_5ForCausalLM'")
    from gdn_deploy.lm.hf_config import config_from_hf_dict
    for mt in ("qwen3_5", "qwen3_5_text", None):   # both spellings of the family (or none) agree with the entry
        cfg = config_from_hf_dict({"architectures": ["Qwen3_5ForCausalLM"], "model_type": mt})
        assert cfg.family == "qwen3_5"
    with pytest.raises(ValueError, match="model_type 'qwen3_next' does not match architectures entry "
                                         "'Qwen3_5MoeForCausalLM' \\(expected model_type 'qwen3_5_moe' or "
                                         "'qwen3_5_moe_text'\\)"):
        config_from_hf_dict({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_next"})


def _decode_loop_module():
    spec = importlib.util.spec_from_file_location("decode_loop_cli_usage", REPO / "samples" / "decode_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_decode_loop_says_when_it_uses_demo_prompts(capsys):
    dl = _decode_loop_module()

    class NoText:
        has_text = False

    class Folder:
        vocab_size = 50
        path = "f"

    prompts, texts = dl.make_prompts(argparse.Namespace(prompts=None), NoText(), Folder())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(prompts) == 3 and len(err) == 1 and "no prompt given" in err[0] and "demo prompts" in err[0], err
    assert str(prompts[1]) in err[0]
    dl.make_prompts(argparse.Namespace(prompts=[("ids", "1,2")]), NoText(), Folder())
    assert capsys.readouterr().err == ""                   # given prompts: no note


def test_run_logged_is_quiet_on_success_and_shows_errors_on_failure(tmp_path):
    script = REPO / "scripts" / "run_logged.sh"
    noisy = "for i in $(seq 300); do echo \"ptxas info    : Used $i registers\"; done"
    r = subprocess.run(["bash", str(script), str(tmp_path / "b" / "ok.log"), "build", "bash", "-c", noisy],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.count("\n") == 1 and "build: ok" in r.stdout and "300 lines" in r.stdout, r.stdout
    assert (tmp_path / "b" / "ok.log").read_text().count("ptxas info") == 300
    failing = noisy + "; echo 'kernel.cu(12): error: identifier \"x\" is undefined'; " + noisy + "; exit 3"
    r = subprocess.run(["bash", str(script), str(tmp_path / "bad.log"), "build", "bash", "-c", failing],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stdout == ""
    assert "build: FAILED (exit 3)" in r.stderr and "error: identifier" in r.stderr
    assert len(r.stderr.splitlines()) < 40, r.stderr


def test_test_sh_builds_quietly_through_run_logged():
    text = (REPO / "scripts" / "test.sh").read_text()
    assert "scripts/run_logged.sh build/build_kernels.log" in text and "bash scripts/build_kernels.sh" in text
