"""Real TensorRT engines with the gdn plugins (needs the tensorrt module, a CUDA GPU and the built plugin
library): gdn-build builds one-node prefill/decode graphs from their TensorRT-ready files (several
gdn-build calls in this one process: the plugins are registered once), the engines run on random inputs,
and the outputs are compared with the float64 reference (relative error within the spec's kernel tolerance)."""
from __future__ import annotations

import pytest
import torch

from conftest import call_decode_ref, call_prefill_ref, make_decode_inputs, make_prefill_inputs, rel_err
from gdn_deploy.plugins import build_cli, find_plugin_library, load_gdn_plugins, registered_gdn_creators
from gdn_deploy.spec import SPEC

from .onnx_graphs import decode_profile, gdn_model, prefill_profile, write_export_dir

trt = pytest.importorskip("tensorrt", reason="the tensorrt Python module is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
if find_plugin_library() is None:
    pytest.skip("libgdn_trt_plugins.so not built (cmake --build build, or set GDN_PLUGIN_LIB)", allow_module_level=True)

HK, HV, K, V = 2, 4, 64, 64
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _run_engine(path, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(path.read_bytes())
    assert engine is not None
    ctx = engine.create_execution_context()
    feeds = {n: t.cuda().contiguous() for n, t in feeds.items()}
    outs = {}
    for n, t in feeds.items():
        assert ctx.set_input_shape(n, tuple(t.shape))
        ctx.set_tensor_address(n, t.data_ptr())
    for i in range(engine.num_io_tensors):
        n = engine.get_tensor_name(i)
        if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT:
            dt = {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16}[
                engine.get_tensor_dtype(n)]
            outs[n] = torch.full(tuple(ctx.get_tensor_shape(n)), float("nan"), dtype=dt, device="cuda")
            ctx.set_tensor_address(n, outs[n].data_ptr())
    stream = torch.cuda.current_stream()
    assert ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return {n: t.cpu() for n, t in outs.items()}


def _feeds(inp, names, io):
    out = {}
    for n in names:
        t = inp[n]
        if n in ("q", "k", "v", "g", "beta"):
            out[n] = t.to(TORCH[io])
        elif n in ("cu_seqlens", "slots"):
            out[n] = t.to(torch.int32)
        else:
            out[n] = t.to(torch.float32)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["float32", "bfloat16"])
@pytest.mark.parametrize("state_mode", [0, 1])
def test_decode_engine(tmp_path, gen, io, state_mode):
    model = gdn_model("GatedDeltaDecode", io=io, gate=io, Hk=HK, Hv=HV, K=K, V=V, state_mode=state_mode)
    d = write_export_dir(tmp_path, {"decode": model},
                         {"decode": decode_profile((1, 4, 8), 16, Hk=HK, Hv=HV, K=K, V=V, state_mode=state_mode)})
    assert build_cli.main([str(d), "--plugin-lib", str(find_plugin_library())]) == 0
    inp = make_decode_inputs(gen, 5, HK, HV, K, V, pool_size=16 if state_mode else None)
    if state_mode:
        inp["slots"][1] = -1
    names = [i.name for i in model.graph.input]
    feeds = _feeds(inp, names, io)
    got = _run_engine(d / "decode.engine", feeds)
    ref_in = {n: (t.double() if t.is_floating_point() else t) for n, t in feeds.items()}
    o_ref, s_ref = call_decode_ref(ref_in, state_mode=state_mode)
    tol = SPEC.kernel_tolerance(io)
    assert rel_err(got["o"], o_ref) < tol
    assert rel_err(got["new_state"], s_ref) < tol
    if state_mode:
        assert torch.equal(got["o"][1].float(), torch.zeros_like(got["o"][1].float()))


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["float32", "float16"])
def test_prefill_engine(tmp_path, gen, io):
    model = gdn_model("GatedDeltaPrefill", io=io, gate="float32", Hk=HK, Hv=HV, K=K, V=V)
    d = write_export_dir(tmp_path, {"prefill": model},
                         {"prefill": prefill_profile((1, 64, 256), (1, 2, 4), Hk=HK, Hv=HV, K=K, V=V)})
    assert build_cli.main([str(d), "--plugin-lib", str(find_plugin_library())]) == 0
    inp = make_prefill_inputs(gen, [70, 0, 33], HK, HV, K, V)
    names = [i.name for i in model.graph.input]
    feeds = _feeds(inp, names, io)
    feeds["g"], feeds["beta"] = inp["g"].float(), inp["beta"].float()
    got = _run_engine(d / "prefill.engine", feeds)
    ref_in = {n: (t.double() if t.is_floating_point() else t) for n, t in feeds.items()}
    o_ref, s_ref = call_prefill_ref(ref_in)
    tol = SPEC.kernel_tolerance(io)
    assert rel_err(got["o"], o_ref) < tol
    assert rel_err(got["final_state"], s_ref) < tol


def test_plugins_register_once():
    """load_gdn_plugins twice is a no-op the second time; TensorRT's own load_library of the same library is then
    refused (its rule for already registered creators) and the creators stay registered."""
    lib = find_plugin_library()
    load_gdn_plugins(trt, lib)
    assert "already registered" in load_gdn_plugins(trt, lib)
    try:
        again = trt.get_plugin_registry().load_library(str(lib))
    except Exception:  # noqa: BLE001 - a binding may raise instead of returning None
        again = None
    assert again is None
    assert all(registered_gdn_creators(trt).values())
