"""samples/decode_loop.py and the runtime on whole-model exports: text and id prompts, comparisons with PyTorch and
Hugging Face, sequences finishing at different times, and every bad input ending in one line and its exit code."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import seed_for

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.errors import ExitCode  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("decode_loop", REPO / "samples" / "decode_loop.py")
decode_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_loop)
_CACHE: dict = {}


def _write_tokenizer(folder: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def _hf_folder(tmp_path_factory, family="qwen3_5"):
    """A tiny HF folder (with a tokenizer.json) and its export (made by decode_loop itself), once per session."""
    if family not in _CACHE:
        root = tmp_path_factory.mktemp(f"decode_loop_{family}")
        gen = torch.Generator().manual_seed(seed_for(f"decode_loop::{family}"))
        hf = tiny.build(family, gen, **tiny.EPS_CONDITIONED)     # decode_loop's export check compares fp32 logits
        tiny.save(hf, root / "hf")
        _write_tokenizer(root / "hf", 96)
        _CACHE[family] = (hf, root / "hf", root / "out", gen)
    return _CACHE[family]


def _run(capsys, *argv):
    code = decode_loop.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_and_id_prompts_equal_hf(tmp_path_factory, capsys):
    hf, hf_dir, out, _ = _hf_folder(tmp_path_factory)
    code, text, err = _run(capsys, "--model", hf_dir, "--export-dir", out, "--backend", "onnxruntime",
                           "-p", "w1 w2 w3", "-p", "w5", "--ids", "4,5,6,7,8,9", "-n", 24, "--ignore-eos",
                           "--compare", "--hf", hf_dir)
    assert code == 0, err
    assert f"exporting {hf_dir} -> {out}" in text and (out / "tokenizer.json").is_file()
    assert "[0] prompt 'w1 w2 w3' -> [" in text and "text: 'w" in text and "[2] prompt [4, 5, 6, 7, 8, 9]" in text
    assert "compare: prefill last-token logits max |diff| vs Hugging Face transformers" in text
    assert "compare: onnxruntime and Hugging Face transformers generated the same tokens" in text
    # the folder is reused when it holds this model's export; the torch backend agrees
    code, text, err = _run(capsys, "--model", hf_dir, "--export-dir", out, "--ids", "1,2", "-n", 4, "--compare",
                           "--backend", "onnxruntime")
    assert code == 0, err
    assert f"using the existing export in {out} (same model)" in text and "generated the same tokens" in text


def test_sequences_finish_at_different_times(tmp_path_factory):
    """An eos id stops each sequence where it appears: the same tokens as HF generate with that eos."""
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.folder import ExportFolder
    from gdn_deploy.runtime.generation import generate
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    hf, hf_dir, _, gen = _hf_folder(tmp_path_factory, "qwen3_next")
    out = tmp_path_factory.mktemp("eos_export")
    export_model(load_targets(str(hf_dir))[0], out, ExportOptions(verify=False))
    folder = ExportFolder(out)
    be = make_backend("onnxruntime", folder)
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11)]
    free = generate(folder, be, prompts, 16, eos_token_ids=[]).tokens
    eos = free[0][3]                                     # prompt 0 stops at its 4th token (or earlier)
    res = generate(folder, be, prompts, 16, eos_token_ids=[eos])
    assert res.finished[0] and res.tokens[0] == free[0][:free[0].index(eos) + 1]
    assert len({len(t) for t in res.tokens}) > 1 or not all(res.finished), res.tokens
    hf.generation_config.eos_token_id = eos
    for p, got in zip(prompts, res.tokens):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=16, pad_token_id=eos,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long))[0, len(p):].tolist()
        if eos in want:
            want = want[:want.index(eos) + 1]
        assert got == want


def test_sampling_stream_and_stop_flags(tmp_path_factory, capsys):
    """Seeded sampling repeats; --stream prints the same text as the summary; --stop cuts that prompt only."""
    _, hf_dir, out, _ = _hf_folder(tmp_path_factory)
    if not (out / "gdn_model.json").is_file():
        assert _run(capsys, "--model", hf_dir, "--export-dir", out, "-n", 1)[0] == 0
    argv = ["--model", out, "-p", "w1 w2 w3", "-p", "w5", "-n", "12,6", "--ignore-eos", "--temperature", "1.2",
            "--top-k", "30", "--top-p", "0.9", "--min-p", "0.02", "--repetition-penalty", "1.1", "--seed", "5"]
    runs = [_run(capsys, *argv) for _ in range(2)]
    assert runs[0][0] == 0 and "seed: 5" in runs[0][1], runs[0][2]
    res = [ln for ln in runs[0][1].splitlines() if ln.startswith("[") or ln.startswith("    text:")]
    assert res == [ln for ln in runs[1][1].splitlines() if ln.startswith("[") or ln.startswith("    text:")]
    assert "tokens/s)" in runs[0][1]
    toks = [eval(ln.split(" -> ")[1]) for ln in res if ln.startswith("[")]
    assert [len(t) for t in toks] == [12, 6]
    texts = [eval(ln.split("text: ", 1)[1]) for ln in res if ln.startswith("    text:")]
    code, text, err = _run(capsys, *argv, "--stream")
    assert code == 0, err
    for i in range(2):
        pieces = [eval(ln.split(" +", 1)[1]) for ln in text.splitlines() if ln.startswith(f"[{i}] +")]
        assert "".join(pieces) == texts[i] and f"    text: {texts[i]!r}" in text
    words = texts[0].split()
    stop = " ".join(words[2:4])
    code, text, err = _run(capsys, *argv, "--stop", stop)
    assert code == 0, err
    assert f"    text: {texts[0][:texts[0].index(stop)]!r}" in text and "(stop string)" in text
    assert f"    text: {texts[1]!r}" in text or stop in texts[1]


def test_default_model_backends_agree(capsys, tmp_path):
    code, text, err = _run(capsys, "--export-dir", tmp_path / "d", "--backend", "onnxruntime", "-n", 6, "--compare")
    assert code == 0, err
    assert "lm model, backend onnxruntime, 3 prompt(s)" in text and "generated the same tokens" in text


# ---- bad inputs: one line on stderr, the documented exit code ------------------------------------------------
def _broken_folders(tmp_path, hf_dir):
    """name -> (argv, exit code, message part)."""
    bad = {}
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    bad["missing_model"] = (["--model", tmp_path / "nope"], ExitCode.USAGE, "no such file or folder")
    bad["corrupt_model"] = (["--model", tmp_path / "garbage.pt"], ExitCode.LOAD, "not a readable torch checkpoint")
    arch = tmp_path / "llama"
    arch.mkdir()
    (arch / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    bad["unsupported_architecture"] = (["--model", arch], ExitCode.LOAD, "architecture 'LlamaForCausalLM' is not "
                                                                        "supported")
    sharded = tmp_path / "sharded"
    torch.manual_seed(0)
    tiny.build("qwen3_5", torch.Generator().manual_seed(1)).save_pretrained(str(sharded), max_shard_size="40KB")
    sorted(sharded.glob("model-*.safetensors"))[0].unlink()
    bad["missing_shard"] = (["--model", sharded], ExitCode.LOAD, "named in model.safetensors.index.json are missing")
    wrong = tmp_path / "wrong_types"
    shutil.copytree(hf_dir, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["layer_types"][0], cfg["layer_types"][1] = "full_attention", "linear_attention"
    (wrong / "config.json").write_text(json.dumps(cfg))
    bad["layer_types_disagree"] = (["--model", wrong], ExitCode.LOAD, "layer_types says layer 0 is full_attention")
    return bad


def test_bad_inputs_end_in_one_line(tmp_path_factory, tmp_path, capsys):
    from gdn_deploy.export.cli import main as gdn_export
    _, hf_dir, out, _ = _hf_folder(tmp_path_factory)
    if not (out / "gdn_model.json").is_file():
        assert _run(capsys, "--model", hf_dir, "--export-dir", out, "-n", 1)[0] == 0
    cases = _broken_folders(tmp_path, hf_dir)
    cases["prompt_too_long"] = (["--model", out, "--ids", ",".join(["1"] * 250), "-n", 10], ExitCode.USAGE,
                                "250 tokens + 10 new exceed the model's position limit (max_position_embeddings=256)")
    cases["n_zero"] = (["--model", out, "-n", 0], ExitCode.USAGE, "-n/--max-new-tokens 0: expected an integer >= 1")
    cases["n_negative"] = (["--model", out, "-n", -5], ExitCode.USAGE, "-n/--max-new-tokens -5")
    cases["bad_ids"] = (["--model", out, "--ids", "1,x"], ExitCode.USAGE, "expected comma-separated integers")
    cases["id_outside_vocab"] = (["--model", out, "--ids", "1,500"], ExitCode.USAGE, "outside the vocabulary [0, 96)")
    cases["top_p_zero"] = (["--model", out, "--temperature", "1", "--top-p", "0"], ExitCode.USAGE, "--top-p 0.0")
    cases["compare_sampling"] = (["--model", out, "--temperature", "1", "--compare"], ExitCode.USAGE,
                                 "--compare checks greedy tokens")
    cases["budgets_per_prompt"] = (["--model", out, "--ids", "1", "-n", "3,4"], ExitCode.USAGE,
                                   "2 budgets given for 1 prompts")
    cases["hf_without_compare"] = (["--model", out, "--hf", hf_dir], ExitCode.USAGE, "--hf is used by --compare")
    cases["export_dir_of_another_model"] = (["--model", "default", "--export-dir", out], ExitCode.USAGE,
                                            "holds the export of another model than default")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    cases["export_dir_not_an_export"] = (["--model", hf_dir, "--export-dir", tmp_path / "junk"], ExitCode.USAGE,
                                         "exists and is not an export folder")
    incomplete = tmp_path / "incomplete"
    shutil.copytree(out, incomplete)
    (incomplete / "decode.onnx").unlink()
    cases["incomplete_export"] = (["--model", incomplete], ExitCode.LOAD, "incomplete export: decode.onnx missing")
    assert gdn_export([str(hf_dir), "--layer", "0", "-o", str(tmp_path / "block"), "--no-verify", "-q"]) == 0
    cases["block_export"] = (["--model", tmp_path / "block"], ExitCode.USAGE, "holds a single GDN block")
    assert gdn_export(["default", "--interop", "com.microsoft", "-o", str(tmp_path / "interop"), "--no-verify",
                       "-q"]) == 0
    cases["interop_ragged"] = (["--model", tmp_path / "interop", "--ids", "1,2,3", "--ids", "4", "--backend",
                                "onnxruntime"], ExitCode.USAGE, "needs sequences of equal length; got lengths 3, 1")
    capsys.readouterr()
    for name, (argv, want, part) in cases.items():
        code, _, err = _run(capsys, *argv)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert code == want, (name, code, err)
        assert len(lines) == 1 and lines[0].startswith("decode_loop: ") and part in lines[0], (name, err)


def test_interop_export_with_equal_lengths_runs(tmp_path, capsys):
    from gdn_deploy.export.cli import main as gdn_export
    assert gdn_export(["default", "--interop", "com.microsoft", "-o", str(tmp_path / "i"), "--no-verify", "-q"]) == 0
    capsys.readouterr()
    code, text, err = _run(capsys, "--model", tmp_path / "i", "--ids", "1,2,3", "--ids", "4,5,6", "--backend",
                           "onnxruntime", "-n", 4, "--compare")
    assert code == 0, err
    assert "generated the same tokens" in text


def test_chat_turns_continue_and_equal_hf(tmp_path_factory, capsys):
    """--chat: two turns of one conversation (text, then ids); the second turn's prefill continues from the first
    turn's states; each reply equals HF's greedy continuation of the whole conversation so far."""
    hf, hf_dir, out, _ = _hf_folder(tmp_path_factory)
    code, text, err = _run(capsys, "--model", hf_dir, "--export-dir", out, "--backend", "onnxruntime", "--chat",
                           "-p", "w1 w2 w3", "--ids", "7,8", "-n", 5, "--ignore-eos")
    assert code == 0, err
    replies = [json.loads(line.split(" -> ")[1]) for line in text.splitlines() if line.startswith("[turn ")]
    assert len(replies) == 2 and all(len(r) == 5 for r in replies)
    history = [1, 2, 3]
    hf.generation_config.eos_token_id = None
    for turn, reply in zip(([1, 2, 3], [7, 8]), replies):
        if turn != [1, 2, 3]:
            history += turn
        with torch.no_grad():
            want = hf.generate(torch.tensor([history]), do_sample=False, max_new_tokens=5,
                               attention_mask=torch.ones(1, len(history), dtype=torch.long))[0, len(history):]
        assert reply == want.tolist(), (history, reply, want.tolist())
        history += reply
    assert "conversation: 15 tokens, each fed once" in text
    code, _, err = _run(capsys, "--model", out, "--chat", "--ids", "1", "--compare")
    assert code == ExitCode.USAGE and err.strip().endswith("--chat: leave out --compare, --speculative, --stop and "
                                                           "--stream")
