#!/usr/bin/env python3
"""Write a random Hugging Face Qwen3.5 text checkpoint (config.json + bf16 safetensors shards + index) of a real
model's shapes, without building the model in memory: tensor names and shapes come from the transformers model
built on the meta device, and each tensor's bf16 bits are drawn with numpy and appended to its shard chunk by chunk
(peak memory ~0.4 GB: torch for the shapes; 17.9 GB in minutes, mostly disk writes).

  python scripts/make_random_checkpoint.py qwen3.5-0.8b out/qwen35_08b          # 0.75 B parameters, 1.5 GB
  python scripts/make_random_checkpoint.py qwen3.5-9b out/qwen35_9b             # 8.95 B parameters, 18 GB
  python scripts/make_random_checkpoint.py qwen3.5-0.8b out/small --set num_hidden_layers=4 --set vocab_size=32768

Configs (the text model of Qwen/Qwen3.5-0.8B and Qwen/Qwen3.5-9B; written as Qwen3_5ForCausalLM):
  qwen3.5-0.8b  hidden 1024, 24 layers (3 Gated DeltaNet : 1 attention), attention 8 heads / 2 KV of 256 (output
                gate), GDN 16 key / 16 value heads of 128, MLP 3584, vocabulary 248320, tied embeddings
  qwen3.5-9b    hidden 4096, 32 layers (3:1), attention 16 / 4 KV of 256, GDN 16 key / 32 value heads of 128,
                MLP 12288, vocabulary 248320, separate lm_head
Values: matrices of random bf16 bits with RMS ~1/sqrt(fan_in) (embeddings ~0.02; random sign and mantissa, a
magnitude spread over 4 binades), zero-centred RMSNorm weights near 0, the gated GDN norm near 1, A_log = log U(1, 16),
dt_bias near 1: finite logits, not a trained model. Each tensor is deterministic in (--seed, its name). No tokenizer
is written.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import struct
import time
import zlib
from pathlib import Path

import numpy as np

_COMMON = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_act="silu", attention_bias=False,
    attention_dropout=0.0, attn_output_gate=True, full_attention_interval=4, head_dim=256, linear_conv_kernel_dim=4,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16, max_position_embeddings=262144,
    rms_norm_eps=1e-6, vocab_size=248320, bos_token_id=None, eos_token_id=248044, pad_token_id=None,
    initializer_range=0.02, use_cache=True, dtype="bfloat16",
    rope_parameters=dict(rope_type="default", rope_theta=10_000_000, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True))

CONFIGS = {
    "qwen3.5-0.8b": dict(_COMMON, hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
                         num_attention_heads=8, num_key_value_heads=2, linear_num_value_heads=16,
                         tie_word_embeddings=True),
    "qwen3.5-9b": dict(_COMMON, hidden_size=4096, num_hidden_layers=32, intermediate_size=12288,
                       num_attention_heads=16, num_key_value_heads=4, linear_num_value_heads=32,
                       tie_word_embeddings=False),
}


def full_config(name: str, overrides: dict) -> dict:
    c = dict(CONFIGS[name], **overrides)
    n, every = c["num_hidden_layers"], c["full_attention_interval"]
    if c.get("eos_token_id") is not None and c["eos_token_id"] >= c["vocab_size"]:
        c["eos_token_id"] = None                              # a reduced vocabulary (--set vocab_size=...)
    c["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    return c


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every checkpoint tensor, from the transformers model built on the meta device."""
    import torch
    import transformers as tf
    cfg = tf.Qwen3_5TextConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = tf.Qwen3_5ForCausalLM(cfg)
    sd = model.state_dict()          # tied lm_head.weight appears once under its own name: drop it when tied
    if config.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    return [(k, tuple(v.shape)) for k, v in sd.items()]


