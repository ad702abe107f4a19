#!/usr/bin/env python
"""Generation from a gdn-export folder: one packed prefill for all prompts, then one decode call per step.

--model is an export folder (gdn_model.json: a whole hybrid model from a Hugging Face folder, or the pure-GDN LM),
or a MODEL as for gdn-export (default, model.pt, a HF folder), exported first into --export-dir (a temporary
folder when left out; an existing --export-dir must hold this model's export: its config hash is checked).
Prompts of different lengths share every call; a sequence that emits an end-of-sequence id stops and leaves the
batch. Prompts are token ids (--ids 1,2,3, repeatable) or text (-p TEXT, repeatable) when the folder has a
tokenizer.json (read offline with the tokenizers package; the bundled byte-level model takes text as bytes).

  python samples/decode_loop.py                                            # bundled tiny model, PyTorch
  gdn-export ./Qwen3.5-0.8B -o qwen35 && python samples/decode_loop.py --model qwen35 -p "Hello" -p "Hi" -n 32
  python samples/decode_loop.py --model qwen35 --backend onnxruntime --ids 9707,11 --ids 1 -n 24
  python samples/decode_loop.py --model qwen35 --backend onnxruntime --compare --hf ./Qwen3.5-0.8B
  python samples/decode_loop.py --model qwen35 --backend tensorrt      # TensorRT + the gdn plugin library
  python samples/decode_loop.py --model qwen35 --speculative mtp --draft-tokens 3   # MTP drafts, torch, CPU
  gdn-export ./Qwen3.5-0.8B -o qwen35s --speculative && \
    python samples/decode_loop.py --model qwen35s --backend onnxruntime --speculative mtp   # verify/commit/draft.onnx

Greedy by default; --temperature T (> 0) samples, with --top-k, --top-p, --min-p, --repetition-penalty and --seed
(the same seed gives the same tokens on the same backend and device). --stop TEXT (repeatable) ends a sequence at
that text (cut before it), --stop-id ID at that token id (like an end-of-sequence id), --stream prints text as it
arrives; -n takes one budget or one per prompt (-n 16,32,8). Decode tokens/s are printed at the end.
--backend torch --device cuda generates on the decode engine (state pools updated in place, the decode step
replayed from one CUDA graph per batch bucket: gdn_deploy.runtime.cuda_engine); --engine off calls the model once
per step instead, --engine on runs the engine on the CPU too (eager), --engine fused fuses the step's glue with
torch.compile (CUDA; 2.3x faster at batch 1 on an H100, docs/performance.md). With the engine on, --speculative
ngram verifies K+1 tokens per sequence in one graphed step (greedy only; gdn_deploy.runtime.engine_speculative);
--speculative mtp runs eagerly on the CPU (--engine off).

  python samples/decode_loop.py --model qwen35 -p "Once upon a time" -n 64 --temperature 0.8 --top-p 0.95 \
      --seed 1 --stop "\n\n" --stream

--chat treats every --ids/-p as the next turn of ONE conversation: each turn's prefill continues from the states the
previous turn left (only the new tokens are fed), then the reply is generated (greedy or sampled; -n per turn).

  python samples/decode_loop.py --model qwen35 --backend onnxruntime --chat -p "Hi, I am Ann." -p "My name?" -n 24

--prefill-chunk N prefills a prompt longer than N tokens in pieces of at most N, each continuing from the states
the previous piece left (KV caches sized for the whole prompt from the start): the prefill's memory is bounded by N
instead of the prompt length (docs/models.md). The tokens equal one prefill's (the logits to rounding). With --chat
it applies to every turn.

  python samples/decode_loop.py --model qwen35 --backend onnxruntime -p "$(cat long_report.txt)" -n 64 \
      --prefill-chunk 4096

--compare runs the chosen backend and PyTorch and compares the tokens; with --hf HF_FOLDER it compares with
Hugging Face transformers' generate(do_sample=False) run on each prompt alone and reports the largest prefill
logit difference. A difference exits with code 5 and names the first differing prompt and position.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from gdn_deploy.errors import (EXIT_CODES_HELP, ExitCode, LoadError, MismatchError, UsageError,  # noqa: E402
                               quiet_warnings, run_cli)

PROG = "decode_loop"
DEFAULT_TEXTS = ["Hello, world", "Gated DeltaNet ", "a"]


def build_parser() -> argparse.ArgumentParser:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    p = OneLineParser(prog=PROG, description=__doc__, epilog=EXIT_CODES_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="an export folder, or a MODEL to export first (default: "
                   "the bundled tiny model)")
    p.add_argument("--export-dir", default=None, help="where a MODEL is exported (default: a temporary folder)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="precision when a MODEL is exported (default: fp32)")
    p.add_argument("--backend", choices=["torch", "onnxruntime", "tensorrt"], default="torch")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda: where the torch backend runs; with --backend onnxruntime, cuda runs the "
                        "graphs on onnxruntime's CUDA provider (onnxruntime-gpu) with the states on the GPU")
    p.add_argument("--engine", choices=["auto", "on", "fused", "off"], default="auto",
                   help="torch backend: generate on the decode engine (state pools; the step replayed from CUDA "
                        "graphs on a GPU, eager on the CPU). auto (default): on for --device cuda; fused: the "
                        "step's glue fused by torch.compile (CUDA, triton); off: one model call per step")
    p.add_argument("--plugins", default=None, metavar="LIB", help="gdn TensorRT plugin library (tensorrt backend)")
    p.add_argument("--ids", action="append", dest="prompts", type=lambda s: ("ids", s), metavar="I,J,...",
                   help="a prompt as token ids (repeat; prompts keep their command-line order)")
    p.add_argument("-p", "--prompt", action="append", dest="prompts", type=lambda s: ("text", s), metavar="TEXT",
                   help="a text prompt (repeat)")
    p.add_argument("-n", "--max-new-tokens", type=str, default="16", metavar="N",
                   help="new tokens per prompt (>= 1): one number, or one per prompt (16,32,8)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling probability mass (1: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top probability (0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="penalise prompt and generated ids (1: off)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, printed)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeat)")
    p.add_argument("--stop-id", action="append", type=int, default=[], metavar="ID", help="stop token id (repeat)")
    p.add_argument("--stream", action="store_true", help="print text as it arrives")
    p.add_argument("--ignore-eos", action="store_true", help="generate N tokens even after an end-of-sequence id")
    p.add_argument("--compare", action="store_true", help="compare with PyTorch (or with --hf)")
    p.add_argument("--hf", default=None, metavar="HF_FOLDER", help="with --compare: Hugging Face transformers")
    p.add_argument("--allow-pickle", action="store_true", help="allow a pickled .pt MODEL (UNSAFE)")
    p.add_argument("--speculative", choices=["mtp", "ngram"], default=None,
                   help="self-speculative greedy decoding (greedy only: no sampling): drafts from the checkpoint's "
                        "MTP head or prompt lookup, verified K+1 tokens per call; the tokens equal plain greedy "
                        "decoding. torch backend: on the decode engine (ngram; graphed on CUDA) when the engine is "
                        "on, else eager on the CPU (mtp, ngram); onnxruntime on a gdn-export --speculative folder")
    p.add_argument("--draft-tokens", type=int, default=3, metavar="K", help="draft tokens per step (1..15)")
    p.add_argument("--chat", action="store_true", help="every --ids/-p is the next turn of one conversation "
                   "(prefill continues from the previous turn's states)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill a prompt longer than N tokens in pieces of at most N, each continuing from the "
                        "states the previous piece left: bounds the prefill's memory (its per-chunk GDN matrices and "
                        "attention scores grow with the tokens of one call) at the cost of more calls; the tokens "
                        "equal one prefill's. Default: 4096 with --backend onnxruntime --device cuda (one call over "
                        "32K tokens held 30 GB there, pieces of 4096 5.6 GB: docs/models.md), else off (one prefill "
                        "call). Hybrid folders whose prefill continues; not with the decode engine or --speculative")
    p.add_argument("-q", "--quiet", action="store_true", help="only the results")
    return p


# ---- the export folder --------------------------------------------------------------------------------
def resolve_folder(args, say):
    """The export folder to run: --model itself, or --export-dir holding this MODEL's export (made if absent)."""
    from gdn_deploy.export import metadata as md
    from gdn_deploy.runtime.folder import ExportFolder
    model = Path(args.model)
    if md.find_sidecar(model) is not None:
        if args.export_dir:
            raise UsageError(f"--export-dir: --model {args.model} is already an export folder; leave --export-dir out")
        return ExportFolder(model if model.is_dir() else model.parent)
    if args.model != "default" and not model.exists():
        raise UsageError(f"--model {args.model}: no such file or folder (give a gdn-export folder, a model.pt, a "
                         "Hugging Face folder or 'default')")
    from gdn_deploy.export.loading import load_targets
    from gdn_deploy.export.model_export import ExportOptions, config_hash, export_model
    from gdn_deploy.export.targets import cast_target
    target = load_targets(args.model, allow_pickle=args.allow_pickle)[0]
    if target.kind == "block":
        raise UsageError(f"--model {args.model}: is a single GDN block; generation needs a language model")
    out = Path(args.export_dir) if args.export_dir else Path(tempfile.mkdtemp(prefix="gdn_decode_loop_"))
    if md.find_sidecar(out) is not None:
        meta = md.read_metadata(out)
        if meta.get("config_hash") != config_hash(cast_target(target, meta.get("precision", "fp32"))):
            raise UsageError(f"--export-dir {out}: holds the export of another model than {args.model} (config hash "
                             "differs); choose another --export-dir or remove that folder")
        say(f"using the existing export in {out} (same model)")
        return ExportFolder(out)
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"--export-dir {out}: exists and is not an export folder (no {md.SIDECAR_NAME}); give an "
                         "empty or new folder")
    say(f"exporting {args.model} -> {out} (precision {args.precision})")
    export_model(target, out, ExportOptions(precision=args.precision, graphs=("prefill", "decode"), verify=False))
    return ExportFolder(out)


