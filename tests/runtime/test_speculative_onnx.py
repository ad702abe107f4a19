"""Speculative decoding on onnxruntime from ``gdn-export --speculative`` folders, one export per family (tiny random
models; MTP heads of random weights where the family ships one):

- the export writes verify/commit (and draft with MTP weights), checked by gdn-export against float32 PyTorch like
  every graph, recorded and hashed in the sidecar, all graphs reading the one weights.data;
- the generated tokens equal plain greedy decoding (onnxruntime) on a ragged prompt batch with prompt-lookup drafts,
  MTP drafts and drafts forced right (acceptance 1.0, K + 1 tokens per call); an EOS inside an accepted run;
- a row with fewer drafts padded to the batch's L: its real tokens' logits and committed states do not change;
- decode_loop --backend onnxruntime --speculative prints the acceptance and agrees with PyTorch (--compare); MTP
  asked of a folder without a draft graph: one line, exit 3."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import rel_err, seed_for

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402
from test_speculative import one_thread, write_mtp  # noqa: E402,F401  (one_thread: autouse fixture)

from gdn_deploy.errors import ExitCode  # noqa: E402
from gdn_deploy.export import cli as export_cli  # noqa: E402
from gdn_deploy.export.integrity import verify_folder  # noqa: E402
from gdn_deploy.export.metadata import read_metadata  # noqa: E402
from gdn_deploy.lm.hf_folder import load_hf_causal_lm  # noqa: E402
from gdn_deploy.runtime.backends import make_backend  # noqa: E402
from gdn_deploy.runtime.folder import ExportFolder  # noqa: E402
from gdn_deploy.runtime.generation import generate  # noqa: E402
from gdn_deploy.runtime.speculative import NgramDrafter, OracleDrafter, speculative_generate  # noqa: E402
from gdn_deploy.runtime.speculative_folder import FolderTarget  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FAMILIES = {"qwen3_5": "dense", "qwen3_next": "moe", "qwen3_5_moe": "moe", "olmo_hybrid": None}   # MTP kind
_spec = importlib.util.spec_from_file_location("decode_loop", REPO / "samples" / "decode_loop.py")
decode_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_loop)


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request, tmp_path_factory):
    """(family, has MTP, export folder, onnxruntime backend): ``gdn-export HF --speculative`` with its check on."""
    family = request.param
    gen = torch.Generator().manual_seed(seed_for(f"speculative_onnx::{family}"))
    root = tmp_path_factory.mktemp(f"spec_{family}")
    hf, out = root / "hf", root / "out"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny.save(tiny.build(family, gen, **tiny.EPS_CONDITIONED), hf)
        if FAMILIES[family]:
            write_mtp(hf, load_hf_causal_lm(hf), gen, FAMILIES[family])
        code = export_cli.main([str(hf), "-o", str(out), "--speculative", "-q"])
    finally:
        torch.set_num_threads(n)
    assert code == ExitCode.OK
    folder = ExportFolder(out)
    return family, FAMILIES[family] is not None, folder, make_backend("onnxruntime", folder, threads=1)


def _prompts(folder, seed: int, lens=(1, 6, 11)):
    gen = torch.Generator().manual_seed(seed)
    V = folder.vocab_size
    out = [torch.randint(0, V, (n,), generator=gen).tolist() for n in lens]
    out[-1] = out[-1][:4] + out[-1][:4] + out[-1][8:]      # a repeated 4-gram: prompt lookup finds drafts
    return out


def test_export_writes_speculative_graphs(exported):
    family, mtp, folder, _ = exported
    meta = read_metadata(folder.path)
    want = ["verify", "commit"] + (["draft"] if mtp else [])
    assert meta["speculative"]["graphs"] == want and meta["speculative"]["draft"] == ("mtp" if mtp else None)
    assert list(meta["graphs"]) == ["prefill", "decode", *want]
    for g in want:
        info = meta["graphs"][g]
        assert info["file"] in meta["files"] and info["check"]["reference"] in meta["files"]
        # verify / commit get TensorRT-ready copies (their gdn nodes go to the plugins); the MTP draft graph has
        # no gdn node, so none
        want_trt = f"{g}.trt.onnx" if g != "draft" else None
        assert info.get("tensorrt_file") == want_trt and (want_trt is None or want_trt in meta["files"])
    verify_folder(folder.path, meta, hashes=True)
    assert [p.name for p in folder.path.glob("*.data")] == ["weights.data"]
    import onnx
    from gdn_deploy.onnx_nodes import tensorrt_ready_problems
    for g, op in (("verify", "GatedDeltaVerify"), ("commit", "GatedDeltaCommit")):
        model = onnx.load(str(folder.path / f"{g}.onnx"), load_external_data=False)
        n_gdn = len([t for t in meta["model"]["layer_types"] if t == "linear_attention"])
        assert [n.op_type for n in model.graph.node if n.domain == "gdn"].count(op) == n_gdn
        trt = onnx.load(str(folder.path / f"{g}.trt.onnx"), load_external_data=False)
        assert tensorrt_ready_problems(trt) == [] and tensorrt_ready_problems(model) != []
        assert [n.op_type for n in trt.graph.node if n.domain == "gdn"].count(op) == n_gdn
        assert not [f for f in trt.functions if f.domain == "gdn"]     # only the plugin can serve the nodes
    prefill_outs = [t["name"] for t in meta["graphs"]["prefill"]["outputs"]]
    assert ("hidden" in prefill_outs) == mtp
    if mtp:
        draft = onnx.load(str(folder.path / "draft.onnx"), load_external_data=False)
        locs = {e.value for t in draft.graph.initializer for e in t.external_data if e.key == "location"}
        assert locs == {"weights.data"}


def test_onnxruntime_speculative_equals_greedy(exported, seed):
    family, mtp, folder, ort = exported
    prompts = _prompts(folder, seed)
    n = 10
    want = generate(folder, ort, prompts, n, eos_token_ids=[]).tokens
    future = generate(folder, ort, prompts, n + 4, eos_token_ids=[]).tokens     # drafts forced right
    target = FolderTarget(folder, ort)
    runs = [("ngram", 2, NgramDrafter()), ("oracle", 1, OracleDrafter(future, prompts)),
            ("oracle", 3, OracleDrafter(future, prompts))]
    if mtp:
        from gdn_deploy.runtime.speculative import MTPDrafter
        from gdn_deploy.runtime.speculative_folder import FolderMTPRunner
        runs.append(("mtp", 3, MTPDrafter(FolderMTPRunner(folder, ort), max(map(len, prompts)) + n + 4)))
    for name, K, drafter in runs:
        res = speculative_generate(target, prompts, n, drafter, draft_tokens=K)
        assert res.tokens == want, (family, name, K)
        if name == "oracle":
            assert res.acceptance_rate == 1.0 and res.tokens_per_call == K + 1
            assert res.target_calls == -(-(n - 1) // (K + 1))
        assert 0.0 <= res.acceptance_rate <= 1.0


def test_eos_inside_an_accepted_run(exported, seed):
    family, _, folder, ort = exported
    prompts = _prompts(folder, seed, (4, 7, 2))
    free = generate(folder, ort, prompts, 12, eos_token_ids=[]).tokens
    eos = [free[1][5]]                       # stops prompt 1 at its 6th token (or earlier if the id came before)
    want = generate(folder, ort, prompts, 12, eos_token_ids=eos).tokens
    res = speculative_generate(FolderTarget(folder, ort), prompts, 12, OracleDrafter(free, prompts), draft_tokens=4,
                               eos_token_ids=eos)
    assert res.tokens == want and res.finished[1] and want[1][-1] == eos[0]


def test_padded_row_keeps_its_tokens(exported, seed):
    """Ragged drafts: row 0 verifies 2 real tokens padded to L = 5 with random ids; its logits at the real
    positions and its states after committing <= 2 equal those of a call with L = 2."""
    family, _, folder, ort = exported
    if family != "qwen3_5":
        pytest.skip("one family is enough for the graph-level padding check")
    gen = torch.Generator().manual_seed(seed)
    lens = [3, 5, 4]
    target = FolderTarget(folder, ort)
    ids = torch.randint(0, folder.vocab_size, (sum(lens),), generator=gen)
    cu = torch.tensor([0, 3, 8, 12], dtype=torch.int32)
    _, states, _ = target.prefill(ids, cu, 16)
    pos = torch.tensor(lens)
    real = torch.randint(0, folder.vocab_size, (3, 2), generator=gen)
    padded = torch.cat([real, torch.randint(0, folder.vocab_size, (3, 3), generator=gen)], dim=1)
    lg2, _, st2, pend2 = target.verify(real, pos, states)
    lg5, _, st5, pend5 = target.verify(padded, pos, states)
    assert rel_err(lg5[:, :2], lg2) < 1e-5
    acc = torch.tensor([2, 0, 1])
    a, b = target.commit(st2, pend2, 2, acc), target.commit(st5, pend5, 5, acc)
    for s in folder.states:
        if s.kind == "gdn":
            assert rel_err(b[s.decode_input], a[s.decode_input]) < 1e-5, s.decode_input
        else:   # rows' caches agree at the slots the next call reads (< pos + accepted)
            for r in range(3):
                keep = int(pos[r] + acc[r])
                assert rel_err(b[s.decode_input][r, :, :keep], a[s.decode_input][r, :, :keep]) < 1e-5


def test_decode_loop_onnxruntime(exported, capsys):
    family, mtp, folder, _ = exported
    common = ["--model", str(folder.path), "--backend", "onnxruntime", "--ids", "3,4,5,3,4", "--ids", "7", "-n", "8",
              "--ignore-eos", "--compare"]
    code = decode_loop.main([*common, "--speculative", "ngram", "--draft-tokens", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "speculative (ngram, K=2): acceptance rate" in out and "tokens per target call" in out
    assert "compare: onnxruntime and PyTorch generated the same tokens" in out
    code = decode_loop.main([*common, "--speculative", "mtp"])
    out, err = capsys.readouterr()
    if mtp:
        assert code == 0, err
        assert "speculative (mtp, K=3)" in out and "generated the same tokens" in out
    else:
        assert code == ExitCode.LOAD and err.count("\n") == 1 and "no draft graph" in err, err
