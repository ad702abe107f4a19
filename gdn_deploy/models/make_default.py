"""Build the default tiny GDN language model deterministically and write ``tiny_gdn_lm.pt``.

Byte-level vocab (256), hidden 128, Hk=1, Hv=2 (grouped value attention), K=V=64 (the smallest head dim
of the CUDA kernels), 2 layers, SwiGLU MLP 64, tied embeddings, fp32, Qwen3-Next projection layout.
The weights are an untrained, seeded init (``GDNLM.reset_parameters``) chosen so activations stay
O(1) over long sequences. Usage: ``python -m gdn_deploy.models.make_default [--out PATH]``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..checkpoint import save_checkpoint
from ..model import GDNConfig, GDNLM
from . import default_model_path

SEED = 20250101
DEFAULT_CONFIG = dict(hidden_size=128, num_k_heads=1, num_v_heads=2, head_k_dim=64, head_v_dim=64,
                      conv_kernel_size=4, rms_norm_eps=1e-6, projection_layout="qwen3_next",
                      vocab_size=256, num_layers=2, intermediate_size=64, tie_word_embeddings=True)


def build_default_model(seed: int = SEED) -> GDNLM:
    """The default tiny GDNLM, reproducible from ``seed`` (does not touch the global RNG state)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GDNLM(GDNConfig(**DEFAULT_CONFIG))
        model.reset_parameters()
    return model.eval()


def main(argv: list[str] | None = None) -> Path:
    from ..cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=default_model_path(), help="output .pt (default: shipped file)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    path = save_checkpoint(build_default_model(args.seed), args.out)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return path


if __name__ == "__main__":
    main()
