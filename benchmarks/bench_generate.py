"""Generation throughput of whole hybrid models: our exported graphs / our PyTorch model beside HF transformers.

  python benchmarks/bench_generate.py [--configs tiny,mid] [--device cpu|cuda] [--prompts 4] [--prompt-len 128]
                                      [--new 32] [--repeats 3] [--out DIR]

Per config a random Hugging Face Qwen3.5 model is built in memory (no downloads; transformers needed), saved, and
loaded by gdn-deploy. Throughput (tokens/s, median of --repeats after a warm-up):
- prefill: prompt tokens of the batch / time of the one packed prefill call (ours) or of HF's forward on the
  [prompts, prompt_len] batch (equal lengths: HF needs no padding);
- decode: tokens produced by the decode steps / their time (ours: one call per step for the batch; HF: the time of
  generate(max_new_tokens=1 + new) minus generate(max_new_tokens=1), i.e. its cached decode steps).

--device cpu (default): onnxruntime CPU on the exported fp32 graphs (gdn nodes through their function bodies),
our PyTorch model (fp32, the reference GDN path) and HF eager (its PyTorch fallback). --device cuda: our PyTorch
model in bf16 on the gdn CUDA kernels and HF in bf16 (FLA's kernels when fla-core is importable: HF picks them
up itself) on the same GPU. Configs: ``tiny`` (hidden 256, 4 layers, GDN K=V=128) and ``mid`` (Qwen3.5-0.8B shapes:
hidden 1024, 8/2 attention heads of 256, 16 GDN heads K=V=128, MLP 3584, with 4 layers (3 GDN + 1 attention) and a
32K vocabulary instead of 24 layers and 248K), ``moe`` (Qwen3-Next-shaped: the mid shapes with 32 GDN value heads
and every MLP a 64-expert top-8 MoE with a shared expert; decode gathers each token's k experts). Writes
bench_generate.json and a markdown table to --out.

--ort-steps (cpu): onnxruntime decode step time in ms with the states bound in place (runtime/ort_binding.py: KV
caches one buffer for past and present, GDN states ping-ponged) and passed in and out as tensors (make_backend(...,
bind_states=False): onnxruntime clears and refills each present cache, and every output is copied), at batches
--step-batches and past lengths --step-contexts (random states at that past length: a step's cost does not depend on
their values), the two alternated --repeats times in one process; medians.

--genai PYTHON (cpu): side by side with onnxruntime-genai (installed in another Python, e.g. a venv, so the
repository's onnxruntime stays as it is): the config is saved as a Qwen3_5ForConditionalGeneration folder (what its
builder takes) with a word-level tokenizer; gdn-export and its builder (``-p fp32 -e cpu``) both export that folder;
prefill of one prompt at --genai-prefill lengths and decode at --genai-batches (prompts of --prompt-len, --new
tokens) run alternately, ours and then its (benchmarks/genai_runner.py in that Python), --repeats times; medians.
Decode rows also give each side's CPU ms per step (the calling thread's CPU time: with --threads 1 onnxruntime runs
in it, so other processes on a shared machine change it far less than the wall clock; ours over the decode calls,
its over generate_next_token, which includes its sampling).

--engine-batches 1,8,64 (cuda): per decode step in ms at each batch size (prompts of --prompt-len), side by side:
the graphed engine (gdn_deploy.runtime.cuda_engine: state pools, one CUDA graph per batch bucket) fused by
torch.compile (fuse=True), by default (the Triton glue kernels of gdn_deploy.lm.triton_ops) and with the glue on
eager torch ops (triton_ops.ENABLED off), the default step eager, the model's forward_decode (the runtime's eager
path) and HF (+ FLA) (its decode tok/s turned into ms per step), with the byte floor: weights (MoE: only the experts
the batch can reach) + GDN states + the filled KV read once at the copy bandwidth measured in the same run.
--engine-only skips the throughput rows above (which time prefill with and without the Triton glue).
--profile also writes the prefill's kernel tables (ours with the glue, HF) to --out/profile_<config>_prefill.md.
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

CONFIGS = {
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4),
    "mid": dict(vocab_size=32768, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4),
    # Qwen3-Next-shaped MoE (GVA 16 -> 32 value heads; every layer's MLP: 64 experts, top 8, + a shared expert)
    "moe": dict(vocab_size=32768, hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
                shared_expert_intermediate_size=256, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
}
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]


def build_hf(name: str, folder: Path, max_positions: int = 8192, layers: int | None = None):
    """The random HF model of config ``name`` saved to ``folder``; ``layers``: that many layers instead of 4, in
    the same pattern (three GDN layers, then full attention)."""
    import transformers as tf
    torch.manual_seed(0)
    n = layers or len(LAYER_TYPES)
    types = [LAYER_TYPES[i % len(LAYER_TYPES)] for i in range(n)]
    if name == "moe":
        c = dict(CONFIGS[name], num_hidden_layers=n, layer_types=types, max_position_embeddings=max_positions, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25))
        model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**c)).eval()
    else:
        c = dict(CONFIGS[name], num_hidden_layers=n, layer_types=types, max_position_embeddings=max_positions,
                 tie_word_embeddings=True,
                 rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                      mrope_section=[11, 11, 10], mrope_interleaved=True))
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**c)).eval()
    with torch.no_grad():     # non-trivial gates so the GDN state does real work
        for m in model.modules():
            if hasattr(m, "A_log") and hasattr(m, "dt_bias"):
                m.A_log.uniform_(-2.0, 1.0)
                m.dt_bias.uniform_(-1.0, 1.0)
    model.save_pretrained(str(folder))
    return model


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def bench_ours(folder, backend, prompts, new, repeats):
    from gdn_deploy.runtime.generation import generate
    generate(folder, backend, prompts, min(new, 4), eos_token_ids=[])            # warm-up
    pre, dec = [], []
    for _ in range(repeats):
        r = generate(folder, backend, prompts, new, eos_token_ids=[])
        pre.append(sum(len(p) for p in prompts) / r.prefill_seconds)
        dec.append(r.decode_tokens / r.decode_seconds)
    return _median(pre), _median(dec), r.tokens


def bench_model_cuda(model, prompts, new, repeats, attention="auto", profile_path=None):
    """Our HybridLM on the GPU (GDN layers on the gdn CUDA kernels): one packed prefill, one decode per step.
    ``attention``: forward_prefill's form of per-sequence attention ("spans": fused per sequence, eager's
    default; "mask": the [T, T] block-diagonal mask the exported graphs hold). ``profile_path``: append the
    prefill's kernel table there."""
    from gdn_deploy.lm.generate import pack_prompts
    from gdn_deploy.lm.model import decode_states_from_prefill
    ids, cu = pack_prompts(prompts, "cuda")
    lens = torch.tensor([len(p) for p in prompts], device="cuda")
    cap = int(lens.max()) + new

    def once(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits, st = model.forward_prefill(ids, cu, last_only=True, attention=attention)
        torch.cuda.synchronize()
        t_pre = time.perf_counter() - t0
        st = decode_states_from_prefill(model.hybrid_config, st, cu, cap)
        pos, toks = lens.clone(), []
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            nxt = logits.float().argmax(-1)
            toks.append(nxt)
            logits, st = model.forward_decode(nxt, pos, st)
            pos = pos + 1
        torch.cuda.synchronize()
        return t_pre, time.perf_counter() - t0, torch.stack(toks, 1).tolist()

    with torch.no_grad():
        once(4)                                                                   # warm-up
        if profile_path is not None:
            profile_step(lambda: model.forward_prefill(ids, cu, last_only=True, attention=attention), profile_path,
                         f"ours, prefill {len(prompts)} x {len(prompts[0])} (attention {attention}, Triton glue: "
                         f"{_glue()})")
        pre, dec = [], []
        for _ in range(repeats):
            t_pre, t_dec, toks = once(new)
            pre.append(ids.numel() / t_pre)
            dec.append(len(prompts) * new / t_dec)
    return _median(pre), _median(dec), toks


def bench_hf(model, prompts, new, repeats, device, profile_path=None):
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    model.generation_config.eos_token_id = None

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        return time.perf_counter() - t0, out

    with torch.no_grad():
        model(input_ids=ids)                                                       # warm-up
        if profile_path is not None:
            profile_step(lambda: model(input_ids=ids), profile_path,
                         f"HF ({fla_status()}), prefill {ids.shape[0]} x {ids.shape[1]}")
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4)
        pre, dec = [], []
        for _ in range(repeats):
            t_fwd, _ = timed(lambda: model(input_ids=ids))
            t1, _ = timed(lambda: model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=1))
            tn, out = timed(lambda: model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=1 + new))
            pre.append(ids.numel() / t_fwd)
            dec.append(ids.shape[0] * new / max(tn - t1, 1e-9))
    return _median(pre), _median(dec), out[:, ids.shape[1]:].tolist()