# ---- prompts ------------------------------------------------------------------------------------------
class Codec:
    """Text <-> ids: the folder's tokenizer.json, bytes for the byte-level pure-GDN model, or none."""

    def __init__(self, folder):
        self.tok, self.bytes = None, False
        path = folder.tokenizer_path()
        if path is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise UsageError("the folder has a tokenizer.json but the tokenizers package is missing "
                                 "(pip install tokenizers), or give prompts as --ids") from None
            try:
                self.tok = Tokenizer.from_file(str(path))
            except Exception as e:  # noqa: BLE001  (tokenizers raises its own exceptions)
                raise LoadError(f"{path}: not a readable tokenizer.json ({e})") from None
        elif folder.kind == "lm" and folder.vocab_size == 256:
            self.bytes = True

    @property
    def has_text(self) -> bool:
        return self.tok is not None or self.bytes

    def encode(self, text: str) -> list[int]:
        if self.tok is not None:
            return list(self.tok.encode(text, add_special_tokens=False).ids)
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if self.tok is not None:
            return self.tok.decode(ids, skip_special_tokens=False)
        return bytes(t % 256 for t in ids).decode("utf-8", errors="replace")


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UsageError(f"--ids {text!r}: expected comma-separated integers, e.g. --ids 1,2,3") from None
    if not ids:
        raise UsageError(f"--ids {text!r}: empty prompt")
    return ids