_CHUNK = 1 << 18                  # elements per random draw: 512 KB stays in cache and in malloc's reused memory


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even (small tensors only)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _random_bf16_chunks(n: int, std: float, rng: np.random.Generator):
    """Yield n bf16 values (uint16 bit patterns, in chunks) drawn straight from random bits: a random sign, a random
    7-bit mantissa and an exponent of E - k with k uniform in 0..3, i.e. |x| in [2^(E-3), 2^(E+1)) with the root
    mean square 0.88 * 2^E; E is the power of two that puts it nearest `std` (within a factor sqrt(2)). No float
    arithmetic; the yielded buffer is reused, so consume each chunk before the next."""
    top = np.uint16((127 + round(math.log2(std / 0.88))) << 7)   # biased exponent E in bits 14..7
    k = np.empty(_CHUNK, dtype=np.uint16)
    for a in range(0, n, _CHUNK):
        m = min(_CHUNK, n - a)
        r = rng.integers(0, (1 << 64) - 1, size=-(-m // 4), dtype=np.uint64, endpoint=True).view(np.uint16)[:m]
        km = np.bitwise_and(r, np.uint16(0x0180), out=k[:m])    # two random exponent bits: k << 7
        r &= np.uint16(0x807F)                                   # keep the random sign and mantissa
        r |= top
        r -= km                                                  # exponent E - k (E >= 3: no borrow into the sign)
        yield r


def tensor_chunks(name: str, shape: tuple[int, ...], seed: int):
    """The bf16 bit patterns (uint16) of one tensor, flat, in chunks; deterministic in (seed, name) whatever the
    sharding. Matrices: random bits of RMS ~1/sqrt(fan_in) (embeddings ~0.02); zero-centred RMSNorm weights
    0.1 N(0, 1); the gated GDN norm and dt_bias 1 + 0.1 N(0, 1); A_log = log U(1, 16)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    n = math.prod(shape)
    if name.endswith("A_log"):
        yield _bf16_bits(np.log(rng.uniform(1, 16, n)))
    elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):  # the gated GDN norm multiplies by w
        yield _bf16_bits(1 + 0.1 * rng.standard_normal(n))
    elif len(shape) == 1:                                    # zero-centred RMSNorms: (1 + w)
        yield _bf16_bits(0.1 * rng.standard_normal(n))
    else:
        yield from _random_bf16_chunks(n, 0.02 if "embed_tokens" in name else 1 / math.sqrt(math.prod(shape[1:])),
                                       rng)


def write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...]]], seed: int) -> int:
    """Write one bf16 safetensors file tensor by tensor (header first, then each tensor drawn and appended chunk by
    chunk: a few MB of memory), atomically (a .tmp renamed). Returns the bytes of tensor data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in specs:
        nbytes = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)                          # the data starts 8-byte aligned, as safetensors does
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in specs:
            for chunk in tensor_chunks(name, shape, seed):
                f.write(memoryview(chunk).cast("B"))
    os.replace(tmp, path)
    return offset


def write_checkpoint(config: dict, outdir: Path, *, shard_bytes: int = 2 << 30, seed: int = 0,
                     say=print) -> dict:
    outdir.mkdir(parents=True, exist_ok=True)
    specs = tensor_specs(config)
    total = sum(math.prod(s) * 2 for _, s in specs)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = math.prod(shape) * 2
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map, t0, done = {}, time.perf_counter(), 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        done += write_safetensors(outdir / fname, shard, seed)
        weight_map.update({name: fname for name, _ in shard})
        say(f"  shard {i + 1}/{len(shards)}: {fname} ({done / 1e9:.2f} of {total / 1e9:.2f} GB, "
            f"{time.perf_counter() - t0:.0f} s)")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    for fname, obj in (("model.safetensors.index.json", index), ("config.json", config)):
        tmp = outdir / (fname + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
        os.replace(tmp, outdir / fname)
    return {"parameters": total // 2, "bytes": total, "shards": len(shards), "tensors": len(specs)}


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv=None) -> int:
    from gdn_deploy.cli_util import OneLineParser  # one-line usage errors, exit 2
    ap = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__)
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("outdir")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config.json value (JSON value), e.g. num_hidden_layers=4")
    ap.add_argument("--shard-gb", type=float, default=2.0, help="shard size in GB (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in CONFIGS[args.config] and key != "layer_types":
            print(f"make_random_checkpoint: error: --set {item!r}: expected KEY=VALUE with a key of the "
                  f"{args.config} config", file=sys.stderr)
            return 2
        overrides[key] = _value(value)
    config = full_config(args.config, overrides)
    t0 = time.perf_counter()
    info = write_checkpoint(config, Path(args.outdir), shard_bytes=int(args.shard_gb * 1e9), seed=args.seed)
    print(f"make_random_checkpoint: {args.outdir}: {info['parameters'] / 1e9:.3f} B parameters "
          f"({info['bytes'] / 1e9:.2f} GB bf16) in {info['shards']} shard(s), {info['tensors']} tensors, "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
