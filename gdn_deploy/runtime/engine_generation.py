"""Generation from an export folder on the graphed decode engine (:mod:`.cuda_engine`), for the torch backend.

:func:`generate_on_engine` takes the same arguments as :func:`.generation.generate` and returns the same
:class:`.generation.GenerationResult`, but runs the backend's model through a :class:`.cuda_engine.DecodeEngine`:
one pool slot per prompt, a KV capacity of the longest prompt + budget, the decode step replayed from one CUDA graph
per batch bucket on a GPU (eager on the CPU), finished sequences releasing their slots. ``samples/decode_loop.py``
uses it for ``--backend torch`` on CUDA unless ``--engine off`` (``--engine fused``: the fused step).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from ..errors import UsageError
from .folder import ExportFolder
from .generation import GenerationResult, check_prompts, token_budgets
from .sampling import SamplingConfig

__all__ = ["engine_unsupported", "generate_on_engine"]


def engine_unsupported(backend) -> Optional[str]:
    """None when the engine can run this backend's model, else why not (one line)."""
    if getattr(backend, "name", None) != "torch":
        return f"the decode engine runs the torch backend's model, not {getattr(backend, 'name', backend)!r}"
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "forward_prefill") or not hasattr(model, "hybrid_config"):
        return "the decode engine runs language models (HybridLM)"
    return None


def generate_on_engine(folder: ExportFolder, backend, prompts: Sequence[Sequence[int]],
                       max_new_tokens: Union[int, Sequence[int]], eos_token_ids: Optional[Sequence[int]] = None,
                       sampling: Optional[SamplingConfig] = None, stop_strings: Sequence[str] = (),
                       decode_text: Optional[Callable[[list[int]], str]] = None,
                       on_text: Optional[Callable[[int, str], None]] = None,
                       graphs: Optional[bool] = None, fuse: bool = False) -> GenerationResult:
    """:func:`.generation.generate` on a :class:`.cuda_engine.DecodeEngine` (``graphs``: None = on CUDA;
    ``fuse``: the torch.compile-fused step, CUDA only)."""
    from .cuda_engine import DecodeEngine, engine_generate
    why = engine_unsupported(backend)
    if why is not None:
        raise UsageError(f"--engine on: {why}")
    check_prompts(folder, prompts, max_new_tokens)
    budgets = token_budgets(max_new_tokens, len(prompts))
    capacity = max(len(p) + n for p, n in zip(prompts, budgets))
    engine = DecodeEngine(backend.model, pool_size=len(prompts), capacity=capacity, graphs=graphs, fuse=fuse)
    eos = list(folder.eos_token_ids if eos_token_ids is None else eos_token_ids)
    return engine_generate(engine, prompts, budgets, sampling=sampling, eos_token_ids=eos,
                           stop_strings=stop_strings, decode_text=decode_text, on_text=on_text)
