"""One MoE layer (router, routed experts, shared expert) exported as the prefill graph computes it, in onnxruntime.

For each expert count (same active size: same top-k and expert width) and each MoE form, exports one
:class:`gdn_deploy.lm.mlp.SparseMoE` with a dynamic token count, prints its session load time and node count, and
the median wall time of a call at each token count (and the fastest call: the machine may be shared), with the
expert rows the form computes relative to the routed rows ``T*k`` (FLOPs of the routed part) and, last, each form's
time at the largest expert count over its time at the smallest:

- ``op``       what the onnxruntime graphs use where onnxruntime has it: one ``com.microsoft::MoE`` node
               (:mod:`gdn_deploy.export.onnx_moe`; routed rows)
- ``grouped``  what ``prefill.trt.onnx`` (and ``prefill.onnx`` without the op) uses: rows sorted by expert into blocks
               (:func:`~gdn_deploy.lm.mlp.grouped_blocks`)
- ``split``    the op node replaced by rows sorted by expert, one ``Split`` and one ``Gemm`` per expert against its
               own constant weights (pre-packed once per session; :func:`~gdn_deploy.export.onnx_moe.expand_moe`)
- ``dense``    the earlier prefill form: every expert on every token (E/k times the routed FLOPs)
- ``gather``   the decode form: each token gathers its k experts' weights (for reference; ``T*k`` expert matrices
               copied per call)

    python benchmarks/bench_moe.py [--experts 4,64] [--top-k 2] [--hidden 512] [--inter 256] [--shared 256]
        [--tokens 512,2048,4096] [--forms op,grouped,split,dense] [--threads 1] [--reps 3] [--check] [--memory]
        [--interleave] [--out DIR]

``--check`` adds each run's norm-relative error against the eager routed layer (float64). ``--memory`` adds what
creating each form's session costs in memory (a child process per form: peak and resident RSS above the process
before the session, in MB; the layer's weights are stored in the .onnx file). ``--out DIR`` writes
``bench_moe.json`` there. One onnxruntime session alive at a time (``--interleave``: every session alive and their
calls alternating, so that load from other jobs on a shared machine hits every form alike); no spinning threads.
"""
from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn_deploy.lm.mlp import MoEConfig, SparseMoE, grouped_blocks  # noqa: E402


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def _rows(form: str, tokens: int, top_k: int, experts: int) -> int:
    if form in ("op", "split"):
        return tokens * top_k
    if form == "grouped":
        rows, blocks = grouped_blocks(tokens, top_k, experts)
        return rows * blocks
    return tokens * (experts if form == "dense" else top_k)


_LOAD_RSS = r"""
import sys
import onnxruntime as ort
def status(key):   # kB
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(key + ":")))
open("/proc/self/clear_refs", "w").write("5")      # the peak (VmHWM) restarts from the resident size here
before = status("VmRSS")
so = ort.SessionOptions()
so.intra_op_num_threads = 1
sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
print((status("VmHWM") - before) / 1024, (status("VmRSS") - before) / 1024)
"""


