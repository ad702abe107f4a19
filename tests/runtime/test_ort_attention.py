"""The attention forms onnxruntime sessions load (gdn_deploy/runtime/ort_attention.py): graphs whose
GroupQueryAttention takes its total sequence length from a host input the runtime computes ("host_total", caches in
place) and graphs with it expanded into ScatterND + Attention-23 ("expanded", caches exchanged between two buffers)
give the tokens, logits and states of the graphs as exported: generation with sequences leaving the batch,
continued prefill, states bound or passed as tensors; the files on disk stay as they are; the CUDA provider gets
the rewritten forms by default, the CPU provider the exported one."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_folder_states_close, prefill_then_continue, rel_err

pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.errors import UsageError  # noqa: E402
from gdn_deploy.export.integrity import verify_folder  # noqa: E402
from gdn_deploy.runtime.backends import OnnxRuntimeBackend, make_backend, onnxruntime_providers  # noqa: E402
from gdn_deploy.runtime.conversation import prefill  # noqa: E402
from gdn_deploy.runtime.generation import generate, state_holder  # noqa: E402
from gdn_deploy.export.onnx_functions import onnxruntime_has_linear_attention  # noqa: E402
from gdn_deploy.runtime.ort_attention import TOTAL_INPUT, default_form, default_prefill_body, host_total  # noqa: E402
from gdn_deploy.runtime.ort_binding import BoundStates  # noqa: E402
from gdn_deploy.spec import SPEC  # noqa: E402

_F32 = SPEC.kernel_tolerance("float32")

def _folder(family, tmp_path_factory):
    return tiny.exported_folder(family, tmp_path_factory, "ort_attention")


def _backends(folder, bind=True):
    """The graphs as exported, then each rewritten form, all on the CPU provider."""
    out = [make_backend("onnxruntime", folder, threads=1, bind_states=bind)]
    out += [OnnxRuntimeBackend(folder, threads=1, bind_states=bind, attention_form=f) for f in ("host_total", "expanded")]
    for be, form in zip(out, ("exported", "host_total", "expanded")):
        for g in ("prefill", "decode"):
            be._open(g)
        assert be.forms == {"prefill": form, "decode": form}
        assert (TOTAL_INPUT in [i.name for i in be.sessions["decode"].get_inputs()]) == (form == "host_total")
    return out


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "qwen3_5_moe"])
def test_forms_generate_as_exported(family, tmp_path_factory):
    """Ragged prompts (1, 6, 11, 65 tokens), one stopping at an eos id after its 3rd token (the batch shrinks):
    the same tokens, finish flags and prefill logits from every form, states bound (in place for host_total,
    exchanged for expanded) and passed as tensors."""
    folder, gen = _folder(family, tmp_path_factory)
    exported, total, expanded = _backends(folder)
    for be, in_place in ((exported, True), (total, True), (expanded, False)):
        holder = state_holder(folder, be)
        assert isinstance(holder, BoundStates) and holder.in_place == {"prefill": in_place, "decode": in_place}
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11, 65)]
    free = generate(folder, exported, prompts, 10, eos_token_ids=[])
    eos = free.tokens[1][2]
    runs = [generate(folder, be, prompts, 10, eos_token_ids=[eos])
            for be in (exported, total, expanded, *_backends(folder, bind=False)[1:])]
    for r in runs[1:]:
        assert r.tokens == runs[0].tokens and r.finished == runs[0].finished
        assert rel_err(r.prefill_logits, runs[0].prefill_logits) <= 1e-5
    assert runs[0].finished[1] and runs[0].decode_steps > 0
    verify_folder(folder.path, folder.meta, hashes=True)   # sessions loaded the graphs in memory: the files unchanged


@pytest.mark.skipif(not onnxruntime_has_linear_attention(), reason="no com.microsoft::LinearAttention here")
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "qwen3_5_moe"])
def test_linear_attention_prefill_generates_as_exported(family, tmp_path_factory):
    """The gdn prefill nodes loaded with the LinearAttention body (what the CUDA provider gets), here on the CPU
    provider's float32 kernel, beside the host_total attention: the exported graphs' tokens and prefill logits on
    ragged prompts (1, 6, 11, 65 tokens), and a continued prefill's logits and every state; the files unchanged.
    Two float32 algorithms of the same recurrence (onnxruntime's kernel, the chunked body): float32's kernel
    tolerance."""
    folder, gen = _folder(family, tmp_path_factory)
    exported = make_backend("onnxruntime", folder, threads=1)
    la = OnnxRuntimeBackend(folder, threads=1, attention_form="host_total", prefill_body="linear_attention")
    assert exported.prefill_bodies == {"prefill": "exported", "decode": "exported"}
    assert la.prefill_bodies == {"prefill": "linear_attention", "decode": "exported"}   # decode has no prefill node
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11, 65)]
    a, b = (generate(folder, be, prompts, 6, eos_token_ids=[]) for be in (exported, la))
    assert a.tokens == b.tokens and rel_err(b.prefill_logits, a.prefill_logits) <= _F32
    first = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (3, 70)]
    more = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (66, 1)]
    res = [prefill_then_continue(folder, be, state_holder(folder, be), first, more, 140) for be in (exported, la)]
    assert rel_err(res[1][0], res[0][0]) <= _F32
    assert_folder_states_close(folder, res[1][1], res[0][1], (69, 71), _F32)
    verify_folder(folder.path, folder.meta, hashes=True)


def test_host_total_values():
    """host_total: max(first position of each sequence) + the padded view's width in prefill, max + 1 in decode."""
    feed = {"positions": torch.tensor([4, 5, 6, 0, 9, 10]), "cu_seqlens": torch.tensor([0, 3, 4, 6], dtype=torch.int32),
            "pad_index": torch.zeros(3, 3, dtype=torch.long)}
    assert int(host_total(feed)) == 9 + 3 and host_total(feed).dtype == torch.int32
    assert int(host_total({"positions": torch.tensor([3, 17, 0])})) == 18


def test_forms_continue_prefill(tmp_path_factory):
    """A prefill of two sequences then a continued one (past lengths 3 and 7), bound: logits and every state equal
    the exported graphs' (caches on the written slots) in both rewritten forms; with the expanded form each call
    leaves the caches in the other buffer."""
    folder, gen = _folder("qwen3_next", tmp_path_factory)
    exported, total, expanded = _backends(folder)
    first = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (3, 7)]
    more = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (4, 2)]
    res = []
    for be in (exported, total, expanded):
        b = state_holder(folder, be)
        _, st = prefill(folder, be, first, capacity=12, holder=b)
        ptrs = {k: v.data_ptr() for k, v in b.current.items()}
        logits, st = prefill(folder, be, more, {k: v.clone() for k, v in st.items()}, [3, 7], holder=b)
        if be is expanded:
            moved = [s for s in folder.states if b.current[s.decode_input].data_ptr() != ptrs[s.decode_input]]
            assert {s.kind for s in moved} == {s.kind for s in folder.states}   # caches and GDN states alike
        res.append((logits, {k: v.clone() for k, v in st.items()}))
    for got in res[1:]:
        assert rel_err(got[0], res[0][0]) <= 1e-5
        assert_folder_states_close(folder, got[1], res[0][1], (7, 9), 1e-5)