def make_prompts(args, codec, folder) -> tuple[list[list[int]], list[str | None]]:
    prompts, texts = [], []
    for kind, value in args.prompts or []:
        if kind == "ids":
            prompts.append(parse_ids(value))
            texts.append(None)
            continue
        if not codec.has_text:
            raise UsageError(f"-p/--prompt: {folder.path} has no tokenizer.json (the Hugging Face folder had none); "
                             "give prompts as token ids with --ids 1,2,3")
        prompts.append(codec.encode(value))
        texts.append(value)
    if not prompts:
        if codec.has_text:
            prompts, texts = [codec.encode(t) for t in DEFAULT_TEXTS], list(DEFAULT_TEXTS)
        else:
            V = folder.vocab_size
            prompts = [[1 % V], [(2 + j) % V for j in range(5)], [(7 + j) % V for j in range(11)]]
            texts = [None] * 3
        shown = [repr(t) for t in texts] if codec.has_text else [str(p) for p in prompts]
        print(f"{PROG}: no prompt given (-p TEXT or --ids I,J,...): using {len(prompts)} built-in demo prompts: "
              f"{', '.join(shown)}", file=sys.stderr)
    return prompts, texts


# ---- comparisons ----------------------------------------------------------------------------------------
def _first_difference(a: list[list[int]], b: list[list[int]]):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            j = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return i, j
    return None


