"""decode_loop on the decode engine (--engine on) on the CPU, where the engine runs eagerly: greedy tokens equal
HF's and the per-step loop's, seeded sampling with every filter, per-prompt budgets, streaming and stop strings give
the per-step loop's results, and the flag's bad uses end in one line. (On a GPU, where --engine auto picks the
graphed engine: tests/kernels/test_decode_loop_engine_gpu.py.)"""
from __future__ import annotations

import pytest

from conftest import seed_for

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from decode_loop_engine_util import make_export, result_lines, run, streamed  # noqa: E402

SAMPLING = ["--temperature", "1.3", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.01", "--repetition-penalty",
            "1.1", "--seed", "7"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return make_export(tmp_path_factory.mktemp("engine_cli"), seed_for("decode_loop_engine::cpu"))


def test_engine_greedy_equals_hf_and_loop(export, capsys):
    hf_dir, out = export
    argv = ["--model", out, "-p", "w1 w2 w3", "--ids", "4,5,6,7,8,9,10,11", "--ids", "3", "-n", "9,4,12",
            "--ignore-eos"]
    code, text, err = run(capsys, *argv, "--engine", "on", "--compare", "--hf", hf_dir)
    assert code == 0, err
    assert "decoding on the engine (eager)" in text
    assert "compare: torch and Hugging Face transformers generated the same tokens" in text
    code, loop, err = run(capsys, *argv, "--engine", "off")
    assert code == 0, err
    assert "decoding on the engine" not in loop
    assert result_lines(text) == result_lines(loop)
    assert [len(eval(ln.split(" -> ")[1])) for ln in result_lines(text) if ln.startswith("[")] == [9, 4, 12]


def test_engine_sampling_stream_stop_equal_loop(export, capsys):
    _, out = export
    argv = ["--model", out, "-p", "w1 w2 w3", "-p", "w5", "-n", "14,6", "--ignore-eos", *SAMPLING]
    code, eng, err = run(capsys, *argv, "--engine", "on")
    assert code == 0, err
    code, loop, err = run(capsys, *argv, "--engine", "off")
    assert code == 0, err
    assert result_lines(eng) == result_lines(loop) and "seed: 7" in eng
    texts = [eval(ln.split("text: ", 1)[1]) for ln in result_lines(eng) if ln.startswith("    text:")]
    code, text, err = run(capsys, *argv, "--engine", "on", "--stream")
    assert code == 0, err
    assert [streamed(text, 0), streamed(text, 1)] == texts
    words = texts[0].split()
    stop = " ".join(words[3:5])
    code, text, err = run(capsys, *argv, "--engine", "on", "--stop", stop)
    assert code == 0, err
    assert next(ln for ln in text.splitlines() if ln.startswith("[0] prompt")).endswith("(stop string)")
    assert f"    text: {texts[0][:texts[0].index(stop)]!r}" in text
    assert f"    text: {texts[1]!r}" in text or stop in texts[1]


def test_engine_flag_errors(export, capsys):
    _, out = export
    for extra, msg in ((["--engine", "on", "--backend", "onnxruntime"], "--engine on runs the torch backend's model"),
                       (["--engine", "fused", "--speculative", "ngram"], "--speculative runs on the unfused engine"),
                       (["--engine", "on", "--speculative", "mtp"], "--speculative mtp does not run on the decode")):
        code, text, err = run(capsys, "--model", out, "--ids", "1,2", "-n", 2, *extra)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    code, text, err = run(capsys, "--model", out, "--ids", "1,2", "-n", 2, "--engine", "fused")
    assert code == 2 and "--engine fused: the fused step runs on CUDA" in err and len(err.strip().splitlines()) == 1


def test_engine_speculative_ngram_equals_loop(export, capsys):
    """--speculative ngram with the engine on (eager on the CPU): the plain per-step loop's greedy tokens, a
    budget cut inside an accepted run (-n 7 with K = 3)."""
    _, out = export
    argv = ["--model", out, "--ids", "4,5,6,4,5,6,4", "--ids", "3", "-n", "7", "--ignore-eos"]
    code, spec, err = run(capsys, *argv, "--engine", "on", "--speculative", "ngram", "--draft-tokens", 3,
                          "--compare")
    assert code == 0, err
    assert "decoding on the engine (eager)" in spec and "speculative (ngram, K=3): acceptance rate" in spec
    assert "compare: torch and PyTorch generated the same tokens" in spec
    code, loop, err = run(capsys, *argv, "--engine", "off")
    assert code == 0, err
    assert result_lines(spec) == result_lines(loop)
