"""Helpers shared by the GPU kernel tests: dtype names, op attributes, inputs moved to the GPU, prefill scan
configurations."""
from __future__ import annotations

import torch

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_FP32_INPUTS = ("state", "initial_state", "A_log", "dt_bias")


def op_attrs(gate_mode, use_qk_l2norm, scale=0.0, eps=1e-6):
    return dict(gate_mode=gate_mode, use_qk_l2norm=use_qk_l2norm, scale=scale, l2norm_eps=eps)


def to_device(inp, io_dtype, gate_dtype, beta_dtype=None):
    """Kernel inputs on the GPU (q/k/v in the I/O dtype, gates in the gate dtype — beta in ``beta_dtype`` when
    given —, states and A_log/dt_bias in float32) and the float64 values they hold (on the GPU), for the reference."""
    dev, ref = {}, {}
    for n, t in inp.items():
        if n in ("q", "k", "v"):
            d = t.to(io_dtype)
        elif n in ("g", "beta"):
            d = t.to(beta_dtype if n == "beta" and beta_dtype is not None else gate_dtype)
        elif n in _FP32_INPUTS:
            d = t.to(torch.float32)
        else:
            d = t
        dev[n] = d.cuda()
        ref[n] = dev[n].double() if d.is_floating_point() else dev[n]
    return dev, ref


# Prefill scan configurations (scan name, tma) of gdnPrefillConfig.h: the wgmma scan after and beside the prep
# kernel, by bulk tensor copies and by cp.async (what a launch uses where no tensor map encodes), and the mma.sync
# scan with 2 and 4 warps per CTA.
SCAN_CONFIGS = (("wgmma", True), ("wgmma_beside", True), ("wgmma", False), ("wgmma_beside", False),
                ("mma2", True), ("mma4", True))


def scan_configs(kernels, K, configs=SCAN_CONFIGS):
    """The configurations of `configs` that run on this device and build for head dim K."""
    return [(s, t) for s, t in configs if kernels.launch.prefill_scan_runs(kernels.LIB, s, K)]


def count_kernel_launches(monkeypatch) -> dict[str, int]:
    """Count the prefill / decode launches that reach the CUDA kernels (``launch.launch_*``) from now on."""
    import gdn_deploy.kernels as k
    n = {"prefill": 0, "decode": 0}
    for op in n:
        real = getattr(k.launch, f"launch_{op}")

        def counted(*a, _op=op, _real=real, **kw):
            n[_op] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(k.launch, f"launch_{op}", counted)
    return n

