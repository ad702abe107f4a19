"""A whole exported hybrid model on onnxruntime's CUDA provider: long prefill (up to 32K tokens) and decode with
the states bound on the GPU (IOBinding), beside HF + FLA and our PyTorch model on the same GPU.

  python benchmarks/bench_ort_cuda.py [--config mid] [--precision fp16] [--prefill-lens 1024,8192,32768]
                                      [--decode-batches 1,8] [--decode-prompt 1024] [--new 32] [--repeats 2]
                                      [--profile-len 8192] [--prefill-chunk 4096[,1024...]]
                                      [--arena next_power_of_two|same_as_requested]
                                      [--prefill-body exported,linear_attention] [--layers 4]
                                      [--execution-order priority_based,default] [--out DIR]

A random Hugging Face Qwen3.5 of bench_generate.py's ``--config`` (``mid``: Qwen3.5-0.8B shapes with 4 layers,
3 GDN + 1 attention, 32K vocabulary; ``--layers``: more layers in the same pattern) is built, exported with ``--precision`` (fp16 default: onnxruntime's CUDA
GroupQueryAttention takes fp16/bf16) and a KV capacity for the longest prompt, and run through the package's
onnxruntime backend on ``CUDAExecutionProvider`` (its session settings: TF32 off, ConstantFolding off):

- prefill: one sequence of each ``--prefill-lens`` length, seconds of the prefill call (median of ``--repeats``
  after a warm-up at that length), the GPU memory the process holds once the sessions are created and after the
  calls (``cudaMemGetInfo``: onnxruntime's arena keeps its peak; ``--arena``: its growth strategy), beside the bytes
  the weights + that sequence's states need and what ``[T, T]`` fp32 scores of all attention heads would take (the
  old graphs' form); prompts longer than a ``--prefill-chunk`` size also fed in pieces of that size;
- decode: ``--decode-batches`` prompts of ``--decode-prompt`` tokens, ``--new`` tokens each, ms per step with the
  states bound in place on the GPU (runtime/ort_binding.py) and with tensors in and out through the host;
- HF + FLA (bf16) and our PyTorch model on the gdn CUDA kernels (bf16) at the same prefill lengths and decode batches;
- ``--profile-len``: one prefill under onnxruntime's profiler: kernel time per execution provider and the top ops
  (nodes on the CPU provider inside a CUDA session cost copies).

The first prefill length also gives the last-token logits' norm-relative error against HF in float32 on the GPU.
Writes bench_ort_cuda.json and bench_ort_cuda.md to --out. Needs onnxruntime-gpu (CUDAExecutionProvider).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]
ARENA = {"next_power_of_two": "kNextPowerOfTwo", "same_as_requested": "kSameAsRequested"}
ORDERS = ("priority_based", "default")


class _ARGS:      # the options _ort_backend reads (set by main)
    arena = "next_power_of_two"
    prefill_body = None


def _gpu_used() -> int:
    if PROVIDERS[0] != "CUDAExecutionProvider":
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def _sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def _ort_backend(folder, bind_states=True, profile=False, form=None, body=None, order="priority_based"):
    import onnxruntime as ort

    from gdn_deploy.runtime.backends import OnnxRuntimeBackend
    provs = [(p, {"arena_extend_strategy": ARENA[_ARGS.arena]}) if p == "CUDAExecutionProvider" else p
             for p in PROVIDERS]
    be = OnnxRuntimeBackend(folder, providers=provs, bind_states=bind_states, attention_form=form,
                            prefill_body=body or _ARGS.prefill_body)
    if profile or order != "priority_based":
        be.options.enable_profiling = profile
        be.options.execution_order = getattr(ort.ExecutionOrder, order.upper())
        for g in ("prefill", "decode"):
            be.sessions.pop(g)
            be._open(g)
    got = be.sessions["prefill"].get_providers()
    if got[0] != PROVIDERS[0]:
        raise SystemExit(f"bench_ort_cuda: the prefill session runs on {got}, not {PROVIDERS[0]}")
    return be


def _profile_summary(path: str, top: int = 12) -> list[str]:
    """Kernel time per execution provider and the top ops of an onnxruntime profile file."""
    events = json.loads(Path(path).read_text())
    by_prov, by_op = defaultdict(float), defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        if a.get("op_name") not in ("If", "Loop", "Scan"):     # their time includes their subgraphs' nodes
            by_prov[a.get("provider", "?")] += e["dur"] / 1e3
        by_op[(a.get("op_name", "?"), a.get("provider", "?"))] += e["dur"] / 1e3
    out = ["| execution provider | kernel ms (If/Loop/Scan bodies counted once) |", "|---|---|"]
    out += [f"| {p} | {ms:.2f} |" for p, ms in sorted(by_prov.items(), key=lambda kv: -kv[1])]
    out += ["", "| op | provider | ms |", "|---|---|---|"]
    out += [f"| {op} | {p} | {ms:.2f} |" for (op, p), ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]]
    return out


def state_bytes(model, T: int) -> int:
    """Bytes of one sequence's states after T tokens: GDN conv + fp32 recurrent states, KV caches of T rows."""
    n = 0
    for layer in model.layers:
        if layer.layer_type == "linear_attention":
            conv, rec = layer.linear_attn.init_states(1, torch.float16, "meta")
            n += conv.numel() * 2 + rec.numel() * rec.element_size()
        else:
            a = layer.self_attn
            n += 2 * a.num_kv_heads * T * a.head_dim * 2
    return n


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="mid", choices=["tiny", "mid"])
    ap.add_argument("--layers", type=int, default=4,
                    help="layers of the random model (three GDN layers, then full attention, repeated)")
    ap.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--prefill-lens", default="1024,8192,32768")
    ap.add_argument("--decode-batches", default="1,8")
    ap.add_argument("--decode-prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile-len", type=int, default=8192, help="0: no onnxruntime profile")
    ap.add_argument("--prefill-chunk", default="4096",
                    help="comma list: also time each prompt longer than a size fed in continued pieces of that many "
                         "tokens (generate's prefill_chunk; 0: one call only)")
    ap.add_argument("--prefill-body", default=None,
                    help="comma list of the gdn prefill bodies the sessions load (runtime/ort_attention.py: "
                         "exported, linear_attention), each prefill row timed with each in turn on a fresh backend "
                         "(an A/B in one process; decode and the profile use the first); default: the CUDA "
                         "provider's default, linear_attention where onnxruntime has it")
    ap.add_argument("--execution-order", default="priority_based",
                    help="comma list of onnxruntime execution orders (priority_based: the runtime's; default: "
                         "onnxruntime's own default, what a bare InferenceSession gets), each prefill row timed with "
                         "each in turn on a fresh backend, like --prefill-body")
    ap.add_argument("--arena", default="next_power_of_two", choices=sorted(ARENA),
                    help="the CUDA provider's arena_extend_strategy (onnxruntime's default: next_power_of_two)")
    ap.add_argument("--form-check", type=int, default=1,
                    help="1: also run the first length with the attention forms the CUDA provider does not use by "
                         "default (runtime/ort_attention.py: exported, expanded) and report their logits' error")
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script on onnxruntime's CPU provider (no torch/HF rows)")
    args = ap.parse_args(argv)
    bodies = [b for b in (args.prefill_body or "").split(",") if b] or [None]
    bad = [b for b in bodies if b not in (None, "exported", "linear_attention")]
    if bad:
        ap.error(f"--prefill-body: {bad[0]!r} is not exported or linear_attention")
    orders = [o for o in args.execution_order.split(",") if o]
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        ap.error(f"--execution-order: {(bad or [''])[0]!r} is not one of {', '.join(ORDERS)}")
    _ARGS.arena, _ARGS.prefill_body = args.arena, bodies[0]
    if args.device == "cpu":
        PROVIDERS[:] = ["CPUExecutionProvider"]
    lens = [int(x) for x in args.prefill_lens.split(",") if x]
    batches = [int(x) for x in args.decode_batches.split(",") if x]
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_ort_cuda: needs a CUDA GPU")
    import onnxruntime as ort
    if args.device == "cuda" and hasattr(ort, "preload_dlls"):
        try:       # CUDA / cuDNN from the nvidia-* wheels torch brought (torch's own copies are already loaded)
            ort.preload_dlls()
        except Exception as e:  # noqa: BLE001
            print(f"onnxruntime.preload_dlls: {e}", flush=True)
    if PROVIDERS[0] not in ort.get_available_providers():
        raise SystemExit(f"bench_ort_cuda: onnxruntime {ort.__version__} has no {PROVIDERS[0]} "
                         "(install onnxruntime-gpu)")
    from bench_generate import CONFIGS, bench_hf, build_hf, fla_status

    from gdn_deploy.errors import quiet_warnings
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.lm.hf_folder import load_hf_causal_lm
    from gdn_deploy.runtime.folder import ExportFolder
    from gdn_deploy.runtime.generation import generate
    quiet_warnings(True)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    V = CONFIGS[args.config]["vocab_size"]
    top = max(lens + [args.decode_prompt]) + args.new
    tmp = Path(tempfile.mkdtemp(prefix="bench_ort_cuda_"))
    hf = build_hf(args.config, tmp / "hf", max_positions=top + 64, layers=args.layers)
    t0 = time.perf_counter()
    export_model(load_targets(str(tmp / "hf"))[0], tmp / "out",
                 ExportOptions(precision=args.precision, verify=False, max_context=top, max_tokens=max(lens)))
    export_s = time.perf_counter() - t0
    folder = ExportFolder(tmp / "out")
    weights = (tmp / "out" / "weights.data").stat().st_size
    print(f"exported ({args.precision}) in {export_s:.1f} s; weights.data {weights / 1e9:.3f} GB", flush=True)
    ours16 = load_hf_causal_lm(tmp / "hf", dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    prompt = {L: torch.randint(0, V, (L,), generator=gen).tolist() for L in lens}
    rows: dict = dict(env=dict(gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu", onnxruntime=ort.__version__, torch=torch.__version__,
                               fla=fla_status(), precision=args.precision, config=args.config,
                               export_s=export_s, weights_bytes=weights), prefill=[], decode=[])

    # ---- onnxruntime CUDA -------------------------------------------------------------------------------
    # every (length, prefill form) on a fresh backend: onnxruntime's arena keeps its peak, so the memory held after
    # a call is that call's peak only when nothing bigger ran in the same sessions before it
    first_logits, body_logits = None, {}
    chunks = [int(x) for x in args.prefill_chunk.split(",") if x and int(x) > 0]
    for L, c, body, order in [(L, c, b, o) for L in lens for c in [None] + [c for c in chunks if L > c]
                              for b in bodies for o in orders]:
        base = _gpu_used()
        try:
            be = _ort_backend(folder, body=body, order=order)
            session_bytes = _gpu_used() - base
            kw = {"prefill_chunk": c} if c else {}
            generate(folder, be, [prompt[L]], 1, eos_token_ids=[], **kw)          # warm-up at this length
            ts = []
            for _ in range(args.repeats):
                r = generate(folder, be, [prompt[L]], 1, eos_token_ids=[], **kw)
                ts.append(r.prefill_seconds)
            loaded = be.prefill_bodies.get("prefill")
            if first_logits is None:
                first_logits = r.prefill_logits[0].double()
                rows["env"]["prefill_body"] = loaded
            if L == lens[0] and not c:
                body_logits.setdefault(loaded, r.prefill_logits[0].double())
            row = dict(tokens=L, chunk=c, body=loaded, order=order, ort_s=statistics.median(ts),
                       ort_held_bytes=_gpu_used() - base,
                       ort_session_bytes=session_bytes,
                       need_bytes=weights + state_bytes(ours16, L + 1),
                       tt_scores_bytes=4 * L * L * max(a.self_attn.num_heads for a in ours16.layers
                                                        if a.layer_type != "linear_attention"))
        except Exception as e:  # noqa: BLE001  (report the failure at this length, go on)
            row = dict(tokens=L, chunk=c, body=body, order=order, ort_error=str(e).splitlines()[0][:300],
                       ort_held_bytes=_gpu_used() - base)
        be = None
        gc.collect()
        rows["prefill"].append(row)
        print(row, flush=True)
    if args.form_check:        # the other attention forms (runtime/ort_attention.py) at the first length
        for form in ("exported", "expanded"):
            try:
                bg = _ort_backend(folder, form=form)
                rg = generate(folder, bg, [prompt[lens[0]]], 1, eos_token_ids=[])
                rows["env"][f"{form}_logits"] = gl = rg.prefill_logits[0].double()
                if first_logits is not None:
                    rows["env"][f"{form}_vs_default_rel"] = float((gl - first_logits).norm() / first_logits.norm())
                del bg
                gc.collect()
            except Exception as e:  # noqa: BLE001
                rows["env"][f"{form}_error"] = str(e).splitlines()[0][:300]
    be = _ort_backend(folder)
    for B in batches:
        ps = [torch.randint(0, V, (args.decode_prompt,), generator=gen).tolist() for _ in range(B)]
        for bind in (True, False):
            try:
                b2 = be if bind else _ort_backend(folder, bind_states=False)
                generate(folder, b2, ps, 4, eos_token_ids=[])
                ms = []
                for _ in range(args.repeats):
                    r = generate(folder, b2, ps, args.new, eos_token_ids=[])
                    ms.append(1e3 * r.decode_seconds / r.decode_steps)
                rows["decode"].append(dict(batch=B, prompt=args.decode_prompt, runtime="onnxruntime CUDA, states "
                                           + ("bound on the GPU (IOBinding)" if bind else "in/out through the host"),
                                           ms_per_step=statistics.median(ms)))
            except Exception as e:  # noqa: BLE001
                rows["decode"].append(dict(batch=B, runtime=f"onnxruntime CUDA bind={bind}",
                                           error=str(e).splitlines()[0][:300]))
            print(rows["decode"][-1], flush=True)
    if args.profile_len:
        try:
            bp = _ort_backend(folder, profile=True)
            p = torch.randint(0, V, (args.profile_len,), generator=gen).tolist()
            generate(folder, bp, [p], 1, eos_token_ids=[])
            rows["profile"] = _profile_summary(bp.sessions["prefill"].end_profiling())
            del bp
        except Exception as e:  # noqa: BLE001
            rows["profile"] = [f"profile failed: {str(e).splitlines()[0][:300]}"]
    del be
    gc.collect()
    if args.device == "cpu":
        for form in ("exported", "expanded"):
            rows["env"].pop(f"{form}_logits", None)
        print(json.dumps(rows, indent=1))
        return 0

    # ---- ours (PyTorch on the gdn CUDA kernels) and HF + FLA, bf16 -------------------------------------
    import gdn_deploy.ops  # noqa: F401  (registers the CUDA kernels)
    from gdn_deploy import kernels
    from gdn_deploy.lm.generate import pack_prompts
    have_kernels = kernels.status().available
    ours16 = ours16.to("cuda")
    hf32 = hf.to("cuda")
    with torch.no_grad():
        ref = hf32(input_ids=torch.tensor([prompt[lens[0]]], device="cuda")).logits[0, -1].double().cpu()
    if first_logits is not None:
        rows["env"]["ort_logits_rel_err_vs_hf_fp32"] = float((first_logits - ref).norm() / ref.norm())
        rows["env"]["ort_argmax_equal_hf_fp32"] = bool(first_logits.argmax() == ref.argmax())
    for form in ("exported", "expanded"):
        gl = rows["env"].pop(f"{form}_logits", None)
        if gl is not None:
            rows["env"][f"ort_{form}_logits_rel_err_vs_hf_fp32"] = float((gl - ref).norm() / ref.norm())
    for body, gl in body_logits.items():
        rows["env"][f"ort_{body}_body_logits_rel_err_vs_hf_fp32"] = float((gl - ref).norm() / ref.norm())
    hf16 = hf32.to(torch.bfloat16)
    del hf32
    done = set()
    for row in rows["prefill"]:
        if row.get("chunk") or row["tokens"] in done:      # ours / HF once per length, on its first one-call row
            continue
        L = row["tokens"]
        done.add(L)
        ids = torch.tensor([prompt[L]], device="cuda")
        with torch.no_grad():
            if have_kernels:
                pid, cu = pack_prompts([prompt[L]], "cuda")
                fn = lambda: ours16.forward_prefill(pid, cu, last_only=True)  # noqa: E731
                fn()
                row["ours_s"] = statistics.median(_sync_time(fn)[0] for _ in range(args.repeats))
            try:
                hf16(input_ids=ids)
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                row["hf_s"] = statistics.median(_sync_time(lambda: hf16(input_ids=ids))[0]
                                                for _ in range(args.repeats))
                row["hf_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - before
            except torch.OutOfMemoryError as e:
                row["hf_error"] = str(e).splitlines()[0][:200]
        torch.cuda.empty_cache()
        print(row, flush=True)
    for B in batches:
        ps = [torch.randint(0, V, (args.decode_prompt,), generator=gen).tolist() for _ in range(B)]
        _, d, _ = bench_hf(hf16, ps, args.new, args.repeats, "cuda")
        rows["decode"].append(dict(batch=B, prompt=args.decode_prompt, runtime=f"HF + {fla_status()} (bf16)",
                                   ms_per_step=1e3 * B / d))
        print(rows["decode"][-1], flush=True)

    (out_dir / "bench_ort_cuda.json").write_text(json.dumps(rows, indent=2) + "\n")
    e = rows["env"]
    md = [f"# bench_ort_cuda ({e['gpu']}, onnxruntime {e['onnxruntime']}, torch {e['torch']}, {e['fla']}; "
          f"{args.config} config, {args.layers} layers, exported {args.precision} in {export_s:.0f} s, weights {weights / 1e9:.3f} GB)", "",
          f"onnxruntime's last-token logits at {lens[0]} tokens vs HF float32 on the GPU: norm-relative "
          f"{e.get('ort_logits_rel_err_vs_hf_fp32', float('nan')):.2e}, same argmax: "
          f"{e.get('ort_argmax_equal_hf_fp32')} (default form: GroupQueryAttention with its total sequence length "
          "fed from the host, runtime/ort_attention.py)" + "".join(
              f"; {form} form: norm-relative {e[f'ort_{form}_logits_rel_err_vs_hf_fp32']:.2e}"
              if f"ort_{form}_logits_rel_err_vs_hf_fp32" in e else
              (f"; {form} form: {e[f'{form}_error']}" if f"{form}_error" in e else "")
              for form in ("exported", "expanded")), "",
          f"onnxruntime CUDA arena: {args.arena}; gdn prefill body (decode rows): {e.get('prefill_body', '?')}"
          + "".join(f"; logits with the {b} body vs HF float32: {e[k]:.2e}" for b in body_logits
                    if (k := f"ort_{b}_body_logits_rel_err_vs_hf_fp32") in e), "",
          "| prefill tokens | fed as | gdn body | execution order | onnxruntime CUDA s | GPU memory held: sessions / after (GB) | weights + "
          "states (GB) | [T, T] fp32 scores of all heads (GB) | ours (PyTorch + gdn kernels, bf16) s | HF + FLA "
          "(bf16) s | HF peak activations (GB) |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "–"
    for r in rows["prefill"]:
        md.append(f"| {r['tokens']} | {'one call' if not r.get('chunk') else 'pieces of ' + str(r['chunk'])} | "
                  f"{r.get('body') or '–'} | {r.get('order', '–')} | {f(r.get('ort_s'), '.3f') if 'ort_s' in r else r.get('ort_error')} | "
                  f"{f(r.get('ort_session_bytes', float('nan')) / 1e9, '.2f')} / {r['ort_held_bytes'] / 1e9:.2f} | "
                  f"{f(r.get('need_bytes', 0) / 1e9, '.2f')} | "
                  f"{f(r.get('tt_scores_bytes', 0) / 1e9, '.1f')} | {f(r.get('ours_s'), '.4f')} | "
                  f"{f(r.get('hf_s'), '.4f') if 'hf_s' in r else r.get('hf_error', '–')} | "
                  f"{f(r['hf_peak_extra_bytes'] / 1e9, '.2f') if 'hf_peak_extra_bytes' in r else '–'} |")
    md += ["", "| decode batch x prompt | runtime | ms per step |", "|---|---|---|"]
    md += [f"| {r['batch']} x {r.get('prompt', '')} | {r['runtime']} | "
           f"{f(r.get('ms_per_step'), '.3f') if 'ms_per_step' in r else r.get('error')} |" for r in rows["decode"]]
    if rows.get("profile"):
        md += ["", f"onnxruntime profile of one {args.profile_len}-token prefill:", ""] + rows["profile"]
    (out_dir / "bench_ort_cuda.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
