#!/usr/bin/env python
"""Greedy generation with a GDN language model: ragged prefill, then token-by-token decode.

Prompts are bytes (the bundled tiny model has a 256-entry byte vocabulary). All prompts are
prefilled at once as one packed ragged batch (``cu_seqlens``), then every sequence advances one
token per decode step, carrying the per-layer conv and recurrent states.

    python samples/decode_loop.py                                  # PyTorch, default model
    python samples/decode_loop.py --backend onnxruntime            # exports to a temp dir first
    python samples/decode_loop.py --backend onnxruntime --export-dir gdn_onnx
    python samples/decode_loop.py --compare -p "Hello" -p "Gated DeltaNet" -n 24

``--compare`` runs both backends and exits 1 if the generated tokens differ.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from gdn_deploy.export.loading import load_targets  # noqa: E402
from gdn_deploy.export.model_export import ExportOptions, export_model  # noqa: E402
from gdn_deploy.export.runtimes import run_onnxruntime  # noqa: E402


def encode(prompts: list[str], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [list(p.encode("utf-8")) for p in prompts]
    if any(not x for x in ids):
        raise SystemExit("decode_loop: prompts must not be empty")
    if max(max(x) for x in ids) >= vocab:
        raise SystemExit(f"decode_loop: the model's vocabulary ({vocab}) is smaller than the byte range")
    lens = torch.tensor([len(x) for x in ids])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    return torch.tensor([t for x in ids for t in x], dtype=torch.long), cu


def decode_text(tokens: list[int]) -> str:
    return bytes(t % 256 for t in tokens).decode("utf-8", errors="replace")


def generate_torch(lm, ids: torch.Tensor, cu: torch.Tensor, steps: int) -> list[list[int]]:
    with torch.no_grad():
        conv, rec = lm.init_states(cu.shape[0] - 1)
        conv = [c.float() for c in conv]
        logits, conv, rec = lm.prefill(ids, cu, conv, rec)
        nxt = logits[cu[1:].long() - 1].float().argmax(-1)
        out = [nxt]
        for _ in range(steps - 1):
            logits, conv, rec = lm.decode(nxt, conv, rec)
            nxt = logits.float().argmax(-1)
            out.append(nxt)
    return torch.stack(out, 1).tolist()


def generate_onnxruntime(export_dir: Path, lm, ids: torch.Tensor, cu: torch.Tensor, steps: int) -> list[list[int]]:
    """Runs prefill.onnx once and decode.onnx per step; states flow from outputs back into inputs."""
    n, layers = cu.shape[0] - 1, len(lm.layers)
    conv, rec = lm.init_states(n)
    states = {}
    for i in range(layers):
        states[f"conv_state_{i}"], states[f"rec_state_{i}"] = conv[i].float(), rec[i]
    out = run_onnxruntime(export_dir / "prefill.onnx", {"input_ids": ids, "cu_seqlens": cu, **states})
    nxt = out["logits"][cu[1:].long() - 1].float().argmax(-1)
    toks = [nxt]
    for _ in range(steps - 1):
        states = {k: out[k.replace("_state_", "_state_out_")] for k in states}
        out = run_onnxruntime(export_dir / "decode.onnx", {"input_ids": nxt, **states})
        nxt = out["logits"].float().argmax(-1)
        toks.append(nxt)
    return torch.stack(toks, 1).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="checkpoint (.pt / .safetensors) or 'default'")
    ap.add_argument("--backend", choices=["torch", "onnxruntime"], default="torch")
    ap.add_argument("--export-dir", default=None, help="folder with prefill.onnx/decode.onnx (onnxruntime backend); "
                    "exported into a temporary folder when left out")
    ap.add_argument("-p", "--prompt", action="append", default=None, help="a prompt (repeat for a ragged batch)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=16)
    ap.add_argument("--compare", action="store_true", help="run torch and onnxruntime, check the tokens agree")
    args = ap.parse_args(argv)
    prompts = args.prompt or ["Hello, world", "Gated DeltaNet ", "a"]
    target = load_targets(args.model)[0]
    if target.kind != "lm":
        raise SystemExit("decode_loop: the model is a single GDNBlock; text generation needs a GDNLM")
    lm = target.module.float().eval()
    ids, cu = encode(prompts, lm.config.vocab_size)
    results = {}
    if args.backend == "torch" or args.compare:
        results["torch"] = generate_torch(lm, ids, cu, args.max_new_tokens)
    if args.backend == "onnxruntime" or args.compare:
        with tempfile.TemporaryDirectory(prefix="gdn_decode_loop_") as tmp:
            d = Path(args.export_dir) if args.export_dir else Path(tmp)
            if not (d / "prefill.onnx").is_file() or not (d / "decode.onnx").is_file():
                print(f"exporting {args.model} -> {d}", flush=True)
                export_model(target, d, ExportOptions(graphs=("prefill", "decode"), verify=False))
            results["onnxruntime"] = generate_onnxruntime(d, lm, ids, cu, args.max_new_tokens)
    for backend, toks in results.items():
        print(f"[{backend}]")
        for p, t in zip(prompts, toks):
            print(f"  {p!r} -> {decode_text(t)!r}")
    if args.compare:
        same = results["torch"] == results["onnxruntime"]
        print("compare: torch and onnxruntime generated " + ("the same tokens" if same else "DIFFERENT tokens"))
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
