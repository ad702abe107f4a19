"""Where a decode step's time goes on onnxruntime CPU, op type by op type (onnxruntime's own profiler).

  python benchmarks/profile_ort_decode.py --ours FOLDER [--batch 16] [--prompt-len 128] [--new 16] [--threads 1]
  /tmp/genai-venv/bin/python benchmarks/profile_ort_decode.py --genai DIR [--batch 16] ...

``--ours``: a gdn-export folder; greedy generation of --batch random prompts of --prompt-len tokens (the runtime's
bound-state path, runtime/ort_binding.py), the decode session profiled (SessionOptions.enable_profiling).
``--genai``: a folder written by onnxruntime-genai's builder (run this script with the Python that has
onnxruntime-genai); the same prompts through its generator with its session profiled (the folder's
genai_config.json is copied to a temporary folder with profiling and --threads set; the model files are linked).
Both: the first profiled run (ours: the first decode step; genai: the prefill) is dropped, the op types' kernel
times are summed over the remaining runs and divided by their count. Prints a markdown table (ms per step,
nodes per step, share of the step), the kernels' total beside the step (the rest: onnxruntime's own work between
kernels) and the --top biggest single nodes with the bytes each reads (its inputs and weights, as the profiler
counts them); with --json, writes the numbers there.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # the repository (also under the genai venv)
from gdn_deploy.cli_util import OneLineParser  # noqa: E402


def summarize(trace: str, skip: int = 1) -> dict:
    """Per op type: kernel ms per run and nodes per run over the trace's runs after the first ``skip``."""
    ev = json.loads(Path(trace).read_text())
    runs = sorted((e for e in ev if e.get("name") == "model_run"), key=lambda e: e["ts"])[skip:]
    if not runs:
        raise SystemExit(f"{trace}: fewer than {skip + 1} profiled runs")
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in runs]
    us, count, node_us, node_info = collections.Counter(), collections.Counter(), collections.Counter(), {}
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and \
                any(a <= e["ts"] <= b for a, b in spans):
            a = e.get("args", {})
            op = a.get("op_name", "?")
            us[op] += e["dur"]
            count[op] += 1
            node = e["name"][:-len("_kernel_time")]
            node_us[node] += e["dur"]
            node_info[node] = (op, int(a.get("activation_size", 0)) + int(a.get("parameter_size", 0)))
    n = len(runs)
    kernels_ms = sum(us.values()) / n / 1e3
    return {"runs": n, "step_ms": sum(r["dur"] for r in runs) / n / 1e3, "kernels_ms": kernels_ms,
            "ops": [{"op": k, "ms": v / n / 1e3, "nodes": count[k] / n} for k, v in us.most_common()],
            "nodes": [{"node": k, "op": node_info[k][0], "ms": v / n / 1e3, "bytes_read": node_info[k][1]}
                      for k, v in node_us.most_common()]}


def _prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import random
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]


def profile_ours(folder: str, args, prefix: str) -> tuple[str, float]:
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.folder import ExportFolder
    from gdn_deploy.runtime.generation import generate
    f = ExportFolder(folder)
    be = make_backend("onnxruntime", f, threads=args.threads)
    be.options.enable_profiling, be.options.profile_file_prefix = True, prefix
    del be.sessions["decode"]
    be._open("decode")
    r = generate(f, be, _prompts(args.batch, args.prompt_len, f.vocab_size), args.new, eos_token_ids=[])
    return be.sessions["decode"].end_profiling(), r.decode_tokens / r.decode_seconds


def profile_genai(folder: str, args, prefix: str) -> tuple[str, float]:
    import numpy as np
    import onnxruntime_genai as og
    src = Path(folder)
    cfg = json.loads((src / "genai_config.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="genai_profile_"))
    for p in src.iterdir():
        if p.name != "genai_config.json":
            os.symlink(p.resolve(), work / p.name)
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update(intra_op_num_threads=args.threads, inter_op_num_threads=1, enable_profiling=prefix)
    (work / "genai_config.json").write_text(json.dumps(cfg))
    config = og.Config(str(work))
    config.clear_providers()
    model = og.Model(config)
    toks = np.array(_prompts(args.batch, args.prompt_len, cfg["model"]["vocab_size"]), dtype=np.int32)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=args.prompt_len + args.new + 1, batch_size=args.batch, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(toks)
    t0 = time.perf_counter()
    for _ in range(args.new):
        gen.generate_next_token()
    tok_s = args.batch * (args.new - 1) / (time.perf_counter() - t0)
    del gen, params, model            # the session writes its trace when it closes
    traces = sorted(Path(prefix).parent.glob(Path(prefix).name + "*.json"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise SystemExit(f"onnxruntime-genai wrote no profile at {prefix}*.json")
    return str(traces[-1]), tok_s


def main() -> int:
    ap = OneLineParser(prog="profile_ort_decode.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ours", metavar="FOLDER")
    src.add_argument("--genai", metavar="DIR")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    prefix = os.path.join(tempfile.mkdtemp(prefix="ort_profile_"), "decode")
    trace, tok_s = (profile_ours(args.ours, args, prefix) if args.ours else profile_genai(args.genai, args, prefix))
    s = summarize(trace, skip=1)
    s.update(side="gdn-export" if args.ours else "onnxruntime-genai", batch=args.batch, tok_s=tok_s)
    print(f"{s['side']}, batch {args.batch}: {s['step_ms']:.1f} ms per decode step over {s['runs']} steps "
          f"(profiled; {tok_s:.1f} tok/s)\n")
    print("| op | ms per step | nodes | share |\n|---|---|---|---|")
    for r in s["ops"][:args.top]:
        print(f"| {r['op']} | {r['ms']:.2f} | {r['nodes']:g} | {100 * r['ms'] / s['step_ms']:.1f}% |")
    print(f"\nkernels {s['kernels_ms']:.1f} ms of the {s['step_ms']:.1f} ms step ({len(s['nodes'])} nodes); the "
          f"{args.top} biggest nodes:\n\n| node | op | ms per step | MB read (inputs + weights) |\n|---|---|---|---|")
    for r in s["nodes"][:args.top]:
        print(f"| {r['node'][-60:]} | {r['op']} | {r['ms']:.2f} | {r['bytes_read'] / 1e6:.1f} |")
    if args.json:
        tmp = Path(args.json).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(s, indent=1))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
