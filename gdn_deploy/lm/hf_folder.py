"""Load a Hugging Face causal-LM folder (config.json + safetensors) as a :class:`HybridLM`, offline.

Reads ``model.safetensors`` or the shards of ``model.safetensors.index.json`` (never pickle files, never the hub,
no remote code). Checkpoint keys are mapped to :class:`HybridLM` names the way transformers 5 maps them:

- prefixes ``model.language_model.`` (multimodal folders) and ``model.`` are dropped; ``mtp.*`` (multi-token
  prediction, read separately by :func:`gdn_deploy.lm.mtp.load_mtp_head`) and the vision tower (``model.visual.*``)
  are skipped;
- per-expert MoE weights ``mlp.experts.{e}.{gate,up,down}_proj.weight`` are stacked into ``experts.gate_up_proj
  [E, 2I, hidden]`` / ``experts.down_proj [E, hidden, I]`` (fused checkpoints load as they are);
- OLMo-Hybrid: ``attention_layer_norm`` -> ``input_layernorm``, ``feedforward_layer_norm`` ->
  ``post_attention_layernorm``, ``{q,k,v}_conv1d.{weight,bias}`` concatenated into ``conv1d``.

Then the keys are checked strictly (what is missing, what is left over, which layer's kind disagrees with
config.json's ``layer_types``) and loaded in place of the model's own (empty) parameters, every tensor on a
64-byte boundary as PyTorch allocates them (a copy only of those the file leaves unaligned): CPU BLAS results depend
on the operands' alignment, so this makes the logits bitwise independent of the folder's layout (single file,
shards) and equal to those of the same weights copied into a model built in memory.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import torch

from .config import HybridConfig
from .hf_config import UnsupportedModelError, config_from_hf_dict
from .model import HybridLM

__all__ = ["CheckpointError", "UnsupportedModelError", "read_hf_config", "hf_weight_files", "load_hf_causal_lm",
           "hf_state_dict_to_model", "LazyWeights"]


class CheckpointError(ValueError):
    """The folder's files are missing, unreadable or do not match its config."""


_SKIP = re.compile(r"^(mtp\.|model\.visual\.|visual\.|model\.mtp\.)")
_LAYER = re.compile(r"^layers\.(\d+)\.([a-z_]+)\.")
_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_OLMO_CONV = re.compile(r"^(layers\.\d+\.linear_attn)\.([qkv])_conv1d\.(weight|bias)$")


def read_hf_config(folder: str | Path) -> tuple[HybridConfig, dict]:
    """(HybridConfig, the raw config.json dict) of a HF folder."""
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (expected a Hugging Face model folder with config.json "
                              "and *.safetensors)")
    f = root / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{root}: config.json is missing")
    try:
        raw = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from e
    try:
        return config_from_hf_dict(raw), raw
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{f}: {e}") from e
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{f}: {e}") from e


def hf_weight_files(folder: str | Path) -> dict[str, Path]:
    """Checkpoint key -> safetensors file, from the index of a sharded folder or the files themselves."""
    from safetensors import safe_open
    root = Path(folder)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({e})") from e
        lost = sorted({f for f in weight_map.values() if not (root / f).is_file()})
        if lost:
            raise CheckpointError(f"{root}: shard(s) {lost} named in model.safetensors.index.json are missing")
        return {k: root / f for k, f in weight_map.items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in list(root.glob("*.bin")) + list(root.glob("*.pt")))
        hint = f" (found {pickles}; pickle weights are never read: convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{root}: no *.safetensors weights{hint}")
    out: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    out[k] = f
        except Exception as e:   # safetensors raises its own error types
            raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from e
    return out


def _per_shard(files: dict[str, Path], keys: list[str], read) -> dict[str, torch.Tensor]:
    """``{key: read(handle, key)}`` over the shards holding ``keys``, each shard opened once; one-line errors."""
    from safetensors import safe_open
    by_file: dict[Path, list[str]] = {}
    for k in keys:
        by_file.setdefault(files[k], []).append(k)
    out = {}
    for f, ks in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as fh:
                have = set(fh.keys())
                absent = [k for k in ks if k not in have]
                if absent:
                    raise CheckpointError(f"{f}: tensor(s) {absent[:3]} listed in the index are not in this shard")
                for k in ks:
                    out[k] = read(fh, k)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{f}: cannot read ({e})") from e
    return out


def _read_tensors(files: dict[str, Path], keys: list[str]) -> dict[str, torch.Tensor]:
    return _per_shard(files, keys, lambda fh, k: fh.get_tensor(k))


def _model_key(key: str) -> Optional[str]:
    if _SKIP.match(key):
        return None
    for p in ("model.language_model.", "model."):
        if key.startswith(p):
            return key[len(p):]
    return key


