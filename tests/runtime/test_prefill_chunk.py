"""Chunked prefill (gdn_deploy/runtime/chunked_prefill.py): prompts prefilled in pieces of at most N tokens, each
continuing from the states the previous piece left, give the one-call prefill's greedy tokens and last-token logits
(within fp32 tolerance) on onnxruntime and the torch backend; prompts that fit in one piece take the one-call path;
bad values and folders whose prefill does not continue are refused in one line."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import rel_err

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.errors import ExitCode, UsageError  # noqa: E402
from gdn_deploy.runtime import chunked_prefill  # noqa: E402
from gdn_deploy.runtime.backends import make_backend  # noqa: E402
from gdn_deploy.runtime.chunked_prefill import row_groups  # noqa: E402
from gdn_deploy.runtime.conversation import Conversation  # noqa: E402
from gdn_deploy.runtime.folder import ExportFolder  # noqa: E402
from gdn_deploy.runtime.generation import generate  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LENS = (1, 5, 17, 40)
TOL = SPEC.check_tolerance("float32")


def _folder(tmp_path_factory):
    """A tiny Qwen3.5 hybrid export (GroupQueryAttention in its onnxruntime graphs), once per session."""
    return tiny.exported_folder("qwen3_5", tmp_path_factory, "prefill_chunk", **tiny.EPS_CONDITIONED)


def _spy(monkeypatch):
    """Token counts of every call made by the piecewise path (empty when generate took the one-call path)."""
    calls: list[int] = []
    real = chunked_prefill.run_prefill

    def counted(holder, prompts, past):
        calls.append(sum(len(p) for p in prompts))
        return real(holder, prompts, past)
    monkeypatch.setattr(chunked_prefill, "run_prefill", counted)
    return calls


def _expected_calls(chunk):
    groups = row_groups(LENS, [0] * len(LENS), chunk)
    return sum(1 if len(g) > 1 else -(-LENS[g[0]] // chunk) for g in groups)


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_chunked_prefill_equals_one_call(backend, tmp_path_factory, monkeypatch):
    """Ragged prompts (1, 5, 17, 40 tokens), chunks of 1, 7, 16 and 64 tokens: the one-call run's greedy tokens,
    last-token logits within fp32 tolerance; no call over the chunk; every prompt token fed exactly once; a chunk
    larger than every prompt takes the one-call path (prefill_into not entered)."""
    folder, gen = _folder(tmp_path_factory)
    be = make_backend(backend, folder)
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in LENS]
    ref = generate(folder, be, prompts, 4, eos_token_ids=[])
    calls = _spy(monkeypatch)
    for chunk in (1, 7, 16, 64):
        calls.clear()
        got = generate(folder, be, prompts, 4, eos_token_ids=[], prefill_chunk=chunk)
        assert got.tokens == ref.tokens, chunk
        a, b = got.prefill_logits, ref.prefill_logits
        excess = float(((a - b).abs() - (TOL["atol"] + TOL["rtol"] * b.abs())).max())
        assert excess <= 0 and rel_err(a, b) <= TOL["rel"], (chunk, float((a - b).abs().max()))
        assert got.prefill_seconds > 0 and got.decode_steps == 3
        if chunk >= max(LENS):
            assert calls == []
        else:
            assert max(calls) <= chunk and sum(calls) == sum(LENS) and len(calls) == _expected_calls(chunk), calls


def test_row_groups():
    assert row_groups([1, 5, 17, 40], [0] * 4, 7) == [[0, 1], [2], [3]]
    assert row_groups([3, 3, 3, 1], [0] * 4, 6) == [[0, 1], [2, 3]]
    assert row_groups([3, 4, 2], [2, 0, 0], None) == [[0], [1, 2]]      # a row with a past runs alone
    assert row_groups([8, 1, 1], [0] * 3, 4) == [[0], [1, 2]]


def test_conversation_turns_in_pieces(tmp_path_factory):
    """Three Conversation turns (5, 1 and 23 tokens; onnxruntime) with prefill_chunk=4 give the replies and final
    states of the unchunked conversation."""
    folder, gen = _folder(tmp_path_factory)
    be = make_backend("onnxruntime", folder)
    chats = [Conversation(folder, be, eos_token_ids=[], prefill_chunk=c) for c in (None, 4)]
    for L in (5, 1, 23):
        turn = torch.randint(0, 96, (L,), generator=gen).tolist()
        assert chats[0].turn(turn, 3) == chats[1].turn(turn, 3), L
    n = len(chats[0].fed)
    for s in folder.states:
        a, b = chats[0].states[s.prefill_input], chats[1].states[s.prefill_input]
        if s.kind == "attention":
            a, b = a[:, :, :n], b[:, :, :n]
        assert rel_err(b, a) <= TOL["rel"], s.prefill_input


def test_bad_values_and_a_folder_that_does_not_continue(tmp_path_factory, monkeypatch):
    """0, negative, non-integer values: UsageError; a folder whose prefill starts from empty states (an earlier
    release's hybrid export, a pure-GDN LM; here the sidecar's answer is overridden, as rewriting a sidecar breaks
    its checksum): UsageError."""
    folder, _ = _folder(tmp_path_factory)
    be = make_backend("onnxruntime", folder)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UsageError, match=r"--prefill-chunk .*: expected an integer >= 1"):
            generate(folder, be, [[1, 2, 3]], 2, prefill_chunk=bad)
    with pytest.raises(UsageError, match="expected an integer >= 1"):
        Conversation(folder, be, prefill_chunk=0)
    monkeypatch.setattr(ExportFolder, "prefill_continues", property(lambda self: False))
    with pytest.raises(UsageError, match="^--prefill-chunk: the prefill graph of .* starts from empty states"):
        generate(folder, be, [[1, 2, 3]], 2, prefill_chunk=2)


def test_decode_loop_flag(tmp_path_factory, capsys):
    """decode_loop --prefill-chunk: generation in pieces equals the PyTorch one-call run (--compare); a bad value,
    or the flag with --speculative, ends in one line with the usage exit code."""
    folder, _ = _folder(tmp_path_factory)
    spec = importlib.util.spec_from_file_location("decode_loop", REPO / "samples" / "decode_loop.py")
    decode_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode_loop)
    code = decode_loop.main(["--model", str(folder.path), "--backend", "onnxruntime", "--ids", "3,1,4,1,5,9,2,6,5,3",
                             "--ids", "7", "-n", "3", "--ignore-eos", "--prefill-chunk", "4", "--compare"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "tokens (pieces of at most 4)" in out and "generated the same tokens" in out
    for extra, msg in ((["--prefill-chunk", "0"], "--prefill-chunk 0: expected an integer >= 1"),
                       (["--prefill-chunk", "2", "--speculative", "ngram"], "--prefill-chunk: --speculative")):
        code = decode_loop.main(["--model", str(folder.path), "--ids", "1,2,3", *extra])
        _, err = capsys.readouterr()
        assert code == ExitCode.USAGE and len(err.strip().splitlines()) == 1 and msg in err, err