def _load_memory(path: Path) -> tuple[float, float]:
    """(peak, resident) MB that creating a session of ``path`` adds, in a fresh child process."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", _LOAD_RSS, str(path)], check=True, capture_output=True, text=True)
    peak, resident = (float(v) for v in out.stdout.split())
    return peak, resident


def _export(moe: SparseMoE, form: str, path: Path, hidden: int) -> None:
    from torch.export import Dim
    from gdn_deploy.export.onnx_ops import export_program
    moe.impl = "op" if form == "split" else form
    with torch.no_grad():
        export_program(moe, (torch.randn(11, hidden),), str(path), input_names=["x"], output_names=["y"],
                       dynamic_shapes=({0: Dim("tokens", min=1, max=1 << 20)},))
    moe.impl = "routed"
    if form == "split":
        from gdn_deploy.export.onnx_moe import expand_moe
        model = onnx.load(str(path))
        expand_moe(model, "split")
        onnx.save(model, str(path))


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=_ints, default=[4, 64])
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--tokens", type=_ints, default=[512, 2048, 4096])
    ap.add_argument("--forms", default="op,grouped,dense")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--interleave", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import onnxruntime as ort
    forms = [f for f in a.forms.split(",") if f]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = a.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    print(f"onnxruntime {ort.__version__} CPU, {a.threads} thread(s); hidden {a.hidden}, expert width {a.inter}, "
          f"top-k {a.top_k}, shared expert {a.shared}; median of {a.reps}")
    head = f"{'experts':>7} {'form':>8} {'tokens':>7} {'rows/Tk':>8} {'ms':>10} {'min_ms':>8}"
    print(head + (f" {'rel_err':>9}" if a.check else ""))
    results = []

    def measure(group):
        """Time the sessions of ``group`` [(E, form, session, float64 layer)], their calls alternating."""
        for T in a.tokens:
            x = torch.randn(T, a.hidden, generator=torch.Generator().manual_seed(T))
            feed = {"x": x.numpy()}
            ys = [sess.run(None, feed)[0] for _, _, sess, _ in group]         # warm-up
            times = [[] for _ in group]
            for _ in range(a.reps):
                for (_, _, sess, _), ts in zip(group, times):
                    t0 = time.perf_counter()
                    sess.run(None, feed)
                    ts.append((time.perf_counter() - t0) * 1e3)
            for (E, form, _, ref64), y, ts in zip(group, ys, times):
                row = {"experts": E, "form": form, "tokens": T, "ms": statistics.median(ts), "min_ms": min(ts),
                       "rows_over_routed": _rows(form, T, a.top_k, E) / (T * a.top_k)}
                line = (f"{E:>7} {form:>8} {T:>7} {row['rows_over_routed']:>8.3f} {row['ms']:>10.1f} "
                        f"{row['min_ms']:>8.1f}")
                if a.check:
                    with torch.no_grad():
                        want = ref64(x.double()).numpy()
                    row["rel_err"] = float(np.linalg.norm(y - want) / np.linalg.norm(want))
                    line += f" {row['rel_err']:>9.1e}"
                print(line, flush=True)
                results.append(row)

    with tempfile.TemporaryDirectory() as tmp:
        alive = []
        for E in a.experts:
            torch.manual_seed(0)
            moe = SparseMoE(a.hidden, MoEConfig(E, a.top_k, a.inter, a.shared)).eval()
            ref64 = copy.deepcopy(moe).double() if a.check else None
            for form in forms:
                path = Path(tmp) / f"moe_{E}_{form}.onnx"
                _export(moe, form, path, a.hidden)
                if a.memory:
                    peak, resident = _load_memory(path)
                    weights = 3 * E * a.inter * a.hidden * 4 / 2**20
                    print(f"{E:>7} {form:>8} session load: peak +{peak:.0f} MB, resident +{resident:.0f} MB "
                          f"(expert weights {weights:.0f} MB)", flush=True)
                    results.append({"experts": E, "form": form, "load_peak_mb": peak, "load_resident_mb": resident,
                                    "expert_weights_mb": weights})
                t0 = time.perf_counter()
                sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
                load_s = time.perf_counter() - t0
                nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
                print(f"{E:>7} {form:>8} session load {load_s:.2f} s, {nodes} nodes", flush=True)
                results.append({"experts": E, "form": form, "load_s": load_s, "nodes": nodes})
                path.unlink()
                alive.append((E, form, sess, ref64))
                if not a.interleave:
                    measure(alive)
                    alive = []
        if alive:
            measure(alive)
    lo, hi = min(a.experts), max(a.experts)
    if lo != hi:
        print(f"time at {hi} experts / time at {lo} experts (same active size):")
        t = {(r["experts"], r["form"], r["tokens"]): r["ms"] for r in results if "ms" in r}
        tm = {(r["experts"], r["form"], r["tokens"]): r["min_ms"] for r in results if "ms" in r}
        for form in forms:
            print(f"  {form:>8}: " + ", ".join(f"T={T} {t[(hi, form, T)] / t[(lo, form, T)]:.2f}x" for T in a.tokens)
                  + " (fastest calls: " + ", ".join(f"{tm[(hi, form, T)] / tm[(lo, form, T)]:.2f}x" for T in a.tokens)
                  + ")")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_moe.json").write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