def _cuda_ms(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of 1 GiB)."""
    a = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    ms = _cuda_ms(lambda: b.copy_(a), 10)
    return 2 * a.numel() * a.element_size() / (ms * 1e-3)


def byte_floor(model, B: int, L: int, bw: float) -> float:
    """ms to read weights + GDN states + B sequences' L cached keys/values once at bw bytes/s (MoE layers: the
    experts B tokens x top-k can reach, at most all)."""
    from gdn_deploy.lm.mlp import SparseMoE
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model.layers:
        if isinstance(layer.mlp, SparseMoE):
            c = layer.mlp.config
            e = sum(p.numel() * p.element_size() for p in layer.mlp.experts.parameters())
            n -= e - e * min(c.num_experts, B * c.top_k) // c.num_experts
        if layer.layer_type == "linear_attention":
            conv, rec = layer.linear_attn.init_states(1, device="meta")
            n += B * (conv.numel() * conv.element_size() + rec.numel() * 4)
        else:
            a = layer.self_attn
            n += B * L * 2 * a.num_kv_heads * a.head_dim * model.embed_tokens.weight.element_size()
    return n / bw * 1e3


def profile_step(fn, path: Path, label: str) -> None:
    """torch.profiler over 3 calls of ``fn`` (after a warm-up): the GPU kernels with their times, by total time,
    and their count per call, into ``path`` (a text table)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    ev.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in ev) / 3
    lines = [f"# {label}: {sum(e.count for e in ev) / 3:.0f} GPU kernels per step, {total:.1f} us of kernel time per "
             "step (3 steps profiled)", "| us per step | calls per step | kernel |", "|---|---|---|"]
    lines += [f"| {e.device_time_total / 3:.1f} | {e.count / 3:.0f} | {e.key[:110]} |" for e in ev]
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines[:25]), flush=True)