def run_hf(hf_dir: str, prompts, n, eos: list[int]):
    """HF generate(do_sample=False) on each prompt alone, and its last-token logits of each prompt."""
    import torch
    try:
        import transformers
    except ImportError:
        raise UsageError("--hf needs the transformers package (pip install transformers)") from None
    from gdn_deploy.lm.hf_folder import read_hf_config
    cfg, raw = read_hf_config(hf_dir)
    cls = getattr(transformers, cfg.architecture, None)
    if cls is None:
        raise UsageError(f"--hf {hf_dir}: transformers {transformers.__version__} has no {cfg.architecture}")
    model = cls.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = list(eos) or None
    tokens, last = [], []
    with torch.no_grad():
        for j, p in enumerate(prompts):
            ids = torch.tensor([p])
            out = model.generate(ids, do_sample=False, max_new_tokens=n[j] if isinstance(n, list) else n,
                                 attention_mask=torch.ones_like(ids),
                                 pad_token_id=(eos[0] if eos else 0))
            tokens.append(out[0, len(p):].tolist())
            last.append(model(input_ids=ids).logits[0, -1].float())
    return tokens, torch.stack(last)


def parse_budgets(text: str):
    """-n: one budget (int) or one per prompt (list)."""
    try:
        vals = [int(x) for x in str(text).replace(" ", "").split(",")]
    except ValueError:
        raise UsageError(f"-n/--max-new-tokens {text!r}: expected an integer >= 1, or one per prompt (16,32,8)") \
            from None
    if any(v < 1 for v in vals):
        raise UsageError(f"-n/--max-new-tokens {text}: expected an integer >= 1" + ("" if len(vals) == 1 else
                         " for every prompt"))
    return vals[0] if len(vals) == 1 else vals


def sampling_config(args):
    from gdn_deploy.runtime.sampling import SamplingConfig
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)


def _stream_printer(n_prompts: int):
    if n_prompts == 1:
        return lambda i, piece: print(piece, end="", flush=True)
    return lambda i, piece: print(f"[{i}] +{piece!r}", flush=True)


def use_engine(args, backend, say) -> bool:
    """--engine: whether generation runs on the decode engine (auto: the torch backend on CUDA)."""
    from gdn_deploy.runtime.engine_generation import engine_unsupported
    if args.engine == "off" or (args.engine == "auto" and (args.backend != "torch" or
                                                           not str(args.device).startswith("cuda"))):
        return False
    why = engine_unsupported(backend)
    if args.engine == "fused" and backend.device.type != "cuda":
        raise UsageError("--engine fused: the fused step runs on CUDA (--device cuda)")
    if why is not None:
        if args.engine != "auto":
            raise UsageError(f"--engine {args.engine}: {why}")
        say(f"not on the decode engine: {why}")
        return False
    say("decoding on the engine" + (" (CUDA graphs per batch bucket" + (", fused)" if args.engine == "fused" else
                                                                        ")") if backend.device.type == "cuda" else
                                    " (eager)"))
    return True


