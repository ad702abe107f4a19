"""decode_loop with --backend torch --device cuda: generation runs on the graphed decode engine by default (one CUDA
graph per batch bucket); its greedy tokens equal HF's and the per-step loop's (--engine off), seeded sampling with
every filter gives the loop's tokens, streaming and stop strings work through it."""
from __future__ import annotations

import pytest

from conftest import seed_for

pytest.importorskip("transformers", reason="needs transformers (pip install -e .[test])")
pytest.importorskip("tokenizers", reason="needs tokenizers (pip install -e .[test])")
pytest.importorskip("onnxruntime", reason="the export decode_loop makes checks its graphs with onnxruntime")
pytest.importorskip("polygraphy", reason="the export writes its reference files with polygraphy (pip install -e .)")
from decode_loop_engine_util import make_export, result_lines, run, streamed  # noqa: E402


@pytest.fixture(scope="module")
def export(kernels, tmp_path_factory):
    return make_export(tmp_path_factory.mktemp("engine_gpu_cli"), seed_for("decode_loop_engine::gpu"), gpu=True)


def test_cuda_default_engine_greedy_equals_hf_and_loop(export, capsys):
    hf_dir, out = export
    argv = ["--model", out, "--device", "cuda", "-p", "w1 w2 w3", "--ids", ",".join(str(i) for i in range(4, 70)),
            "--ids", "3", "-n", "20,5,33", "--ignore-eos"]
    code, text, err = run(capsys, *argv, "--compare", "--hf", hf_dir)
    assert code == 0, err
    assert "decoding on the engine (CUDA graphs per batch bucket)" in text
    assert "compare: torch and Hugging Face transformers generated the same tokens" in text
    code, loop, err = run(capsys, *argv, "--engine", "off")
    assert code == 0, err
    assert "decoding on the engine" not in loop and result_lines(text) == result_lines(loop)
    code, fused, err = run(capsys, *argv, "--engine", "fused", "--compare", "--hf", hf_dir)
    assert code == 0, err
    assert "(CUDA graphs per batch bucket, fused)" in fused and "generated the same tokens" in fused


def test_cuda_engine_sampling_stream_stop(export, capsys):
    _, out = export
    argv = ["--model", out, "--device", "cuda", "-p", "w1 w2 w3", "-p", "w5", "-p", "w9 w8", "-n", "24,6,11",
            "--ignore-eos", "--temperature", "1.3", "--top-k", "60", "--top-p", "0.95", "--min-p", "0.01",
            "--repetition-penalty", "1.1", "--seed", "3"]
    runs = [run(capsys, *argv) for _ in range(2)]
    assert all(c == 0 for c, _, _ in runs), runs[0][2]
    assert result_lines(runs[0][1]) == result_lines(runs[1][1])            # the seed reproduces on the graphs
    code, loop, err = run(capsys, *argv, "--engine", "off")
    assert code == 0, err
    assert result_lines(runs[0][1]) == result_lines(loop)
    texts = [eval(ln.split("text: ", 1)[1]) for ln in result_lines(loop) if ln.startswith("    text:")]
    code, text, err = run(capsys, *argv, "--stream")
    assert code == 0, err
    assert [streamed(text, i) for i in range(3)] == texts
    stop = " ".join(texts[0].split()[4:6])
    code, text, err = run(capsys, *argv, "--stop", stop)
    assert code == 0, err
    assert f"    text: {texts[0][:texts[0].index(stop)]!r}" in text
    assert next(ln for ln in text.splitlines() if ln.startswith("[0] prompt")).endswith("(stop string)")