def bench_engine_steps(model, hf16, batches, prompt_len, steps, rows, name, profile_dir=None):
    from gdn_deploy.lm.generate import pack_prompts
    from gdn_deploy.lm.model import decode_states_from_prefill
    from gdn_deploy.runtime.cuda_engine import DecodeEngine
    bw = copy_bandwidth()
    V = model.hybrid_config.vocab_size
    gen = torch.Generator().manual_seed(2)
    from gdn_deploy.lm import triton_ops
    # (label, graphs, fuse, Triton glue kernels, small-M GEMV): the default is graphed, unfused, with the glue
    # kernels and the GEMV (engine_graph_cublas_ms: the same with cuBLAS projections, GDN_GEMV=0)
    variants = (("engine_graph_ms", True, True, True, True), ("engine_graph_unfused_ms", True, False, True, True),
                ("engine_graph_cublas_ms", True, False, True, False),
                ("engine_graph_torchglue_ms", True, False, False, True), ("engine_eager_ms", False, False, True, True))
    for B in batches:
        prompts = [torch.randint(0, V, (prompt_len,), generator=gen).tolist() for _ in range(B)]
        cap = prompt_len + 3 * steps + 8
        row = dict(config=name, batch=B, prompt_len=prompt_len, floor_ms=byte_floor(model, B, prompt_len, bw),
                   copy_bw_GBs=bw / 1e9)
        ids = torch.randint(0, V, (B,), device="cuda")
        with torch.no_grad():
            for label, graphs, fuse, glue, gemv in variants:
                triton_ops.ENABLED = glue
                gemv_env = os.environ.get("GDN_GEMV")
                try:
                    t0 = time.perf_counter()
                    if not gemv:
                        os.environ["GDN_GEMV"] = "0"         # read when the engine builds its layer functions
                    eng = DecodeEngine(model, pool_size=max(batches), capacity=cap, graphs=graphs, fuse=fuse)
                    row[label.replace("_ms", "_gemv")] = bool(getattr(eng.decoder.fns, "gemv", False))
                    row[label.replace("_ms", "_setup_s")] = time.perf_counter() - t0
                    slots, _ = eng.add(prompts)
                    sl = torch.tensor(slots, device="cuda")
                    row[label] = _cuda_ms(lambda: eng.decoder.step(ids, sl), steps)
                    if profile_dir is not None and graphs and (glue or B == batches[0]):
                        profile_step(lambda: eng.decoder.step(ids, sl), Path(profile_dir) / f"profile_{name}_step.md",
                                     f"{name} batch {B} x {prompt_len}, {label[:-3]} (fused: {eng.decoder.fns.fuse}, "
                                     f"Triton glue: {glue})")
                    del eng
                finally:
                    triton_ops.ENABLED = True
                    if gemv_env is None:
                        os.environ.pop("GDN_GEMV", None)
                    else:
                        os.environ["GDN_GEMV"] = gemv_env
            pids, cu = pack_prompts(prompts, "cuda")
            _, st = model.forward_prefill(pids, cu, last_only=True)
            st = decode_states_from_prefill(model.hybrid_config, st, cu, cap)
            pos = torch.full((B,), prompt_len, device="cuda")
            row["forward_decode_ms"] = _cuda_ms(lambda: model.forward_decode(ids, pos, st), steps)
        _, d, _ = bench_hf(hf16, prompts, steps, 2, "cuda")
        row["hf_ms"] = B / d * 1e3
        row["floor_fraction"] = row["floor_ms"] / row["engine_graph_ms"]
        row["floor_fraction_default"] = row["floor_ms"] / row["engine_graph_unfused_ms"]
        row["speedup_vs_hf"] = row["hf_ms"] / row["engine_graph_ms"]
        rows.append(row)
        print(row, flush=True)
        torch.cuda.empty_cache()


