"""Shared by tests/runtime/test_decode_loop_engine.py (CPU) and tests/kernels/test_decode_loop_engine_gpu.py: a tiny
HF folder with a word-level tokenizer.json, its export made by decode_loop, and decode_loop's main."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import hf_tiny_models as tiny

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("decode_loop_engine_cli", REPO / "samples" / "decode_loop.py")
decode_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_loop)


def make_export(root: Path, seed: int, gpu: bool = False, family: str = "qwen3_5") -> tuple[Path, Path]:
    """(hf folder, export folder) of a tiny random model with a tokenizer of words w0, w1, ... (one per id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    hf = tiny.build(family, torch.Generator().manual_seed(seed), gpu=gpu, **tiny.EPS_CONDITIONED)
    tiny.save(hf, root / "hf")
    vocab = hf.config.vocab_size
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "hf" / "tokenizer.json"))
    code = decode_loop.main(["--model", str(root / "hf"), "--export-dir", str(root / "out"), "--ids", "1", "-n", "1",
                             "-q"])
    assert code == 0
    return root / "hf", root / "out"


def run(capsys, *argv):
    code = decode_loop.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def result_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("[") or ln.startswith("    text:")]


def streamed(text: str, i: int) -> str:
    return "".join(eval(ln.split(" +", 1)[1]) for ln in text.splitlines() if ln.startswith(f"[{i}] +"))
