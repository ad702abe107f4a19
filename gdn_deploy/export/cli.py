"""``gdn-export``: a Gated DeltaNet model -> prefill.onnx, decode.onnx (, decode_pool.onnx) + gdn_model.json."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from ..errors import EXIT_CODES_HELP, ExitCode, UsageError, quiet_warnings, run_cli

EPILOG = """\
MODEL may be:
  default                 the bundled tiny GDN language model (the default when MODEL is left out)
  model.pt                a gdn-deploy checkpoint {format, kind, config, state_dict}, read with
                          torch.load(weights_only=True): no code from the file runs
  model.safetensors       a gdn-deploy safetensors checkpoint (config in the metadata)
  HF_FOLDER               a Hugging Face Qwen3-Next, Qwen3.5 (text model of the multimodal
                          folders too), Qwen3.5-MoE or OLMo-Hybrid folder (config.json +
                          *.safetensors, single or sharded; no hub access): the whole causal LM,
                          prefill.onnx (packed ragged prompts -> last-token logits + every layer's
                          state) and decode.onnx (one token per sequence, states in and out; see
                          docs/models.md); with --blocks its Gated DeltaNet layers as blocks, one
                          sub-folder layer_<i>/ each (or just layer I with --layer I)
  pickled.pt              a whole pickled GDNLM/GDNBlock, ONLY with --allow-pickle

Output (OUTDIR, default ./gdn_onnx): prefill.onnx, decode.onnx (and decode_pool.onnx) for
onnxruntime (the gdn nodes carry function bodies), their TensorRT-ready copies prefill.trt.onnx, ...
(bodies removed: every gdn node must become the gdn plugin), plus gdn_model.json (config, I/O
names, shapes, dtypes, state tensors, TensorRT optimisation profiles) that gdn-build and gdn-check read, and per graph <graph>_inputs.json / <graph>_reference.json: a small
random feed and the model's float32 PyTorch outputs on it (Polygraphy's formats). The export is
then checked exactly as `gdn-check OUTDIR` checks it: onnxruntime against that float32
reference, with the tolerance of the precision (gdn_model.json says which). bf16 graphs run on
onnxruntime's CPU provider with float32 arithmetic (it has no bf16 kernels; the check says so).
Where no runtime here could run a graph, the export says "not checked" and exits 9. gdn_model.json records the size and sha256 of every file of
the folder. OUTDIR is checked before any work (new, empty or an earlier export); the files are
written into .OUTDIR.partial-XXXX beside it and moved into place when complete, so an earlier
export is replaced only by a complete one.

examples:
  gdn-export                                   # tiny default model -> ./gdn_onnx
  gdn-export model.pt -o out --precision fp16
  gdn-export model.pt --graphs prefill,decode,decode_pool --max-tokens 16384 --max-seqs 128
  gdn-export ./Qwen3.5-0.8B -o qwen35 --precision bf16   # whole model; tokenizer.json copied along
  python samples/decode_loop.py --model qwen35 -p "Hello" -n 32
  gdn-export ./Qwen3-Next-80B-A3B-Instruct --layer 0 -o layer0
  gdn-check out                                # the same check again, anywhere the folder is copied to