def _agreement(a, b) -> float:
    """Fraction of generated positions where two runs agree, up to their first difference (a timing run's sanity
    check: HF's default init gives near-uniform logits, where argmax ties split runs; the tests check equality)."""
    same = total = 0
    for x, y in zip(a, b):
        total += len(x)
        for u, v in zip(x, y):
            if u != v:
                break
            same += 1
    return same / max(total, 1)


def _glue() -> str:
    from gdn_deploy.lm import triton_ops
    return "on" if triton_ops.ENABLED and triton_ops.triton is not None else "off"


def fla_status() -> str:
    try:
        import fla  # noqa: F401
        return f"fla {getattr(fla, '__version__', '?')}"
    except ImportError:
        return "no fla (HF's PyTorch fallback)"


def _random_states(folder, B: int, past: int, capacity: int, gen) -> dict:
    """Decode states of B sequences at past length ``past``: random GDN states, KV caches random in the filled
    slots (the rest zero)."""
    from gdn_deploy.runtime.states import STATE_DTYPES
    out = {}
    for s in folder.states:
        shape = [B if d == "B" else capacity if d == "S" else int(d) for d in s.decode_shape]
        x = torch.randn(shape, generator=gen).to(STATE_DTYPES[s.dtype]) * 0.1
        if s.kind == "attention":
            x[:, :, past:] = 0
        out[s.decode_input] = x
    return out


