"""gdn-check --device cuda: the graphs run on onnxruntime's CUDA provider as the runtime loads them (its backend,
with the in-memory attention and prefill-body forms), compared with the folder's float32 reference like the CPU
check; without onnxruntime-gpu it is one usage line before any work."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("polygraphy")
ort = pytest.importorskip("onnxruntime")
import hf_tiny_models as tiny  # noqa: E402

from gdn_deploy.errors import LoadError, missing_kernel  # noqa: E402
from gdn_deploy.export.check_cli import main as check_main  # noqa: E402
from gdn_deploy.runtime import backends  # noqa: E402

_CUDA_PROVIDER = "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available()


def _folder(tmp_path_factory, capsys):
    d = tiny.exported_folder("qwen3_5", tmp_path_factory, "check_device")[0].path
    capsys.readouterr()                       # the tiny model's build output is not gdn-check's
    return d


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="this onnxruntime has the CUDA provider: the usage error does not apply")
def test_device_cuda_without_the_provider_is_one_usage_line(tmp_path_factory, capsys):
    d = _folder(tmp_path_factory, capsys)
    assert check_main([str(d), "--device", "cuda"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "CUDAExecutionProvider" in err[0] and "onnxruntime-gpu" in err[0], cap.err
    assert "Traceback" not in cap.err and "verifying" not in cap.out       # nothing was checked before it


def test_device_cuda_checks_what_the_runtime_backend_computes(tmp_path_factory, monkeypatch, capsys):
    """The CUDA path with the CPU provider standing in for the CUDA one: every graph goes through the runtime's
    backend (counted), passes against the float32 reference, and a perturbed output fails (exit 5)."""
    d = _folder(tmp_path_factory, capsys)
    monkeypatch.setattr(backends, "onnxruntime_providers", lambda device: ("CPUExecutionProvider",))
    calls = []
    run = backends.OnnxRuntimeBackend.run

    def counted(self, graph, feed):
        calls.append(graph)
        return run(self, graph, feed)
    monkeypatch.setattr(backends.OnnxRuntimeBackend, "run", counted)
    code = check_main([str(d), "--device", "cuda"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert sorted(calls) == ["decode", "prefill"] and "[CUDA provider, as the runtime loads the graphs]" in out
    assert "gdn-check: PASS" in out and "FAIL" not in out

    def perturbed(self, graph, feed):
        res = run(self, graph, feed)
        return {k: (v + 1e-2 * v.float().std() if k == "logits" else v) for k, v in res.items()}
    monkeypatch.setattr(backends.OnnxRuntimeBackend, "run", perturbed)
    code = check_main([str(d), "--device", "cuda", "--graphs", "prefill"])
    out = capsys.readouterr().out
    assert code == 5, out
    assert "logits" in out and "gdn-check: FAIL" in out


@pytest.mark.skipif(not _CUDA_PROVIDER, reason="needs onnxruntime-gpu (CUDAExecutionProvider) and a CUDA GPU")
def test_device_cuda_passes_on_the_gpu(tmp_path_factory, capsys):
    """A float32 Qwen3.5 folder (TF32 off) checked on the CUDA provider: every output and state of prefill and
    decode within the float32 tolerance of the reference."""
    d = _folder(tmp_path_factory, capsys)
    code = check_main([str(d), "--device", "cuda"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gdn-check: PASS" in out and out.count("PASS") >= 6


# onnxruntime-gpu 1.31.1 loading a bf16 Qwen3.5 export (H200, 2026-11-29), as the runtime's backend raises it
_CUDA_BF16 = ("[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: /onnxruntime_src/onnxruntime/core/"
              "optimizer/transformer_memcpy.cc:467 bool onnxruntime::TransformerMemcpyImpl::ProcessInitializers(const "
              "onnxruntime::KernelRegistryManager&, const onnxruntime::InitializedTensorSet&, const onnxruntime::"
              "logging::Logger&) status.IsOK() was false. Failed to find kernel for SimplifiedLayerNormalization(1) "
              "(node:'node_mul_30__layer0/SimplifiedLayerNormFusion/' ep:'CUDAExecutionProvider'). Op with name "
              "(node_mul_30__layer0/SimplifiedLayerNormFusion/) domain () and type (SimplifiedLayerNormalization) kernel "
              "is not supported in CUDAExecutionProvider. Encountered following errors: (Kernel found kernel in the "
              "supported version range (node_version: 1). However the types are incompatible. This op has been "
              "implemented only for the following types (tensor(float),), but the node in the model has the following "
              "type (tensor(bfloat16))")


def test_missing_kernel_names_the_op_and_types():
    assert missing_kernel(_CUDA_BF16) == ("CUDAExecutionProvider has no kernel of SimplifiedLayerNormalization(1) "
                                          "for tensor(bfloat16) (it has tensor(float))")
    assert missing_kernel("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
                          "MatMul(13)").endswith("Could not find an implementation for MatMul(13)")
    assert missing_kernel(f"prefill.onnx: cannot load it: {missing_kernel(_CUDA_BF16)}") == missing_kernel(_CUDA_BF16)
    assert missing_kernel("[ONNXRuntimeError] : 1 : FAIL : Load model failed") is None


def test_a_kernel_the_cuda_provider_lacks_is_not_checked(tmp_path_factory, monkeypatch, capsys):
    """A non-float32 folder whose graph the provider cannot load for a missing kernel: NOT CHECKED (exit 9) with
    the op named, not a run failure."""
    d = _folder(tmp_path_factory, capsys)
    meta = __import__("json").loads((d / "gdn_model.json").read_text())
    monkeypatch.setattr(backends, "onnxruntime_providers", lambda device: ("CPUExecutionProvider",))

    def no_kernel(self, g):
        raise LoadError(f"{g}.onnx: onnxruntime cannot load it: {missing_kernel(_CUDA_BF16)}")
    monkeypatch.setattr(backends.OnnxRuntimeBackend, "_open", no_kernel)
    import gdn_deploy.export.integrity as integrity
    import gdn_deploy.export.metadata as md
    real = md.read_metadata
    monkeypatch.setattr(integrity, "verify_folder", lambda *a, **k: 0)   # the sidecar below differs from the file

    def as_bf16(outdir):                      # the folder read as a bf16 export (the files are float32)
        m = real(outdir)
        m["dtypes"] = {**m["dtypes"], "activations": "bfloat16"}
        return m
    monkeypatch.setattr(md, "read_metadata", as_bf16)
    code = check_main([str(d), "--device", "cuda", "--graphs", "prefill"])
    cap = capsys.readouterr()
    out = cap.out
    assert code == 9, out + cap.err
    assert "SimplifiedLayerNormalization(1) for tensor(bfloat16)" in out and "--device cpu" in out
    assert meta["dtypes"]["activations"] == "float32"
