"""Where the engine's speculative step faults on the GPU: one eager step per variant, CUDA_LAUNCH_BLOCKING=1 set by
the caller so the traceback names the faulting op. Usage: spec5_diag.py CONFIG DTYPE B L ATTN (ATTN: triton|torch)."""
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main():
    cfg, dt, B, L, attn = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    import gdn_deploy.ops  # noqa: F401
    from gdn_deploy.lm.hf_folder import load_hf_causal_lm
    from gdn_deploy.runtime.cuda_engine import DecodeEngine
    from gdn_deploy.runtime.engine_speculative import SpeculativeStep
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    tmp = Path(tempfile.mkdtemp())
    if cfg == "tiny":
        import hf_tiny_models as tiny
        tiny.save(tiny.build("qwen3_next", torch.Generator().manual_seed(0), gpu=True), tmp / "hf")
    else:
        from bench_generate import build_hf
        build_hf(cfg, tmp / "hf")
    model = load_hf_causal_lm(tmp / "hf", dtype=dtype).to("cuda").eval()
    V = model.hybrid_config.vocab_size
    eng = DecodeEngine(model, pool_size=max(B, 2), capacity=128, graphs=False, attention=attn)
    print("fns", type(eng.decoder.fns).__name__, flush=True)
    slots, _ = eng.add([[1, 2, 3, 4, 5]] * min(B, 2))
    step = SpeculativeStep(eng.decoder)
    d = eng.decoder
    with torch.no_grad():
        try:
            ids = torch.randint(0, V, (B, L), device="cuda")
            sl = torch.full((B,), d.scratch, device="cuda")
            out = step._step(ids, sl, torch.full((B,), -1, dtype=torch.int32, device="cuda"))
            torch.cuda.synchronize()
            print("padded-only OK", out[:, -1].tolist(), flush=True)
            sl = torch.tensor(slots + [d.scratch] * (B - len(slots)), device="cuda")[:B]
            gs = torch.tensor(slots + [-1] * (B - len(slots)), device="cuda", dtype=torch.int32)[:B]
            out = step._step(ids, sl, gs)
            torch.cuda.synchronize()
            print("live OK", out[:, -1].tolist(), flush=True)
            step.capture(d.bucket(B), L)
            torch.cuda.synchronize()
            print("capture OK", flush=True)
            out = step.step(ids, sl)
            torch.cuda.synchronize()
            print("replay OK", out[:, -1].tolist(), flush=True)
        except Exception:
            traceback.print_exc(limit=12)
            print("FAILED", flush=True)


main()