def hf_state_dict_to_model(config: HybridConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename / stack / concatenate HF checkpoint tensors into HybridLM names (see the module docstring)."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    convs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        k = _model_key(key)
        if k is None:
            continue
        if config.family == "olmo_hybrid":
            k = k.replace(".attention_layer_norm.", ".input_layernorm.")
            k = k.replace(".feedforward_layer_norm.", ".post_attention_layernorm.")
            m = _OLMO_CONV.match(k)
            if m:
                convs.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = t
                continue
        m = _EXPERT.match(k)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
            continue
        out[k] = t
    for (prefix, what), parts in convs.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{prefix}: {what} of the q/k/v convs incomplete (found {sorted(parts)}_conv1d)")
        out[f"{prefix}.conv1d.{what}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    for prefix, by_e in experts.items():
        E = 1 + max(by_e)
        absent = [e for e in range(E) if set(by_e.get(e, {})) != {"gate_proj", "up_proj", "down_proj"}]
        if absent:
            raise CheckpointError(f"{prefix}: expert(s) {absent[:5]} lack some of gate_proj/up_proj/down_proj")
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([by_e[e]["gate_proj"], by_e[e]["up_proj"]], dim=0) for e in range(E)])
        out[f"{prefix}.down_proj"] = torch.stack([by_e[e]["down_proj"] for e in range(E)])
    return out


def _model_name(config: HybridConfig, key: str) -> Optional[str]:
    """The HybridLM parameter a checkpoint key ends up in (see :func:`hf_state_dict_to_model`), None if skipped."""
    k = _model_key(key)
    if k is None:
        return None
    if config.family == "olmo_hybrid":
        k = k.replace(".attention_layer_norm.", ".input_layernorm.")
        k = k.replace(".feedforward_layer_norm.", ".post_attention_layernorm.")
        m = _OLMO_CONV.match(k)
        if m:
            return f"{m.group(1)}.conv1d.{m.group(3)}"
    m = _EXPERT.match(k)
    if m:
        return f"{m.group(1)}.{'down_proj' if m.group(3) == 'down_proj' else 'gate_up_proj'}"
    return k


