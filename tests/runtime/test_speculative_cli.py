"""samples/decode_loop.py --speculative on a tiny Qwen3.5 export: prompt lookup and MTP agree with plain greedy
decoding (--compare), acceptance is printed; MTP weights missing, onnxruntime on a folder exported without
--speculative and a bad K end in one line
with their exit codes."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
import hf_tiny_models as tiny  # noqa: E402
from test_speculative import write_mtp  # noqa: E402

from gdn_deploy.errors import ExitCode  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("decode_loop", REPO / "samples" / "decode_loop.py")
decode_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_loop)


def _run(capsys, *argv):
    code = decode_loop.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_decode_loop_speculative(tmp_path, gen, capsys):
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.lm.hf_folder import load_hf_causal_lm
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hf_dir, out = tmp_path / "hf", tmp_path / "out"
        tiny.save(tiny.build("qwen3_5", gen, **tiny.EPS_CONDITIONED), hf_dir)
        export_model(load_targets(str(hf_dir))[0], out, ExportOptions(verify=False))
        common = ["--model", out, "--ids", "3,4,5,3,4", "--ids", "7", "-n", 8, "--ignore-eos", "--compare"]
        code, text, err = _run(capsys, *common, "--speculative", "ngram", "--draft-tokens", 2)
        assert code == 0, err
        assert "speculative (ngram, K=2): acceptance rate" in text and "tokens per target call" in text
        assert "compare: torch and PyTorch generated the same tokens" in text
        code, text, err = _run(capsys, *common, "--speculative", "mtp")
        assert code == ExitCode.LOAD and err.count("\n") == 1 and "no mtp.* tensors" in err, err
        write_mtp(hf_dir, load_hf_causal_lm(hf_dir), gen, "dense")
        code, text, err = _run(capsys, *common, "--speculative", "mtp", "--draft-tokens", 3)
        assert code == 0, err
        assert "speculative (mtp, K=3)" in text and "generated the same tokens" in text
        code, _, err = _run(capsys, *common, "--speculative", "ngram", "--backend", "onnxruntime")
        assert code == ExitCode.USAGE and "no verify/commit graphs" in err and err.count("\n") == 1
        code, _, err = _run(capsys, *common, "--speculative", "ngram", "--draft-tokens", 0)
        assert code == ExitCode.USAGE and "draft tokens 0" in err and err.count("\n") == 1
    finally:
        torch.set_num_threads(n)