""" + EXIT_CODES_HELP


def build_parser() -> argparse.ArgumentParser:
    from ..cli_util import OneLineParser  # one-line usage errors, exit 2
    p = OneLineParser(prog="gdn-export", description="Export a Gated DeltaNet model to ONNX with gdn custom ops: a "
                "whole Hugging Face Qwen3-Next / Qwen3.5 / Qwen3.5-MoE / OLMo-Hybrid causal LM, a gdn-deploy GDNLM or "
                "GDNBlock checkpoint, or the bundled tiny model.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default="default", metavar="MODEL",
                   help="model to export (default: the bundled tiny model); see below")
    p.add_argument("-o", "--output", default="gdn_onnx", metavar="OUTDIR", help="output folder (default: gdn_onnx)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="weight/activation dtype; recurrent and conv states stay fp32 (default: fp32)")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX default-domain opset, 18..27 (default: 20; 27 with --interop onnx)")
    p.add_argument("--graphs", default="prefill,decode", metavar="LIST",
                   help="comma list of prefill, decode, decode_pool, verify, commit, draft (default: prefill,decode)")
    p.add_argument("--interop", choices=["com.microsoft", "onnx"], default=None,
                   help="emit LinearAttention (onnxruntime contrib op, or ONNX opset 27) instead of the gdn "
                        "custom ops: for onnxruntime-only users; prefill then needs equal-length sequences")
    p.add_argument("--gdn-body", choices=["chunked", "token"], default="chunked",
                   help="ONNX function body onnxruntime (or TensorRT without the plugin) runs for prefill: "
                        "chunked (64-token chunks, batched MatMuls; default) or token (a loop over tokens, "
                        "the plainest form of the recurrence, slow)")
    p.add_argument("--max-tokens", type=int, default=8192, metavar="N",
                   help="TensorRT profile: max packed prefill tokens (default: 8192)")
    p.add_argument("--max-seqs", type=int, default=64, metavar="N",
                   help="TensorRT profile: max sequences / decode batch / pool rows (default: 64)")
    p.add_argument("--layer", type=int, default=None, metavar="I",
                   help="export only GDN layer I (of a HF folder or a GDNLM) as a block")
    p.add_argument("--blocks", action="store_true",
                   help="HF folder: export every GDN layer as a block (layer_<i>/) instead of the whole model")
    p.add_argument("--all-logits", action="store_true",
                   help="whole HF model: prefill returns every token's logits [T, vocab] (default: each "
                        "sequence's last token, [N, vocab])")
    p.add_argument("--speculative", action="store_true",
                   help="whole HF model: also export verify.onnx and commit.onnx (speculative decoding, "
                        "decode_loop --speculative), and draft.onnx when the folder has MTP weights (mtp.*)")
    p.add_argument("--max-context", type=int, default=4096, metavar="S",
                   help="TensorRT profile: max KV-cache slots per sequence of a whole HF model (default: 4096)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow a .pt holding a whole pickled module. UNSAFE for untrusted files: "
                        "unpickling runs arbitrary code")
    p.add_argument("--lazy-weights", choices=["auto", "on", "off"], default="auto",
                   help="whole HF models: stream the weights from the checkpoint into weights.data one tensor at a "
                        "time instead of loading the model (no float32 reference: NOT CHECKED); auto: when a "
                        "float32 copy would not fit in half the available memory (default: auto)")
    p.add_argument("--trace-every-layer", action="store_true",
                   help="whole HF models: trace every decoder layer instead of tracing one layer of each kind and "
                        "cloning it for the others (layer stamping; same graphs, slower; also GDN_EXPORT_STAMP=0)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the onnxruntime check of the written files (the reference files are written anyway)")
    p.add_argument("-q", "--quiet", action="store_true", help="only errors and the final summary")
    return p


def describe_target(t) -> str:
    """One line: what a target is (kind, sizes, layers)."""
    cfg = t.config
    if t.kind == "hybrid":
        n_gdn, n_att = len(cfg.gdn_layers()), len(cfg.attention_layers())
        moe = sum(m == "moe" for m in cfg.mlp_types)
        return (f"{cfg.architecture or cfg.family} ({cfg.family}), hidden {cfg.hidden_size}, {cfg.num_layers} layers: "
                f"{n_gdn} Gated DeltaNet + {n_att} attention, {moe} MoE MLPs, vocab {cfg.vocab_size}")
    layer = t.source.get("layer")
    return (f"{t.kind}, hidden {cfg.hidden_size}, Hk={cfg.num_k_heads} Hv={cfg.num_v_heads} K={cfg.head_k_dim} "
            f"V={cfg.head_v_dim}, {len(t.blocks)} GDN layer(s)" + (f", HF layer {layer}" if layer is not None else ""))


def parse_graphs(text: str) -> tuple[str, ...]:
    """``--graphs`` value -> graph names (UsageError on an unknown name)."""
    from .graphs import GRAPHS
    graphs = tuple(g.strip() for g in text.split(",") if g.strip())
    bad = [g for g in graphs if g not in GRAPHS]
    if bad or not graphs:
        raise UsageError(f"--graphs {text!r}: expected a comma list of {', '.join(GRAPHS)}")
    return tuple(dict.fromkeys(graphs))


def run(args: argparse.Namespace) -> int:
    from .lazy_export import is_lazy
    from .loading import load_targets
    from .model_export import ExportOptions, export_model
    from .outdir import check_output_dir
    from ..progress import Progress
    progress = Progress("gdn-export", enabled=not args.quiet)

    def say(s: str) -> None:
        if not args.quiet:
            progress.clear()
            print(s, flush=True)
    if args.max_tokens < 1 or args.max_seqs < 1 or args.max_context < 1:
        raise UsageError("--max-tokens, --max-seqs and --max-context must be >= 1")
    if args.interop == "onnx":
        if args.opset is None:
            args.opset = 27          # the ONNX-standard LinearAttention exists from opset 27
        elif args.opset < 27:
            raise UsageError(f"--interop onnx emits the opset-27 LinearAttention; --opset {args.opset} is too old")
    if args.opset is not None and not 18 <= args.opset <= 27:
        raise UsageError(f"--opset {args.opset}: supported range is 18..27")
    opts = ExportOptions(precision=args.precision, graphs=parse_graphs(args.graphs), opset=args.opset,
                         interop=args.interop, gdn_body=args.gdn_body, max_tokens=args.max_tokens,
                         max_seqs=args.max_seqs, verify=not args.no_verify, max_context=args.max_context,
                         all_logits=args.all_logits, stamp=not args.trace_every_layer)
    root = check_output_dir(args.output, container=args.blocks)   # before any work: a bad -o is exit 2 at once
    t0 = time.perf_counter()
    say(f"loading {args.model}")
    with progress.step(f"loading {args.model}"):
        targets = load_targets(args.model, layer=args.layer, allow_pickle=args.allow_pickle, blocks=args.blocks,
                               lazy={"auto": None, "on": True, "off": False}[args.lazy_weights])
    if args.speculative or any(g in opts.graphs for g in ("verify", "commit", "draft")):
        from .speculative_export import speculative_targets
        opts.graphs = speculative_targets(targets, opts.graphs, args.speculative, say)
    written = []
    for t in targets:
        layer = t.source.get("layer")
        outdir = root / f"layer_{layer}" if len(targets) > 1 else root
        say(f"model: {describe_target(t)}, precision {opts.precision}")
        say(f"  weights {'streamed from the checkpoint (lazy)' if is_lazy(t) else 'loaded in memory (eager)'}")
        res = export_model(t, outdir, opts, log=say, progress=progress)
        written.append(res)
    for res in written:
        onnx_files = " ".join(g["file"] for g in res.metadata["graphs"].values())
        verdict = (res.metadata["not_checked"] if res.metadata.get("not_checked")
                   else "check PASS (onnxruntime vs float32 PyTorch, the same check as gdn-check)" if opts.verify
                   else "check not run (--no-verify; gdn-check runs it)")
        refs = "" if res.metadata.get("not_checked") else " + reference files"
        print(f"gdn-export: {res.outdir}: {onnx_files} (+ *.trt.onnx for TensorRT) gdn_model.json{refs}; "
              f"{verdict}")
    print(f"gdn-export: done in {time.perf_counter() - t0:.1f} s")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> int:   # parsing and the torch import inside run_cli: Ctrl-C at any time is one line, exit 130
        args = build_parser().parse_args(argv)
        quiet_warnings(args.quiet)
        return run(args)
    return run_cli("gdn-export", body, command=argv is None)


if __name__ == "__main__":
    sys.exit(main())
