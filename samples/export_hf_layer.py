#!/usr/bin/env python
"""Export one Hugging Face Qwen3-Next / Qwen3.5 GatedDeltaNet layer to ONNX *as it is*: HF's own modeling code,
with only its gated-delta-rule calls routed to the gdn ops (one gdn node instead of the unrolled chunk loop).

    python samples/export_hf_layer.py HF_FOLDER --layer 0 -o out_layer0     # needs transformers

gdn-export exports a whole HF folder with gdn-deploy's own model (the usual path); this sample shows how
HF's module itself becomes a graph (``gdn_deploy.hf_routing``), e.g. to cross-check the two.
Writes ``hf_prefill.onnx`` (hidden_states [B,T,hidden], T >= 2) and ``hf_decode.onnx`` (T = 1).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from gdn_deploy.hf_routing import HFGDNDecode, HFGDNPrefill, hf_example_inputs, is_hf_gdn_module  # noqa: E402

_IN = ["hidden_states", "conv_state", "rec_state"]
_OUT = ["out", "conv_state_out", "rec_state_out"]


def export_hf_gdn(layer: nn.Module, outdir: str | Path, *, graphs: Sequence[str] = ("prefill", "decode"),
                  opset: int | None = None, interop: str | None = None) -> dict[str, Path]:
    """Export an HF GatedDeltaNet layer to ``outdir/hf_prefill.onnx`` and/or ``outdir/hf_decode.onnx``.

    Dynamic axes: B (batch) and T (prefill tokens, >= 2: a single token goes through the
    decode graph, as in HF where T == 1 selects the recurrent path).
    """
    from torch.export import Dim

    from gdn_deploy.export import onnx_ops

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    layer = layer.eval()
    B = Dim("B", min=1, max=4096)
    written: dict[str, Path] = {}
    for graph in graphs:
        if graph == "prefill":
            wrapper, args = HFGDNPrefill(layer), hf_example_inputs(layer, 2, 5)
            shapes = ({0: B, 1: Dim("T", min=2, max=1 << 20)}, {0: B}, {0: B})
        elif graph == "decode":
            wrapper, args = HFGDNDecode(layer), hf_example_inputs(layer, 2, 1)
            shapes = ({0: B}, {0: B}, {0: B})
        else:
            raise ValueError(f"unknown graph {graph!r} (expected prefill or decode)")
        path = outdir / f"hf_{graph}.onnx"
        onnx_ops.export_program(wrapper, args, str(path), kwargs=None, dynamic_shapes=shapes,
                                input_names=_IN, output_names=_OUT, external_data=False, interop=interop,
                                **({"opset": opset} if opset is not None else {}))
        written[graph] = path
    return written




def main(argv: Sequence[str] | None = None) -> int:
    from gdn_deploy.errors import LoadError, UsageError, quiet_warnings, run_cli
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_folder", help="a Hugging Face Qwen3-Next / Qwen3.5 folder (config.json + safetensors)")
    ap.add_argument("--layer", type=int, default=0, help="index of a linear_attention layer (default 0)")
    ap.add_argument("-o", "--output", default="hf_layer_onnx", help="output folder")
    args = ap.parse_args(argv)
    quiet_warnings()

    def run() -> int:
        try:
            from transformers import AutoModelForCausalLM
        except ImportError:
            raise UsageError("this sample needs transformers (pip install transformers)") from None
        try:
            model = AutoModelForCausalLM.from_pretrained(args.hf_folder, local_files_only=True,
                                                         trust_remote_code=False)
        except Exception as e:  # noqa: BLE001
            raise LoadError(f"{args.hf_folder}: {str(e).strip().splitlines()[0]}") from None
        layers = [m for m in model.modules() if is_hf_gdn_module(m)]
        chosen = [m for m in layers if getattr(m, "layer_idx", None) == args.layer]
        if not chosen:
            raise UsageError(f"--layer {args.layer}: not a GatedDeltaNet layer (those are "
                             f"{[getattr(m, 'layer_idx', '?') for m in layers]})")
        files = export_hf_gdn(chosen[0].float(), args.output)
        for f in files.values():
            print(f"wrote {f}")
        return 0
    return run_cli("export_hf_layer", run)


if __name__ == "__main__":
    sys.exit(main())
