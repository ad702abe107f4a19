"""How far the speculative verify path's logits are from plain decoding's on the same tokens (teacher-forced).

  python benchmarks/check_verify_logits.py [--config mid] [--batches 1,16] [--lengths 2,4,8] [--new 128]
                                           [--dtype bf16|fp32] [--device cuda|cpu]

A random Qwen3.5 of bench_generate.py's ``--config`` decodes its greedy continuation of random prompts with
``forward_decode`` (one token per call, logits of every step kept); then, from the same prefill states, the same
tokens go through ``verify_step`` L at a time (every token accepted: ``commit`` of all L). Per (B, L) it prints the
norm-relative difference of the verify logits to the decode logits, the fraction of positions whose argmax
differs, and the decode logits' top-2 gap at those positions (a near-tie when it is within the dtype's rounding of
the logits). Argmax flips at near-ties are what a random bf16 model gives; flips at large gaps, or a relative
difference far above the dtype's rounding, are a bug in one of the two paths.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def greedy_decode_logits(model, prompts, new, cap, device):
    """(tokens [B, new] greedy, logits [B, new - 1, V] float32: decode step t predicts token t + 1)."""
    from gdn_deploy.lm.generate import pack_prompts
    from gdn_deploy.lm.model import decode_states_from_prefill
    ids, cu = pack_prompts(prompts, device)
    logits, st = model.forward_prefill(ids, cu, last_only=True)
    st = decode_states_from_prefill(model.hybrid_config, st, cu, cap)
    pos = torch.tensor([len(p) for p in prompts], device=device)
    toks, outs = [logits.float().argmax(-1)], []
    for _ in range(new - 1):
        logits, st = model.forward_decode(toks[-1], pos, st)
        pos = pos + 1
        outs.append(logits.float())
        toks.append(outs[-1].argmax(-1))
    return torch.stack(toks, 1), torch.stack(outs, 1)


def verify_logits(model, prompts, tokens, L, cap, device):
    """Logits [B, n, V] of ``tokens`` fed L at a time through verify_step + commit (all accepted)."""
    from gdn_deploy.lm.generate import pack_prompts
    from gdn_deploy.lm.model import decode_states_from_prefill
    from gdn_deploy.lm.mtp import lm_head_logits
    from gdn_deploy.lm.speculative_steps import commit, verify_step
    ids, cu = pack_prompts(prompts, device)
    _, st = model.forward_prefill(ids, cu, last_only=True)
    st = decode_states_from_prefill(model.hybrid_config, st, cu, cap)
    pos = torch.tensor([len(p) for p in prompts], device=device)
    B, n = tokens.shape[0], (tokens.shape[1] - 1) // L * L
    outs = []
    for c in range(0, n, L):
        hidden, st, pending = verify_step(model, tokens[:, c:c + L], pos, st)
        outs.append(lm_head_logits(model, model.norm(hidden)).float())
        st = commit(st, pending, L, torch.full((B,), L, dtype=torch.int32, device=device))
        pos = pos + L
    return torch.cat(outs, 1)


def compare(dec, ver) -> dict:
    n = ver.shape[1]
    d = dec[:, :n]
    rel = float((ver - d).norm() / d.norm())
    flip = ver.argmax(-1) != d.argmax(-1)
    top2 = torch.topk(d, 2, dim=-1).values
    gap = (top2[..., 0] - top2[..., 1])[flip]
    scale = float(d.abs().amax(-1).mean())
    first = [int(f.nonzero()[0]) if f.any() else -1 for f in flip]
    return dict(rel_err=rel, flips=int(flip.sum()), positions=int(flip.numel()),
                flip_gap_max=float(gap.max()) if gap.numel() else None,
                flip_gap_median=float(gap.median()) if gap.numel() else None, logit_scale=scale,
                first_flip_per_row=first)


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="mid", choices=["tiny", "mid"])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--lengths", default="2,4,8", help="tokens per verify call (K + 1)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_verify_logits: needs a CUDA GPU (--device cpu)", file=sys.stderr)
        return 2
    import gdn_deploy.ops  # noqa: F401  (registers the CUDA kernels)
    from gdn_deploy.lm.hf_folder import load_hf_causal_lm
    from bench_generate import CONFIGS, build_hf
    tmp = Path(tempfile.mkdtemp(prefix="check_verify_logits_"))
    build_hf(args.config, tmp / "hf")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = load_hf_causal_lm(tmp / "hf", dtype=dtype).to(args.device).eval()
    V = CONFIGS[args.config]["vocab_size"]
    gen = torch.Generator().manual_seed(3)
    cap = args.prompt_len + args.new + 32
    with torch.no_grad():
        for B in [int(b) for b in args.batches.split(",")]:
            prompts = [torch.randint(0, V, (args.prompt_len,), generator=gen).tolist() for _ in range(B)]
            tokens, dec = greedy_decode_logits(model, prompts, args.new, cap, args.device)
            for L in [int(x) for x in args.lengths.split(",")]:
                ver = verify_logits(model, prompts, tokens, L, cap, args.device)
                print(json.dumps(dict(config=args.config, dtype=args.dtype, batch=B, L=L, **compare(dec, ver))),
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