class LazyWeights:
    """HybridLM parameters read on demand from a checkpoint folder, one at a time (safetensors ``safe_open``).

    ``load(name, dtype)`` reads the checkpoint keys that make up parameter ``name`` (one key, or the experts /
    OLMo convs it stacks or concatenates, exactly as :func:`hf_state_dict_to_model` does) and casts the result.
    Peak memory is one parameter. A second weight group (e.g. ``mtp.*``) can be served by another instance built
    from its own key -> name map."""

    def __init__(self, config: HybridConfig, files: dict[str, Path], keys_of: dict[str, list[str]],
                 aliases: Optional[dict[str, str]] = None):
        self.config, self.files, self.keys_of = config, files, keys_of
        self.aliases = dict(aliases or {})          # model name -> the name it is read as (tied lm_head)

    def names(self) -> list[str]:
        return sorted(set(self.keys_of) | set(self.aliases))

    def load(self, name: str, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        src = self.aliases.get(name, name)
        keys = self.keys_of[src]
        if src.endswith((".experts.gate_up_proj", ".experts.down_proj")):   # per-expert keys: stacked together
            prefix = src.rsplit(".", 1)[0]
            keys = self.keys_of.get(prefix + ".gate_up_proj", []) + self.keys_of.get(prefix + ".down_proj", [])
        out = hf_state_dict_to_model(self.config, _read_tensors(self.files, keys))
        t = out[src]
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def _header_tensors(files: dict[str, Path], keys: list[str]) -> dict[str, torch.Tensor]:
    """Meta tensors with the shape and dtype of checkpoint keys, from the safetensors headers (no data read)."""
    def header(fh, k):
        sl = fh.get_slice(k)
        return torch.empty(sl.get_shape(), dtype=_ST_DTYPES[sl.get_dtype()], device="meta")
    return _per_shard(files, keys, header)


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def _check_layer_kinds(config: HybridConfig, sd: dict, where: str) -> None:
    found: dict[int, set[str]] = {}
    for k in sd:
        m = _LAYER.match(k)
        if m:
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    n = config.num_layers
    extra = sorted(i for i in found if i >= n)
    if extra:
        raise CheckpointError(f"{where}: weights for layer(s) {extra[:5]} but config.json has num_hidden_layers={n}")
    for i, t in enumerate(config.layer_types):
        kinds = found.get(i, set())
        has_gdn, has_attn = "linear_attn" in kinds, "self_attn" in kinds
        want_gdn = t == "linear_attention"
        if (want_gdn and has_attn) or (not want_gdn and has_gdn):
            held = "a Gated DeltaNet (linear_attn)" if has_gdn else "an attention (self_attn)"
            raise CheckpointError(f"{where}: config.json's layer_types says layer {i} is {t}, but the weights hold "
                                  f"{held} block for it; fix layer_types or use the matching weights")


def load_hf_causal_lm(folder: str | Path, *, dtype: Optional[torch.dtype] = None, lazy: bool = False) -> HybridLM:
    """The HybridLM of a HF folder, on the CPU, in the checkpoint's dtypes (or all floating weights in ``dtype``).

    ``lazy``: no weight is read; every parameter is a zero-size placeholder (a stride-0 view of one zero, of the
    right shape and dtype: enough to trace the model, not to run it) and ``model.lazy_weights`` (a
    :class:`LazyWeights`) reads the real values one parameter at a time (the export streams them to disk).

    Raises UnsupportedModelError (architecture / feature not supported) or CheckpointError (files missing,
    unreadable or not matching config.json), each with one line naming the file and the problem."""
    config, _ = read_hf_config(folder)
    files = hf_weight_files(folder)
    keys = [k for k in files if _model_key(k) is not None]
    read = _header_tensors if lazy else _read_tensors
    model_sd = hf_state_dict_to_model(config, read(files, keys))
    where = str(Path(folder))
    _check_layer_kinds(config, model_sd, where)
    if config.gdn is not None and any(k.endswith("linear_attn.conv1d.bias") for k in model_sd):
        config.gdn.conv_bias = True      # a GDN conv bias (OLMo-core checkpoints); every GDN layer must have one
    aliases: dict[str, str] = {}
    if config.tie_word_embeddings and "lm_head.weight" in model_sd:
        head = model_sd.pop("lm_head.weight")
        emb = model_sd.get("embed_tokens.weight")
        if emb is None:
            model_sd["embed_tokens.weight"] = head
            aliases = {"embed_tokens.weight": "lm_head.weight"}
        elif not _same_values(head, emb, files, config):   # transformers does not tie differing weights either
            config.tie_word_embeddings = False
            config.notes.append("tie_word_embeddings is set but lm_head.weight differs from the embeddings: "
                                "kept separate, as transformers does")
            model_sd["lm_head.weight"] = head
    with torch.device("meta"):
        model = HybridLM(config)
    own = model.state_dict()
    missing = sorted(set(own) - set(model_sd))
    unexpected = sorted(set(model_sd) - set(own))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise CheckpointError(f"{where}: the weights do not match config.json ({config.architecture}): "
                              f"{'; '.join(parts)} (names after mapping to HybridLM)")
    bad = [f"{k} {tuple(model_sd[k].shape)} (config gives {tuple(own[k].shape)})" for k in own
           if tuple(model_sd[k].shape) != tuple(own[k].shape)]
    if bad:
        raise CheckpointError(f"{where}: weight shapes do not match config.json: {'; '.join(bad[:3])}")
    if lazy:
        keys_of: dict[str, list[str]] = {}
        for k in keys:
            keys_of.setdefault(_model_name(config, k), []).append(k)
        placeholders = {k: torch.zeros((), dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype)
                        .expand(v.shape) for k, v in model_sd.items()}
        model.load_state_dict(placeholders, strict=True, assign=True)
        model.lazy_weights = LazyWeights(config, files, keys_of, aliases)
        return model.eval()
    if dtype is not None:
        model_sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model_sd.items()}
    model.load_state_dict({k: _aligned(v) for k, v in model_sd.items()}, strict=True, assign=True)
    return model.eval()


def _same_values(head: torch.Tensor, emb: torch.Tensor, files: dict[str, Path], config: HybridConfig) -> bool:
    """Whether lm_head and the embeddings hold equal values (meta tensors: read both, one comparison)."""
    if head.device.type != "meta":
        return torch.equal(head, emb)
    names = {_model_name(config, k): k for k in files if _model_name(config, k) in ("lm_head.weight",
                                                                                    "embed_tokens.weight")}
    t = _read_tensors(files, [names["lm_head.weight"], names["embed_tokens.weight"]])
    return torch.equal(t[names["lm_head.weight"]], t[names["embed_tokens.weight"]])


# PyTorch's CPU allocator aligns every tensor to 64 bytes; safetensors tensors are views into the memory-mapped file
# at the file's offsets (4- or 8-byte aligned). MKL's GEMV/GEMM take alignment-dependent code paths, so the same
# weights at another alignment give other last-bit results: measured 5e-7..1.4e-6 max |diff| in the logits of the
# tiny Qwen3.5-MoE model (its [1, hidden] shared_expert_gate) between a single-file and a sharded folder.
_ALIGN = 64


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself where it starts on a 64-byte boundary, else an aligned copy."""
    return t if t.data_ptr() % _ALIGN == 0 else t.clone(memory_format=torch.contiguous_format)
