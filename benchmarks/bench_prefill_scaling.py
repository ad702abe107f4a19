"""How onnxruntime CPU prefill time grows with the prompt length, and the decode step time at several batches.

  python benchmarks/bench_prefill_scaling.py [--config mid] [--lengths 512,2048,8192] [--batches 1,4,16]
                                             [--new 16] [--threads 1] [--repeats 1] [--out DIR]

A random Hugging Face Qwen3.5 model of ``bench_generate.py``'s ``--config`` is built in memory (no downloads; "mid":
the Qwen3.5-0.8B shapes, 4 layers = 3 GDN + 1 attention, 32K vocabulary), exported with the gdn_deploy on
``PYTHONPATH`` (``verify=False``) and run by onnxruntime with ``--threads`` intra-op threads. Per length: the
prefill time of one prompt of that many tokens (median of ``--repeats``, after one short warm-up call); per batch:
the mean decode step time of that many sequences of 64 prompt tokens over ``--new`` steps. The growth column is time / time at the first
length divided by tokens / tokens at the first length (1.0 = linear). Uses only ``export_model`` / ``generate``, so
it runs against any revision of the package (A/B by PYTHONPATH). Writes bench_prefill_scaling.json to --out.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import CONFIGS, build_hf  # noqa: E402


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(prog="bench_prefill_scaling.py", description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="mid")
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import gdn_deploy
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.folder import ExportFolder
    from gdn_deploy.runtime.generation import generate
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    rows, steps = [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hf = build_hf(args.config, tmp / "hf")
        hf.config.max_position_embeddings = max(lengths) + args.new + 8
        hf.save_pretrained(str(tmp / "hf"))
        del hf
        t0 = time.perf_counter()
        export_model(load_targets(str(tmp / "hf"))[0], tmp / "out",
                     ExportOptions(verify=False, max_tokens=max(lengths), max_context=max(lengths) + args.new + 8))
        export_s = time.perf_counter() - t0
        folder = ExportFolder(tmp / "out")
        be = make_backend("onnxruntime", folder, threads=args.threads)
        V = folder.vocab_size
        gen = torch.Generator().manual_seed(0)
        generate(folder, be, [list(range(16))], 2, eos_token_ids=[])                 # warm-up (session, arenas)
        for L in lengths:
            prompt = [torch.randint(0, V, (L,), generator=gen).tolist()]
            ts = [generate(folder, be, prompt, 1, eos_token_ids=[]).prefill_seconds for _ in range(args.repeats)]
            rows.append({"tokens": L, "prefill_s": statistics.median(ts)})
            print(f"prefill {L:6d} tokens: {rows[-1]['prefill_s']:.3f} s", flush=True)
        for B in batches:
            prompts = [torch.randint(0, V, (64,), generator=gen).tolist() for _ in range(B)]
            generate(folder, be, prompts, 3, eos_token_ids=[])                        # warm-up
            r = generate(folder, be, prompts, args.new, eos_token_ids=[])
            steps.append({"batch": B, "step_ms": 1e3 * r.decode_seconds / max(r.decode_steps, 1)})
            print(f"decode batch {B:3d}: {steps[-1]['step_ms']:.2f} ms/step", flush=True)
    base = rows[0]
    for x in rows:
        x["growth_vs_tokens"] = (x["prefill_s"] / base["prefill_s"]) / (x["tokens"] / base["tokens"])
    res = {"package": str(Path(gdn_deploy.__file__).parent), "config": args.config, "threads": args.threads,
           "export_s": export_s, "prefill": rows, "decode": steps}
    for x in rows:
        print(f"| {x['tokens']} | {x['prefill_s']:.3f} s | {x['growth_vs_tokens']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmpf = out / "bench_prefill_scaling.json.tmp"
    tmpf.write_text(json.dumps(res, indent=1))
    os.replace(tmpf, out / "bench_prefill_scaling.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