def test_form_by_provider_and_devices():
    """The CUDA provider (by name or with options) gets host_total for prefill/decode and expanded for other
    graphs, the CPU provider the exported form; onnxruntime's device names: cpu, cuda (only with a CUDA provider
    present), nothing else."""
    assert default_form(["CPUExecutionProvider"], "prefill") == "exported"
    assert default_form(["CUDAExecutionProvider", "CPUExecutionProvider"], "decode") == "host_total"
    assert default_form([("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"], "verify") == "expanded"
    assert default_prefill_body(["CPUExecutionProvider"]) == "exported"
    assert default_prefill_body([("CUDAExecutionProvider", {})]) == (
        "linear_attention" if onnxruntime_has_linear_attention() else "exported")
    assert onnxruntime_providers("cpu") == ("CPUExecutionProvider",)
    with pytest.raises(UsageError, match="cpu or cuda"):
        onnxruntime_providers("tpu")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert onnxruntime_providers("cuda")[0] == "CUDAExecutionProvider"
    else:
        with pytest.raises(UsageError, match="onnxruntime-gpu"):
            onnxruntime_providers("cuda")


_CUDA_PROVIDER = "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available()


@pytest.mark.skipif(not _CUDA_PROVIDER, reason="needs onnxruntime-gpu (CUDAExecutionProvider) and a CUDA GPU")
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_cuda_provider_generation_equals_cpu(family, tmp_path_factory):
    """onnxruntime's CUDA provider (host_total attention, states bound on the GPU, caches in place) gives the CPU
    provider's tokens and prefill logits on ragged prompts (float32 graphs, TF32 off), including a continued
    prefill. The MoE family's tolerance is wider: the CUDA provider's com.microsoft::MoE kernel was measured 1.7e-3
    from the CPU provider in float32 (same tokens)."""
    folder, gen = _folder(family, tmp_path_factory)
    cpu = make_backend("onnxruntime", folder)
    gpu = make_backend("onnxruntime", folder, device="cuda")
    tol = 5e-3 if family == "qwen3_5_moe" else 1e-4
    assert gpu.forms == {"prefill": "host_total", "decode": "host_total"}
    assert gpu.prefill_bodies == {"prefill": "linear_attention", "decode": "exported"}
    assert all(sess.get_providers()[0] == "CUDAExecutionProvider" for sess in gpu.sessions.values())
    holder = state_holder(folder, gpu)
    assert isinstance(holder, BoundStates) and holder.device.type == "cuda"
    assert holder.in_place == {"prefill": True, "decode": True}
    prompts = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (1, 6, 11, 65)]
    a, b = (generate(folder, be, prompts, 8, eos_token_ids=[]) for be in (cpu, gpu))
    assert a.tokens == b.tokens
    assert rel_err(b.prefill_logits, a.prefill_logits) <= tol
    first = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (5,)]
    more = [torch.randint(0, 96, (L,), generator=gen).tolist() for L in (9,)]
    res = [prefill_then_continue(folder, be, state_holder(folder, be), first, more, 16)[0].float().cpu()
           for be in (cpu, gpu)]
    assert rel_err(res[1], res[0]) <= tol