def bench_ort_steps(name, folder, args, rows):
    """ms per decode step, states bound in place vs tensors in and out (alternated, medians)."""
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.ort_binding import BoundStates, bound_states_for
    bound_be = make_backend("onnxruntime", folder, threads=args.threads)
    plain = make_backend("onnxruntime", folder, threads=args.threads, bind_states=False)
    if bound_states_for(folder, bound_be) is None:
        raise SystemExit("bench_generate --ort-steps: this folder's graphs cannot be bound in place")
    gen = torch.Generator().manual_seed(3)
    steps = max(2, args.new)
    for P in [int(x) for x in args.step_contexts.split(",")]:
        for B in [int(x) for x in args.step_batches.split(",")]:
            states = _random_states(folder, B, P, P + steps + 1, gen)
            ids = torch.randint(0, folder.vocab_size, (B,), generator=gen)
            times = {"tensors": [], "bound": []}
            for _ in range(args.repeats):
                for mode in ("tensors", "bound"):
                    st = {k: v.clone() for k, v in states.items()}
                    bound = BoundStates(folder, bound_be) if mode == "bound" else None
                    if bound is not None:
                        bound.load(st)
                    per = []
                    for j in range(steps):
                        feed = {"input_ids": ids, "positions": torch.full((B,), P + j, dtype=torch.long)}
                        t0 = time.perf_counter()
                        if bound is None:
                            out = plain.run("decode", {**feed, **st})
                            st = {s.decode_input: out[s.decode_output] for s in folder.states}
                        else:
                            bound.run("decode", feed)
                        per.append(time.perf_counter() - t0)
                    times[mode].append(_median(per[1:]) * 1e3)       # the first step of a run: warm-up
            row = dict(config=name, kind="ort_step", batch=B, past=P, tensors_ms=_median(times["tensors"]),
                       bound_ms=_median(times["bound"]), tensors_all=times["tensors"], bound_all=times["bound"])
            row["speedup"] = row["tensors_ms"] / row["bound_ms"]
            rows.append(row)
            print(row, flush=True)


