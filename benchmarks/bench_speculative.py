"""End-to-end speculative decoding on the GPU with the draft forced right (acceptance 1.0) beside plain decoding.

  python benchmarks/bench_speculative.py [--config mid] [--batches 1,16] [--prompt-len 64] [--new 128]
                                         [--draft-tokens 1,3,7] [--repeats 3] [--out DIR]

A random Hugging Face Qwen3.5 of bench_generate.py's ``--config`` (``mid``: Qwen3.5-0.8B shapes with 4 layers,
3 GDN + 1 attention, 32K vocabulary) is built in memory, loaded by gdn-deploy in bf16 on the GPU (``--device cpu``: an fp32 smoke run of the script), and per batch size
of ``--batches`` (equal random prompts of ``--prompt-len`` tokens, ``--new`` new tokens each) timed as:

- ``plain eager``: the model's ``forward_decode`` once per new token (the runtime's eager PyTorch path, gdn::decode);
- ``plain graphed engine``: one step of :class:`gdn_deploy.runtime.cuda_engine.DecodeEngine` (state pools, CUDA
  graph per batch bucket, unfused), timed as a step in a loop (B tokens per step);
- ``speculative eager, K drafts``: :func:`gdn_deploy.runtime.speculative.speculative_generate` in PyTorch
  (verify_step + commit on gdn::verify / gdn::commit_, attention eager; no CUDA graph), drafts from an
  :class:`~gdn_deploy.runtime.speculative.OracleDrafter` given the plain path's greedy tokens, so every draft is
  accepted while the greedy continuation lasts (the printed acceptance says whether bf16 near-ties made the verify
  path's argmax differ somewhere; the tokens are always the verify path's own greedy tokens);
- ``speculative graphed engine, K drafts``: :func:`gdn_deploy.runtime.engine_speculative.engine_speculative_generate`
  on a DecodeEngine (one CUDA graph per (bucket, K + 1) for verify + accept + commit, greedy only), oracle drafts from
  an untimed first run of the engine itself (its own greedy tokens, so bf16 near-ties where the verify and decode
  arithmetic part do not cut acceptance); timed over its verify steps including the host loop (drafts, one copy in,
  one read-back per step). "same tokens as plain" compares with the plain eager path's greedy tokens.

Decode tokens/s count the tokens after the first (the prefill gives it): B x (new - 1) / time of the decode phase
(eager paths: whole generation minus one prefill timed the same way; engine: B / step time). Writes
bench_speculative.json and bench_speculative.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


DEVICE = "cuda"


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _sync_time(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _prefill_s(model, prompts, cap):
    from gdn_deploy.lm.generate import pack_prompts
    from gdn_deploy.lm.model import decode_states_from_prefill
    ids, cu = pack_prompts(prompts, DEVICE)

    def run():
        logits, st = model.forward_prefill(ids, cu, last_only=True)
        return logits, decode_states_from_prefill(model.hybrid_config, st, cu, cap)
    return _sync_time(run)


def plain_eager(model, prompts, new):
    """(seconds of the new - 1 decode steps, greedy tokens [B, new])."""
    lens = torch.tensor([len(p) for p in prompts], device=DEVICE)
    _, (logits, st) = _prefill_s(model, prompts, int(lens.max()) + new + 16)

    def run():
        nonlocal logits, st
        pos, toks = lens.clone(), [logits.float().argmax(-1)]
        for _ in range(new - 1):
            logits, st = model.forward_decode(toks[-1], pos, st)
            pos = pos + 1
            toks.append(logits.float().argmax(-1))
        return torch.stack(toks, 1)
    t, toks = _sync_time(run)
    return t, toks.tolist()


def engine_step_s(model, prompts, new, steps=50):
    from gdn_deploy.runtime.cuda_engine import DecodeEngine
    B = len(prompts)
    eng = DecodeEngine(model, pool_size=B, capacity=len(prompts[0]) + new + steps + 16, graphs=DEVICE == "cuda")
    slots, _ = eng.add(prompts)
    sl = torch.tensor(slots, device=DEVICE)
    ids = torch.zeros(B, dtype=torch.long, device=DEVICE)
    for _ in range(3):
        eng.decoder.step(ids, sl)
    t, _ = _sync_time(lambda: [eng.decoder.step(ids, sl) for _ in range(steps)])
    return t / steps


def speculative(model, prompts, new, K, future):
    from gdn_deploy.runtime.speculative import OracleDrafter, speculative_generate
    drafter = OracleDrafter(future, prompts)
    t, res = _sync_time(lambda: speculative_generate(model, prompts, new, drafter, draft_tokens=K))
    return t, res


def speculative_engine(model, prompts, new, K, future, repeats):
    """[(seconds of the verify steps, result)] x repeats of engine_speculative_generate on one DecodeEngine with a
    pool of B (graphs of every bucket for L = K + 1 captured first, then one untimed warm-up generation whose tokens,
    the engine's own greedy tokens, are the oracle's drafts of the timed runs)."""
    from gdn_deploy.runtime.cuda_engine import DecodeEngine
    from gdn_deploy.runtime.engine_speculative import engine_speculative_generate, speculator
    from gdn_deploy.runtime.speculative import OracleDrafter
    eng = DecodeEngine(model, pool_size=len(prompts), capacity=len(prompts[0]) + new + K + 16,
                       graphs=DEVICE == "cuda")
    if DEVICE == "cuda":
        speculator(eng).capture(K + 1)
    own = engine_speculative_generate(eng, prompts, new, OracleDrafter(future, prompts), K).tokens
    own = [t + [0] * 16 for t in own]         # the engine's own greedy tokens: drafts right past bf16 near-ties
    out = []
    for _ in range(repeats):
        res = engine_speculative_generate(eng, prompts, new, OracleDrafter(own, prompts), K)
        out.append((res.seconds, res))
    return out


def run(args) -> list[dict]:
    import gdn_deploy.ops  # noqa: F401  (registers the CUDA kernels)
    from gdn_deploy import kernels
    from gdn_deploy.lm.hf_folder import load_hf_causal_lm
    from bench_generate import CONFIGS, build_hf
    st = kernels.status()
    if DEVICE == "cuda" and not st.available:
        raise SystemExit(f"bench_speculative: gdn CUDA kernels unavailable: {st.reason}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_speculative_"))
    build_hf(args.config, tmp / "hf")
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = load_hf_causal_lm(tmp / "hf", dtype=dtype).to(DEVICE).eval()
    V = CONFIGS[args.config]["vocab_size"]
    gen = torch.Generator().manual_seed(3)
    rows = []
    med = statistics.median
    with torch.no_grad():
        for B in [int(b) for b in args.batches.split(",")]:
            prompts = [torch.randint(0, V, (args.prompt_len,), generator=gen).tolist() for _ in range(B)]
            cap = args.prompt_len + args.new + 32
            plain_eager(model, prompts, 8)                                       # warm-up
            pre = med([_prefill_s(model, prompts, cap)[0] for _ in range(args.repeats)])
            runs = [plain_eager(model, prompts, args.new) for _ in range(args.repeats)]
            greedy = runs[-1][1]
            ntok = B * (args.new - 1)
            base = dict(config=args.config, batch=B, prompt_len=args.prompt_len, new=args.new, prefill_ms=pre * 1e3)
            t_plain = med(t for t, _ in runs)
            rows.append(dict(base, path="plain eager (forward_decode per token)", draft_tokens=0,
                             decode_tok_s=ntok / t_plain, ms_per_call=t_plain / (args.new - 1) * 1e3))
            step = engine_step_s(model, prompts, args.new)
            rows.append(dict(base, path="plain graphed engine (DecodeEngine, CUDA graphs)", draft_tokens=0,
                             decode_tok_s=B / step, ms_per_call=step * 1e3))
            # oracle drafts reach K tokens past the last new one
            future = [g + [0] * 16 for g in greedy]
            for K in [int(k) for k in args.draft_tokens.split(",")]:
                speculative(model, prompts, 8, K, future)                      # warm-up
                got = [speculative(model, prompts, args.new, K, future) for _ in range(args.repeats)]
                t = med(t for t, _ in got)
                res = got[-1][1]
                same = sum(a == b for x, y in zip(res.tokens, greedy) for a, b in zip(x, y)) / (B * args.new)
                rows.append(dict(base, path="speculative eager (verify + commit, oracle drafts)", draft_tokens=K,
                                 decode_tok_s=ntok / max(t - pre, 1e-9),
                                 ms_per_call=(t - pre) / res.target_calls * 1e3,
                                 acceptance=res.acceptance_rate, tokens_per_call=res.tokens_per_call,
                                 target_calls=res.target_calls, same_tokens_as_plain=same))
            for K in [int(k) for k in args.draft_tokens.split(",")]:
                got = speculative_engine(model, prompts, args.new, K, future, args.repeats)
                t = med(t for t, _ in got)
                res = got[-1][1]
                same = sum(a == b for x, y in zip(res.tokens, greedy) for a, b in zip(x, y)) / (B * args.new)
                rows.append(dict(base, path="speculative graphed engine (verify + commit graph, oracle drafts)",
                                 draft_tokens=K, decode_tok_s=ntok / max(t, 1e-9),
                                 ms_per_call=t / res.target_calls * 1e3, acceptance=res.acceptance_rate,
                                 tokens_per_call=res.tokens_per_call, target_calls=res.target_calls,
                                 same_tokens_as_plain=same))
            for r in rows[-(2 + 2 * len(args.draft_tokens.split(","))):]:
                print(json.dumps(r), flush=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows


def write(out: Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__,
                time=time.strftime("%Y-%m-%d %H:%M:%S"))
    tmp = out / "bench_speculative.json.tmp"
    tmp.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    os.replace(tmp, out / "bench_speculative.json")
    lines = [f"# bench_speculative ({meta['device']}, torch {meta['torch']}, {meta['time']})", "",
             "| B | path | K | decode tok/s | ms per call | acceptance | tokens/call | same tokens as plain |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['acceptance']:.3f}" if "acceptance" in r else ""
        same = f"{r['same_tokens_as_plain']:.3f}" if "same_tokens_as_plain" in r else ""
        lines.append(f"| {r['batch']} | {r['path']} | {r['draft_tokens'] or ''} | {r['decode_tok_s']:.0f} | "
                     f"{r['ms_per_call']:.2f} | {acc} | {r.get('tokens_per_call', 1.0):.2f} | {same} |")
    tmp = out / "bench_speculative.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, out / "bench_speculative.md")


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="mid", choices=["tiny", "mid"])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--draft-tokens", default="1,3,7", help="K drafts per verify call (K + 1 tokens scored)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script (fp32, the reference GDN path), not a measurement")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_speculative: needs a CUDA GPU (--device cpu: a smoke run)", file=sys.stderr)
        return 2
    write(Path(args.out), run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
