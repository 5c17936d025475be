"""Build the configured generation engine (``engine.backend``) for the configured policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from bridge_ray.engines.base import GenerationEngine
from bridge_ray.engines.hf import HFEngine
from bridge_ray.engines.models import load_causal_lm, load_tokenizer
from bridge_ray.engines.precision import resolve_precision, vllm_dtype
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.retrieval.encoder import resolve_device

if TYPE_CHECKING:
    from bridge_ray.config import Config


def build_engine(config: Config, seed: int | None = None, device: str = "auto") -> GenerationEngine:
    """An HF or vLLM engine serving ``policy.model`` (its ``.tokenizer`` is the policy's tokenizer).

    ``device`` places the HF engine (a sampler passes its role's: ``cuda`` when Ray gave it a GPU); vLLM places
    itself.

    vLLM's context length defaults to ``rollout.max_prompt_length + rollout.max_response_length``.
    """
    policy, engine = config.policy, config.engine
    seed = config.run.seed if seed is None else seed
    if engine.backend == "hf":
        return build_hf_engine(config, policy.model, seed, device)
    from bridge_ray.engines.vllm_engine import VLLMEngine  # optional: vllm is an extra (gpu, vllm-cpu)

    v = engine.vllm
    return VLLMEngine(
        resolve_model_path(policy.model),
        dtype=vllm_dtype(policy.dtype, on_gpu=torch.cuda.is_available()),
        trust_remote_code=policy.trust_remote_code,
        seed=seed,
        max_model_len=v.max_model_len or config.rollout.max_prompt_length + config.rollout.max_response_length,
        gpu_memory_utilization=v.gpu_memory_utilization,
        cpu_kv_cache_gib=v.cpu_kv_cache_gib,
        max_num_seqs=v.max_num_seqs,
        enforce_eager=v.enforce_eager,
        enable_prefix_caching=v.enable_prefix_caching,
        tensor_parallel_size=v.tensor_parallel_size,
        enable_lora=config.learner.lora.enabled if v.enable_lora is None else v.enable_lora,
        max_lora_rank=v.max_lora_rank,
    )


def build_hf_engine(config: Config, model: str, seed: int, device: str = "auto") -> HFEngine:
    """The HF engine for ``model`` (the policy or a copy of it) on ``device`` (auto: CUDA when there is one), at
    ``policy.dtype``'s precision there."""
    policy, where = config.policy, resolve_device(device)
    precision = resolve_precision(policy.dtype, "policy.dtype", where.type)
    return HFEngine(
        load_causal_lm(model, precision.weights, policy.trust_remote_code).to(where),
        load_tokenizer(model, policy.trust_remote_code),
        config.engine.hf.batch_size, policy.score_batch_size, seed, precision, config.engine.hf.prefix_cache,
        config.engine.hf.merge_adapter,
    )