def build_hf_vl(name: str, folder: Path, max_positions: int) -> None:
    """The config as a Qwen3_5ForConditionalGeneration folder (a tiny random vision tower; the text model as
    build_hf makes it) with a word-level tokenizer: what onnxruntime-genai's builder takes."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers
    V = CONFIGS[name]["vocab_size"]
    rd = int(CONFIGS[name]["head_dim"] * 0.25) // 2                      # rotary frequencies (32: [11, 11, 10])
    text = dict(CONFIGS[name], layer_types=LAYER_TYPES, max_position_embeddings=max_positions,
                tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                     mrope_section=[rd - 2 * (rd // 3) - 1, rd // 3 + 1, rd // 3],
                                     mrope_interleaved=True))
    vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    cfg = tf.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False, image_token_id=V - 1,
                           video_token_id=V - 2, vision_start_token_id=V - 3, vision_end_token_id=V - 4)
    cfg.text_config.eos_token_id = cfg.eos_token_id = 0
    torch.manual_seed(0)
    model = tf.Qwen3_5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "A_log") and hasattr(m, "dt_bias"):
                m.A_log.uniform_(-2.0, 1.0)
                m.dt_bias.uniform_(-1.0, 1.0)
    model.save_pretrained(str(folder))
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w0", unk_token="w1").save_pretrained(str(folder))


class GenaiRunner:
    """benchmarks/genai_runner.py in another Python: one JSON request/answer per line."""

    def __init__(self, python: str, model_dir: Path, threads: int):
        import subprocess
        self.proc = subprocess.Popen([python, str(Path(__file__).with_name("genai_runner.py")), str(model_dir),
                                      "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        first = self.proc.stdout.readline().split()
        if not first or first[0] != "ready":
            raise SystemExit(f"bench_generate --genai: the runner did not start ({' '.join(first)})")
        self.version = first[1] if len(first) > 1 else "?"

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_side_by_side(name, args, rows):
    """Our export and onnxruntime-genai's of one Qwen3_5ForConditionalGeneration checkpoint, alternated (with
    --ort-steps, those rows first, on the same export)."""
    import subprocess
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.folder import ExportFolder
    from gdn_deploy.runtime.generation import generate
    lengths = [int(x) for x in args.genai_prefill.split(",")]
    batches = [int(x) for x in args.genai_batches.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_genai_{name}_"))
    build_hf_vl(name, tmp / "hf", max(max(lengths), args.prompt_len + args.new) + 64)
    t0 = time.perf_counter()
    export_model(load_targets(str(tmp / "hf"))[0], tmp / "ours", ExportOptions(verify=False))
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([args.genai, "-m", "onnxruntime_genai.models.builder", "-i", str(tmp / "hf"), "-o",
                    str(tmp / "genai"), "-p", "fp32", "-e", "cpu", "-c", str(tmp / "cache")], check=True,
                   stdout=subprocess.DEVNULL)
    t_genai = time.perf_counter() - t0
    size = {k: sum(f.stat().st_size for f in (tmp / k).rglob("*") if f.is_file()) for k in ("ours", "genai")}
    rows.append(dict(config=name, kind="export", ours_s=t_ours, genai_s=t_genai, ours_bytes=size["ours"],
                     genai_bytes=size["genai"]))
    print(rows[-1], flush=True)
    folder = ExportFolder(tmp / "ours")
    if args.ort_steps:
        bench_ort_steps(name, folder, args, rows)
    ours = make_backend("onnxruntime", folder, threads=args.threads)
    genai = GenaiRunner(args.genai, tmp / "genai", args.threads)
    V = CONFIGS[name]["vocab_size"]
    gen = torch.Generator().manual_seed(4)
    try:
        for L in sorted(lengths, key=lambda n: (n > 2048, n)):      # the longest after the decode rows
            if L > 2048 and not any(r.get("kind") == "decode" and r["config"] == name for r in rows):
                _side_decode(name, args, rows, folder, ours, genai, batches, gen, V)
            prompt = torch.randint(0, V, (L,), generator=gen).tolist()
            a, b, same = [], [], []
            for _ in range(args.repeats):
                r = generate(folder, ours, [prompt], 1, eos_token_ids=[])
                a.append(r.prefill_seconds)
                g = genai.ask(op="prefill", tokens=prompt)
                b.append(g["seconds"])
                same.append(r.tokens[0][0] == g["next"])
            rows.append(dict(config=name, kind="prefill", tokens=L, ours_s=_median(a), genai_s=_median(b),
                             ours_all=a, genai_all=b, same_next_token=all(same)))
            print(rows[-1], flush=True)
        if not any(r.get("kind") == "decode" and r["config"] == name for r in rows):
            _side_decode(name, args, rows, folder, ours, genai, batches, gen, V)
    finally:
        genai.close()
    rows.append(dict(config=name, kind="genai_version", version=genai.version))


def _side_decode(name, args, rows, folder, ours, genai, batches, gen, V):
    from gdn_deploy.runtime.generation import generate
    for B in batches:
        prompts = [torch.randint(0, V, (args.prompt_len,), generator=gen).tolist() for _ in range(B)]
        a, b, ca, cb, agree = [], [], [], [], []
        for _ in range(args.repeats):
            r = generate(folder, ours, prompts, args.new, eos_token_ids=[])
            a.append(r.decode_tokens / r.decode_seconds)
            ca.append(r.decode_cpu_seconds / r.decode_steps * 1e3)
            g = genai.ask(op="decode", prompts=prompts, steps=args.new)
            b.append(B * (args.new - 1) / g["seconds"])
            cb.append(g["cpu_seconds"] / (args.new - 1) * 1e3)
            agree.append(_agreement(r.tokens, g["tokens"]))
        rows.append(dict(config=name, kind="decode", batch=B, prompt_len=args.prompt_len, new=args.new,
                         ours_tok_s=_median(a), genai_tok_s=_median(b), ours_all=a, genai_all=b,
                         ours_cpu_ms=_median(ca), genai_cpu_ms=_median(cb), ours_cpu_all=ca, genai_cpu_all=cb,
                         token_agreement=min(agree)))
        print(rows[-1], flush=True)


def run_config(name, args, rows):
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, export_model
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.folder import ExportFolder
    if args.device == "cpu" and args.genai:
        run_side_by_side(name, args, rows)
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_generate_{name}_"))
    hf = build_hf(name, tmp / "hf")
    gen = torch.Generator().manual_seed(1)
    V = CONFIGS[name]["vocab_size"]
    prompts = [torch.randint(0, V, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]
    shape = f"{args.prompts}x{args.prompt_len} +{args.new}"
    if args.device == "cpu" and args.ort_steps:
        export_model(load_targets(str(tmp / "hf"))[0], tmp / "out", ExportOptions(verify=False))
        bench_ort_steps(name, ExportFolder(tmp / "out"), args, rows)
        return
    if args.device == "cpu":
        t0 = time.perf_counter()
        export_model(load_targets(str(tmp / "hf"))[0], tmp / "out", ExportOptions(verify=False))
        print(f"[{name}] exported in {time.perf_counter() - t0:.1f} s", flush=True)
        folder = ExportFolder(tmp / "out")
        for label, be in (("onnxruntime CPU (exported graphs, fp32)",
                           make_backend("onnxruntime", folder, threads=args.threads)),
                          ("gdn-deploy PyTorch CPU (fp32)", make_backend("torch", folder))):
            p, d, toks = bench_ours(folder, be, prompts, args.new, args.repeats)
            rows.append(dict(config=name, shape=shape, runtime=label, prefill_tok_s=p, decode_tok_s=d))
            print(rows[-1], flush=True)
        p, d, hf_toks = bench_hf(hf, prompts, args.new, args.repeats, "cpu")
        rows.append(dict(config=name, shape=shape, runtime="HF transformers eager CPU (fp32)", prefill_tok_s=p,
                         decode_tok_s=d, token_agreement=_agreement(toks, hf_toks)))
        print(rows[-1], flush=True)
    else:
        import gdn_deploy.ops  # noqa: F401  (registers the CUDA kernels)
        from gdn_deploy import kernels
        st = kernels.status()
        if not st.available:
            raise SystemExit(f"bench_generate: gdn CUDA kernels unavailable: {st.reason}")
        from gdn_deploy.lm.hf_folder import load_hf_causal_lm
        model = load_hf_causal_lm(tmp / "hf", dtype=torch.bfloat16).to("cuda")
        if args.engine_batches:
            bench_engine_steps(model, hf.to("cuda", torch.bfloat16), [int(b) for b in args.engine_batches.split(",")],
                               args.prompt_len, args.new, rows, name, profile_dir=args.out if args.profile else None)
        if args.engine_only:
            return
        from gdn_deploy.lm import triton_ops
        prof = Path(args.out) / f"profile_{name}_prefill.md" if args.profile else None
        if prof is not None:
            prof.parent.mkdir(parents=True, exist_ok=True)
        for attention, how, glue in (("spans", "fused attention per sequence", True),
                                     ("spans", "fused attention per sequence, no Triton glue", False),
                                     ("mask", "block-diagonal mask", True)):
            triton_ops.ENABLED = glue
            try:
                p, d, got = bench_model_cuda(model, prompts, args.new, args.repeats, attention,
                                             profile_path=prof if attention == "spans" else None)
            finally:
                triton_ops.ENABLED = True
            if attention == "spans" and glue:
                toks = got                           # the agreement with HF below is of the eager default
            rows.append(dict(config=name, shape=shape, runtime=f"gdn-deploy PyTorch on gdn CUDA kernels (bf16), "
                             f"prefill attention: {how}", prefill_tok_s=p, decode_tok_s=d))
            print(rows[-1], flush=True)
        hf16 = hf.to("cuda", torch.bfloat16)
        p, d, hf_toks = bench_hf(hf16, prompts, args.new, args.repeats, "cuda", profile_path=prof)
        rows.append(dict(config=name, shape=shape, runtime=f"HF transformers bf16 ({fla_status()})",
                         prefill_tok_s=p, decode_tok_s=d, token_agreement=_agreement(toks, hf_toks)))
        print(rows[-1], flush=True)


def side_by_side_tables(rows, args) -> list[str]:
    """Markdown tables of the --ort-steps and --genai rows."""
    out = []
    steps = [r for r in rows if r["kind"] == "ort_step"]
    if steps:
        out += [f"onnxruntime CPU decode step, {args.threads} thread(s), median of {args.repeats} alternated runs:", "",
                "| config | batch | past tokens | tensors in/out ms | bound in place ms | speedup |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['config']} | {r['batch']} | {r['past']} | {r['tensors_ms']:.1f} | {r['bound_ms']:.1f} | "
                f"{r['speedup']:.2f}x |" for r in steps] + [""]
    ver = next((r["version"] for r in rows if r["kind"] == "genai_version"), "?")
    for r in rows:
        if r["kind"] == "export":
            out += [f"export of {r['config']}: gdn-export {r['ours_s']:.1f} s, {r['ours_bytes'] / 1e9:.2f} GB; "
                    f"onnxruntime-genai {ver} builder {r['genai_s']:.1f} s, {r['genai_bytes'] / 1e9:.2f} GB", ""]
    pre = [r for r in rows if r["kind"] == "prefill"]
    if pre:
        out += ["| config | prefill tokens | gdn-export s | onnxruntime-genai s | same next token |",
                "|---|---|---|---|---|"]
        out += [f"| {r['config']} | {r['tokens']} | {r['ours_s']:.2f} | {r['genai_s']:.2f} | "
                f"{r['same_next_token']} |" for r in pre] + [""]
    dec = [r for r in rows if r["kind"] == "decode"]
    if dec:
        out += ["| config | decode batch x prompt | gdn-export tok/s | onnxruntime-genai tok/s | gdn-export CPU ms "
                "per step | onnxruntime-genai CPU ms per step | token agreement |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['config']} | {r['batch']} x {r['prompt_len']} | {r['ours_tok_s']:.1f} | "
                f"{r['genai_tok_s']:.1f} | {r['ours_cpu_ms']:.1f} | {r['genai_cpu_ms']:.1f} | "
                f"{r['token_agreement']:.2f} |" for r in dec] + [""]
    return out


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="tiny,mid")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads of torch and onnxruntime alike (default 1: comparable, and stable on a shared "
                         "machine where oversubscribed OpenMP threads slow torch down many times)")
    ap.add_argument("--engine-batches", default="", help="cuda: per-step ms of the graphed engine at these batch "
                    "sizes (e.g. 1,8,64)")
    ap.add_argument("--engine-only", action="store_true", help="cuda: only the --engine-batches rows")
    ap.add_argument("--profile", action="store_true", help="cuda: torch.profiler kernel tables of the graphed step "
                    "at every --engine-batches size (unfused: the first size) into --out/profile_<config>_step.md")
    ap.add_argument("--ort-steps", action="store_true", help="cpu: onnxruntime decode step ms, states bound in "
                    "place vs tensors in and out, at --step-batches x --step-contexts (only these rows, and --genai's)")
    ap.add_argument("--step-batches", default="1,4,16")
    ap.add_argument("--step-contexts", default="512,2048")
    ap.add_argument("--genai", default="", metavar="PYTHON", help="cpu: side by side with onnxruntime-genai "
                    "installed in this Python (only these rows, and --ort-steps')")
    ap.add_argument("--genai-prefill", default="512,2048,8192")
    ap.add_argument("--genai-batches", default="1,4,16")
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from gdn_deploy.errors import quiet_warnings
    quiet_warnings(True)
    rows: list[dict] = []
    for name in args.configs.split(","):
        run_config(name.strip(), args, rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(device=args.device, torch=torch.__version__, threads=torch.get_num_threads(), fla=fla_status(),
               gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)
    (out / "bench_generate.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")
    lines = ["| config | batch | runtime | prefill tok/s | decode tok/s |", "|---|---|---|---|---|"]
    steps = [r for r in rows if "engine_graph_ms" in r]
    lines = side_by_side_tables([r for r in rows if "kind" in r], args) + lines
    rows = [r for r in rows if "engine_graph_ms" not in r and "kind" not in r]
    if not rows:
        lines = lines[:-2]
    if steps:
        lines = ["| config | batch x prompt | graphed + fused ms | graphed (default) ms | graphed, cuBLAS projections ms | "
                 "graphed, torch glue ms | engine eager ms | forward_decode ms | HF ms | byte floor ms | floor / fused | "
                 "floor / default | HF / fused |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + [
            f"| {r['config']} | {r['batch']} x {r['prompt_len']} | {r['engine_graph_ms']:.3f} | "
            f"{r['engine_graph_unfused_ms']:.3f} | {r['engine_graph_cublas_ms']:.3f} | "
            f"{r['engine_graph_torchglue_ms']:.3f} | {r['engine_eager_ms']:.3f} | "
            f"{r['forward_decode_ms']:.3f} | {r['hf_ms']:.3f} | {r['floor_ms']:.3f} | {r['floor_fraction']:.2f} | "
            f"{r['floor_fraction_default']:.2f} | {r['speedup_vs_hf']:.1f}x |" for r in steps] + [""] + lines
    for r in rows:
        lines.append(f"| {r['config']} | {r['shape']} | {r['runtime']} | {r['prefill_tok_s']:.0f} | "
                     f"{r['decode_tok_s']:.1f} |")
    (out / "bench_generate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
