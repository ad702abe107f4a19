"""onnxruntime-genai's side of ``benchmarks/bench_generate.py --genai PYTHON``, run by that Python (a separate venv
holding ``onnxruntime-genai``, so the repository's onnxruntime stays as it is).

  PYTHON benchmarks/genai_runner.py MODEL_DIR --threads 1

Loads the model folder its builder wrote (CPU provider, ``--threads`` intra-op threads), prints ``ready``, then
answers one JSON line per request read from stdin, so the caller can alternate its own runs with these:
  {"op": "prefill", "tokens": [...]}                      -> {"seconds": s, "next": id}
  {"op": "decode", "prompts": [[...], ...], "steps": n}  -> {"prefill_seconds": s, "seconds": s, "cpu_seconds": s,
                                                             "tokens": [[...]]}
Prefill time is that of ``append_tokens`` (one prompt); decode time is that of ``steps`` calls of
``generate_next_token`` for the batch after ``append_tokens`` of the (equal-length) prompts, greedy; ``cpu_seconds``
the calling thread's CPU time over those calls (with 1 intra-op thread onnxruntime runs in it: a measure that a
shared machine's other processes disturb far less than the wall clock).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # the repository, for its one-line parser only
from gdn_deploy.cli_util import OneLineParser  # noqa: E402


def _set_threads(model_dir: Path, threads: int) -> None:
    path = model_dir / "genai_config.json"
    cfg = json.loads(path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update(intra_op_num_threads=threads, inter_op_num_threads=1)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2))
    tmp.replace(path)


def _generator(model, batch: int, max_length: int):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=batch, do_sample=False)
    return og.Generator(model, params)


def main() -> int:
    ap = OneLineParser(prog="genai_runner.py")
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model_dir = Path(args.model_dir)
    _set_threads(model_dir, args.threads)
    config = og.Config(str(model_dir))
    config.clear_providers()
    model = og.Model(config)
    print("ready", og.__version__, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "prefill":
            toks = np.array([req["tokens"]], dtype=np.int32)
            g = _generator(model, 1, toks.shape[1] + 2)
            t0 = time.perf_counter()
            g.append_tokens(toks)
            dt = time.perf_counter() - t0
            g.generate_next_token()
            res = {"seconds": dt, "next": int(g.get_next_tokens()[0])}
        elif req["op"] == "decode":
            toks = np.array(req["prompts"], dtype=np.int32)
            n = int(req["steps"])
            g = _generator(model, toks.shape[0], toks.shape[1] + n + 1)
            t0 = time.perf_counter()
            g.append_tokens(toks)
            t1, c1 = time.perf_counter(), time.thread_time()
            out = []
            for _ in range(n):
                g.generate_next_token()
                out.append([int(t) for t in g.get_next_tokens()])
            t2, c2 = time.perf_counter(), time.thread_time()
            res = {"prefill_seconds": t1 - t0, "seconds": t2 - t1, "cpu_seconds": c2 - c1,
                   "tokens": [list(r) for r in zip(*out)]}
        else:
            res = {"error": f"unknown op {req['op']!r}"}
        print(json.dumps(res), flush=True)
        del g
    return 0


if __name__ == "__main__":
    sys.exit(main())
