"""Hybrid causal LMs (Gated DeltaNet + full attention, dense or MoE MLPs): Qwen3-Next, Qwen3.5, Qwen3.5-MoE,
OLMo-Hybrid and the bundled pure-GDN LM, loadable from Hugging Face folders (config.json + safetensors).

- :mod:`.config`: :class:`HybridConfig` (which layer is what);  :mod:`.hf_config`: reading HF config.json files
- :mod:`.gdn`, :mod:`.attention`, :mod:`.mlp`, :mod:`.norms`: the layers
- :mod:`.model`: :class:`HybridLM` (packed ragged prefill, one-token decode carrying every layer's state), GDNLM
- :mod:`.hf_folder`: :func:`load_hf_causal_lm` (single or sharded safetensors, strict key checks, clear errors)
"""
