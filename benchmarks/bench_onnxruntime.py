"""onnxruntime prefill without plugins: the gdn function bodies vs onnxruntime's LinearAttention vs PyTorch.

One run, one machine, one sequence of T tokens. For each case and T, prints the median wall time
of a prefill call of:

- ``chunked``        the exported graph with the chunked gdn function body (the default export)
- ``token``          the same export with ``--gdn-body token`` (a loop over tokens)
- ``com.microsoft``  ``--interop com.microsoft``: onnxruntime's native contrib ``LinearAttention`` kernel
- ``torch``          the PyTorch module itself (the gdn ops' chunked reference on CPU, the CUDA kernels on GPU)

Each variant is timed on its own (one warm-up call, then ``--reps`` calls; one onnxruntime session
alive at a time: the Qwen3-Next block's sessions at 16K tokens take ~6 GB each). onnxruntime's idle
threads do not spin (``--spin`` to let them; spinning threads take CPU from whatever runs next). ``--check`` adds each run's
norm-relative error against the same computation in float64 (first output, and the last output: the
final recurrent state).

Cases:

- ``default``        prefill.onnx of the bundled tiny LM (2 GDN layers, Hk=1 Hv=2 K=V=64, plus
                     embeddings, MLPs, LM head), what ``gdn-export`` writes
- ``qwen3next``      prefill.onnx of one GDN block at Qwen3-Next shapes (hidden 2048, Hk=16, Hv=32,
                     K=V=128; random init)
- ``op-default``, ``op-qwen3next``   the gdn prefill op alone (raw gates, L2 norm) at those head shapes

    python benchmarks/bench_onnxruntime.py [--cases default,qwen3next,op-default,op-qwen3next]
        [--tokens 1024,4096,16384] [--runs chunked,token,com.microsoft,torch] [--reps 5]
        [--threads N] [--provider cpu|cuda] [--spin] [--check] [--out DIR]

``--provider cuda`` runs onnxruntime with the CUDA execution provider (onnxruntime-gpu) and the
torch column on the GPU. ``--out DIR`` writes ``bench_onnxruntime.json`` there.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn_deploy.export.graphs import example_feed, graph_plan  # noqa: E402
from gdn_deploy.export.loading import load_targets  # noqa: E402
from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.export.onnx_ops import export_program  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime, session_settings  # noqa: E402
from gdn_deploy.export.targets import ExportTarget  # noqa: E402
from gdn_deploy.model import GDNBlock, GDNConfig  # noqa: E402

RUNS = ("chunked", "token", "com.microsoft", "torch")
CASES = ("default", "qwen3next", "op-default", "op-qwen3next")
QWEN3_NEXT = dict(hidden_size=2048, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                  conv_kernel_size=4)
OP_HEADS = {"op-default": (1, 2, 64, 64), "op-qwen3next": (16, 32, 128, 128)}   # Hk, Hv, K, V


class PrefillOp(torch.nn.Module):
    """The gdn prefill op with Qwen3-Next's attributes (raw gates, L2 norm of q and k)."""

    def forward(self, q, k, v, a, b, cu_seqlens, initial_state, A_log, dt_bias):
        return torch.ops.gdn.prefill(q, k, v, a, b, cu_seqlens, initial_state, A_log, dt_bias,
                                     gate_mode=1, use_qk_l2norm=1)


class Case:
    """A module, its example inputs for T tokens, and how to export it for one run."""

    def __init__(self, name: str):
        self.name = name
        if name in OP_HEADS:
            self.module, self.target = PrefillOp(), None
        elif name == "default":
            self.target = load_targets("default")[0]
            self.module = graph_plan(self.target, "prefill").module
        elif name == "qwen3next":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                block = GDNBlock(GDNConfig(**QWEN3_NEXT))
                block.reset_parameters()
            self.target = ExportTarget(block.eval(), "block", {"model": "qwen3next-shapes"})
            self.module = graph_plan(self.target, "prefill").module
        else:
            raise SystemExit(f"bench_onnxruntime: unknown case {name!r} (expected some of {', '.join(CASES)})")

    def feed(self, tokens: int, seed: int) -> list[torch.Tensor]:
        if self.target is not None:
            return list(example_feed(self.target, "prefill", tokens=tokens, seqs=1, seed=seed).values())
        Hk, Hv, K, V = OP_HEADS[self.name]
        gen = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        return [r(tokens, Hk, K), r(tokens, Hk, K), r(tokens, Hv, V), r(tokens, Hv), r(tokens, Hv),
                torch.tensor([0, tokens], dtype=torch.int32), 0.1 * r(1, Hv, K, V),
                torch.rand(Hv, generator=gen) * 2 - 1, torch.rand(Hv, generator=gen) * 2 - 1]

    def export(self, run: str, outdir: Path) -> Path:
        interop = "com.microsoft" if run == "com.microsoft" else None
        body = run if run in ("chunked", "token") else "chunked"
        outdir.mkdir(parents=True, exist_ok=True)
        if self.target is not None:
            export_model(self.target, outdir, ExportOptions(graphs=("prefill",), verify=False, interop=interop,
                                                            gdn_body=body))
            return outdir / "prefill.onnx"
        path = outdir / "prefill_op.onnx"
        dims = [{0: "T"}] * 5 + [None, None, None, None]
        export_program(self.module, self.feed(128, 0), path, dynamic_shapes=dims, interop=interop, gdn_body=body)
        return path


OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "all": "ORT_ENABLE_ALL"}


def session(path: Path, threads: int, provider: str, spin: bool, opt_level: str = "all",
            disabled: tuple[str, ...] = ()):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    if threads:
        so.intra_op_num_threads = threads
    if not spin:      # idle onnxruntime threads would otherwise busy-wait beside the next (torch) call
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # with CUDA: TF32 off and the optimisers our files need off there (gdn_deploy.export.runtimes.session_settings)
    kw = session_settings(["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda"
                          else ["CPUExecutionProvider"])
    kw["disabled_optimizers"] = list(dict.fromkeys(kw.get("disabled_optimizers", []) + list(disabled)))
    sess = ort.InferenceSession(str(path), so, **kw)
    if provider == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
        # onnxruntime falls back to the CPU quietly when the CUDA provider cannot load: never report that as CUDA
        raise SystemExit(f"bench_onnxruntime: the CUDA execution provider did not load (session providers "
                         f"{sess.get_providers()}; available {ort.get_available_providers()})")
    return sess


def timed(call: Callable[[], list], reps: int) -> tuple[float, list]:
    """Median seconds of ``reps`` calls after one warm-up call, and the last outputs."""
    out = call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def main(argv: list[str] | None = None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of onnxruntime (intra-op) and torch (0: their defaults, one per core)")
    ap.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--spin", action="store_true",
                    help="let onnxruntime's idle threads spin (its default; they then take CPU from the torch calls)")
    ap.add_argument("--check", action="store_true", help="errors vs the same computation in float64")
    ap.add_argument("--ort-opt-level", choices=list(OPT_LEVELS), default="all",
                    help="onnxruntime graph optimisation level (default all, onnxruntime's own default)")
    ap.add_argument("--ort-disable", default="",
                    help="comma-separated onnxruntime graph optimisers to turn off (session disabled_optimizers)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        raise SystemExit(f"bench_onnxruntime: unknown run(s) {bad} (expected some of {', '.join(RUNS)})")
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if args.provider == "cuda" else "cpu"

    import onnxruntime as ort
    print(f"onnxruntime {ort.__version__} ({args.provider}, intra-op threads {args.threads or 'default'}, "
          f"spinning {'on' if args.spin else 'off'}, graph optimisation {args.ort_opt_level}"
          f"{', without ' + args.ort_disable if args.ort_disable else ''}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), {os.cpu_count()} CPUs; "
          f"median of {args.reps} calls, one sequence")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            case = Case(name)
            feeds = {T: case.feed(T, seed=T) for T in tokens}
            results: dict[tuple[str, int], tuple[float, list[float] | None]] = {}
            refs = {}
            if args.check:
                ref_module = copy.deepcopy(case.module).double()
                with torch.no_grad():
                    for T, feed in feeds.items():
                        outs = ref_module(*[x.double() if x.is_floating_point() else x for x in feed])
                        refs[T] = (outs[0], outs[-1])
                del ref_module
            for r in runs:            # one runtime at a time: a big case's sessions do not fit in memory together
                if r == "torch":
                    module = copy.deepcopy(case.module).to(device).eval()

                    def make_call(feed):
                        dev_feed = [x.to(device) for x in feed]

                        def call():
                            with torch.no_grad():
                                return [o.cpu() for o in module(*dev_feed)]
                        return call
                else:
                    sess = session(case.export(r, Path(tmp) / name / r), args.threads, args.provider, args.spin,
                                   args.ort_opt_level, tuple(x for x in args.ort_disable.split(",") if x))

                    def make_call(feed, sess=sess):
                        return lambda: list(run_onnxruntime(sess, feed).values())
                for T, feed in feeds.items():
                    t, out = timed(make_call(feed), args.reps)
                    err = [rel_err(out[0], refs[T][0]), rel_err(out[-1], refs[T][1])] if args.check else None
                    results[(r, T)] = (t, err)
                    del out
                module = sess = None
            for T in tokens:
                row, line = {"case": name, "tokens": T}, f"{name:13s} T={T:6d}"
                for r in runs:
                    t, err = results[(r, T)]
                    row[f"{r}_ms"] = t * 1e3
                    line += f" | {r} {t * 1e3:8.1f} ms"
                    if err is not None:
                        row[f"{r}_err"] = err
                        line += " ({:.1e}/{:.1e})".format(*err)
                if "chunked_ms" in row and "token_ms" in row:
                    line += f" | token/chunked {row['token_ms'] / row['chunked_ms']:.1f}x"
                print(line, flush=True)
                rows.append(row)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_onnxruntime.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