ORT_CUDA_PREFILL_CHUNK = 4096       # --prefill-chunk's default on onnxruntime's CUDA provider


def run_chat(folder, backend, turns, texts, budgets, eos, sampling, codec, prefill_chunk=None) -> int:
    """--chat: the prompts are the turns of one conversation (gdn_deploy.runtime.conversation)."""
    from gdn_deploy.runtime.conversation import Conversation
    per_turn = budgets if isinstance(budgets, list) else [budgets] * len(turns)
    if len(per_turn) != len(turns):
        raise UsageError(f"-n: {len(per_turn)} budgets for {len(turns)} turns (give one, or one per turn)")
    chat = Conversation(folder, backend, sampling=sampling, eos_token_ids=eos, prefill_chunk=prefill_chunk)
    for i, (turn, n) in enumerate(zip(turns, per_turn)):
        reply = chat.turn(turn, n)
        print(f"[turn {i}] {turn if texts[i] is None else repr(texts[i])} -> {reply}")
        if codec.has_text:
            print(f"    text: {codec.decode(reply)!r}")
    print(f"conversation: {len(chat.fed) + len(chat.pending)} tokens, each fed once")
    return ExitCode.OK


def main_body(args) -> int:
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.chunked_prefill import check_prefill_chunk
    from gdn_deploy.runtime.generation import check_prompts, generate
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    budgets = parse_budgets(args.max_new_tokens)
    if args.hf and not args.compare:
        raise UsageError("--hf is used by --compare; add --compare")
    sampling = sampling_config(args)
    if args.compare and not sampling.greedy:
        raise UsageError("--compare checks greedy tokens; leave out --temperature")
    if args.engine in ("on", "fused") and args.backend != "torch":
        raise UsageError(f"--engine {args.engine} runs the torch backend's model")
    if args.engine == "fused" and args.speculative:
        raise UsageError("--engine fused: --speculative runs on the unfused engine (--engine on, or auto on CUDA)")
    if args.chat and (args.compare or args.speculative or args.stop or args.stream):
        raise UsageError("--chat: leave out --compare, --speculative, --stop and --stream")
    if args.prefill_chunk is not None and args.speculative:
        raise UsageError("--prefill-chunk: --speculative prefills in one call; leave one of them out")
    if args.speculative and (not sampling.greedy or args.stop or args.stream or isinstance(budgets, list)):
        raise UsageError("--speculative decodes greedily with one -n for all prompts: leave out --temperature, "
                         "--stop, --stream and per-prompt budgets")
    folder = resolve_folder(args, say)
    codec = Codec(folder)
    if (args.stop or args.stream) and not codec.has_text:
        raise UsageError(f"--stop/--stream: {folder.path} has no tokenizer.json to make text; use --stop-id")
    prompts, texts = make_prompts(args, codec, folder)
    check_prompts(folder, prompts, budgets)
    if args.prefill_chunk is None and args.backend == "onnxruntime" and str(args.device).startswith("cuda") \
            and not args.speculative and folder.prefill_continues:
        args.prefill_chunk = ORT_CUDA_PREFILL_CHUNK
    check_prefill_chunk(folder, args.prefill_chunk)
    eos = ([] if args.ignore_eos else list(folder.eos_token_ids)) + list(args.stop_id)
    say(f"{folder.path}: {folder.kind} model, backend {args.backend}, {len(prompts)} prompt(s) of "
        f"{[len(p) for p in prompts]} tokens, {budgets} new tokens" + (f", eos {eos}" if eos else "") +
        ("" if sampling.greedy else f", sampling (temperature {sampling.temperature}, top-k {sampling.top_k}, "
         f"top-p {sampling.top_p}, min-p {sampling.min_p}, repetition penalty {sampling.repetition_penalty})"))
    backend = make_backend(args.backend, folder, device=args.device, plugin_lib=args.plugins,
                           allow_pickle=args.allow_pickle)
    if args.chat:
        return run_chat(folder, backend, prompts, texts, budgets, eos, sampling, codec, args.prefill_chunk)
    if args.speculative:
        if use_engine(args, backend, say):
            from gdn_deploy.runtime.engine_speculative import speculative_on_engine as speculate
        else:
            from gdn_deploy.runtime.speculative import speculative_from_folder as speculate
        spec = speculate(folder, backend, prompts, budgets, eos, args.speculative, args.draft_tokens)
        print(f"speculative ({args.speculative}, K={args.draft_tokens}): acceptance rate {spec.acceptance_rate:.3f}, "
              f"{spec.tokens_per_call:.2f} tokens per target call, {spec.target_calls} verify calls")
        res = spec
    else:
        text_on = codec.has_text and bool(args.stop or args.stream)
        run, extra = generate, {"prefill_chunk": args.prefill_chunk}
        if use_engine(args, backend, say):
            if args.prefill_chunk is not None:
                raise UsageError("--prefill-chunk: the decode engine prefills in one call; add --engine off")
            from gdn_deploy.runtime.engine_generation import generate_on_engine as run
            extra = dict(fuse=args.engine == "fused")
        res = run(folder, backend, prompts, budgets, eos_token_ids=eos, sampling=sampling,
                       stop_strings=args.stop, decode_text=codec.decode if text_on else None,
                       on_text=_stream_printer(len(prompts)) if args.stream else None, **extra)
        if args.stream and len(prompts) == 1:
            print()
    reasons = getattr(res, "stop_reasons", None) or ["eos" if f else None for f in res.finished]
    texts_out = getattr(res, "texts", None)
    for i, (p, toks) in enumerate(zip(prompts, res.tokens)):
        stop = {"eos": " (eos)", "stop": " (stop string)"}.get(reasons[i], "")
        print(f"[{i}] prompt {p if texts[i] is None else repr(texts[i])} -> {toks}{stop}")
        if codec.has_text:
            print(f"    text: {(texts_out[i] if texts_out is not None else codec.decode(toks))!r}")
    if not sampling.greedy:
        print(f"seed: {res.seed}")
    if not args.speculative:
        pieces = f" (pieces of at most {args.prefill_chunk})" if args.prefill_chunk else ""
        say(f"prefill: {sum(len(p) for p in prompts)} tokens{pieces} in {res.prefill_seconds * 1e3:.1f} ms; decode: "
            f"{res.decode_tokens} tokens in {res.decode_steps} steps, {res.decode_seconds * 1e3:.1f} ms "
            f"({res.tokens_per_second:.1f} tokens/s)")
    if not args.compare:
        return ExitCode.OK
    if args.hf:
        ref_tokens, ref_logits = run_hf(args.hf, prompts, budgets, eos)
        what = "Hugging Face transformers"
    else:
        ref = generate(folder, make_backend("torch", folder, device=args.device, allow_pickle=args.allow_pickle),
                       prompts, budgets, eos_token_ids=eos)
        ref_tokens, ref_logits, what = ref.tokens, ref.prefill_logits, "PyTorch"
    if getattr(res, "prefill_logits", None) is not None:
        diff = float((res.prefill_logits - ref_logits.to(res.prefill_logits.dtype)).abs().max())
        print(f"compare: prefill last-token logits max |diff| vs {what}: {diff:.3e}")
    first = _first_difference(res.tokens, ref_tokens)
    if first is not None:
        i, j = first
        raise MismatchError(f"{args.backend} and {what} generated different tokens: prompt {i}, new token {j} "
                            f"({res.tokens[i][j:j + 1]} vs {ref_tokens[i][j:j + 1]})")
    print(f"compare: {args.backend} and {what} generated the same tokens")
    return ExitCode.OK


def main(argv=None) -> int:
    def body() -> int:   # parsing and the torch import inside run_cli: Ctrl-C at any time is one line, exit 130
        args = build_parser().parse_args(argv)
        quiet_warnings(args.quiet)
        return main_body(args)
    return run_cli(PROG, body, command=argv is None)


if __name__ == "__main__":
    sys.exit(main())
