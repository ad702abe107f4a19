#!/usr/bin/env python
"""Greedy generation from a gdn-export folder: one packed prefill for all prompts, then one decode call per step.

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
    p.add_argument("--device", default="cpu", help="device of the torch backend (cpu, cuda)")
    p.add_argument("--plugins", default=None, metavar="LIB", help="gdn TensorRT plugin library (tensorrt backend)")
    p.add_argument("--ids", action="append", dest="prompts", type=lambda s: ("ids", s), metavar="I,J,...",
                   help="a prompt as token ids (repeat; prompts keep their command-line order)")
    p.add_argument("-p", "--prompt", action="append", dest="prompts", type=lambda s: ("text", s), metavar="TEXT",
                   help="a text prompt (repeat)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=16, metavar="N", help="new tokens per prompt (>= 1)")
    p.add_argument("--ignore-eos", action="store_true", help="generate N tokens even after an end-of-sequence id")
    p.add_argument("--compare", action="store_true", help="compare with PyTorch (or with --hf)")
    p.add_argument("--hf", default=None, metavar="HF_FOLDER", help="with --compare: Hugging Face transformers")
    p.add_argument("--allow-pickle", action="store_true", help="allow a pickled .pt MODEL (UNSAFE)")
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


def run_hf(hf_dir: str, prompts, n: int, eos: list[int]):
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
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, do_sample=False, max_new_tokens=n, attention_mask=torch.ones_like(ids),
                                 pad_token_id=(eos[0] if eos else 0))
            tokens.append(out[0, len(p):].tolist())
            last.append(model(input_ids=ids).logits[0, -1].float())
    return tokens, torch.stack(last)


def main_body(args) -> int:
    from gdn_deploy.runtime.backends import make_backend
    from gdn_deploy.runtime.generation import check_prompts, generate
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    if isinstance(args.max_new_tokens, int) and args.max_new_tokens < 1:
        raise UsageError(f"-n/--max-new-tokens {args.max_new_tokens}: expected an integer >= 1")
    if args.hf and not args.compare:
        raise UsageError("--hf is used by --compare; add --compare")
    folder = resolve_folder(args, say)
    codec = Codec(folder)
    prompts, texts = make_prompts(args, codec, folder)
    check_prompts(folder, prompts, args.max_new_tokens)
    eos = [] if args.ignore_eos else folder.eos_token_ids
    say(f"{folder.path}: {folder.kind} model, backend {args.backend}, {len(prompts)} prompt(s) of "
        f"{[len(p) for p in prompts]} tokens, {args.max_new_tokens} new tokens" + (f", eos {eos}" if eos else ""))
    backend = make_backend(args.backend, folder, device=args.device, plugin_lib=args.plugins,
                           allow_pickle=args.allow_pickle)
    res = generate(folder, backend, prompts, args.max_new_tokens, eos_token_ids=eos)
    for i, (p, toks) in enumerate(zip(prompts, res.tokens)):
        stop = " (eos)" if res.finished[i] else ""
        print(f"[{i}] prompt {p if texts[i] is None else repr(texts[i])} -> {toks}{stop}")
        if codec.has_text:
            print(f"    text: {codec.decode(toks)!r}")
    if not args.compare:
        return ExitCode.OK
    if args.hf:
        ref_tokens, ref_logits = run_hf(args.hf, prompts, args.max_new_tokens, eos)
        what = "Hugging Face transformers"
    else:
        ref = generate(folder, make_backend("torch", folder, device=args.device, allow_pickle=args.allow_pickle),
                       prompts, args.max_new_tokens, eos_token_ids=eos)
        ref_tokens, ref_logits, what = ref.tokens, ref.prefill_logits, "PyTorch"
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
    args = build_parser().parse_args(argv)
    quiet_warnings(args.quiet)
    return run_cli(PROG, lambda: main_body(args))


if __name__ == "__main__":
    sys.exit(main())
