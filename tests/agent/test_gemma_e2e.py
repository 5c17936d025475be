"""End to end on the real models: Gemma 3 270M (HF engine) searching the small world with the production
retriever."""


import pytest
import torch
from agent_helpers import action_ends_properly, check_trajectory, teacher_forced_logprobs

from bridge_ray.agent.loop import SearchAgent
from bridge_ray.agent.prompt import FEW_SHOT_TEMPLATE, PromptTemplate
from bridge_ray.agent.protocol import STOP_STRINGS
from bridge_ray.agent.scoring import answer_groups
from bridge_ray.config import RolloutConfig
from bridge_ray.engines.hf import HFEngine

pytestmark = pytest.mark.slow

SETTINGS = RolloutConfig(max_turns=2, max_prompt_length=512, max_response_length=320, max_action_length=24,
                         max_observation_length=96, temperature=1.0)


@pytest.fixture(scope="module")
def rollouts(gemma_model, gemma_tokenizer, retriever, world_questions):
    engine = HFEngine(gemma_model, gemma_tokenizer, batch_size=8, seed=0)
    agent = SearchAgent(engine, retriever, gemma_tokenizer, SETTINGS, PromptTemplate.from_file(FEW_SHOT_TEMPLATE))
    calls_before = len(retriever.calls)
    trajectories = agent.rollout(world_questions[:2], group_size=3)
    return agent, trajectories, retriever.calls[calls_before:]


def test_rollouts_are_consistent(rollouts, gemma_tokenizer, retriever):
    agent, trajectories, calls = rollouts
    assert len(trajectories) == 6
    for t in trajectories:
        check_trajectory(t, gemma_tokenizer, agent.renderer, SETTINGS.max_response_length, retriever)
        action_ends_properly(t, gemma_tokenizer, SETTINGS.max_action_length, STOP_STRINGS)
    turns = [turn for t in trajectories for turn in t.retrieval_turns]
    assert turns, "the few-shot prompt makes Gemma search"
    assert len(calls) <= SETTINGS.max_turns and sum(map(len, calls)) == len(turns)  # one call per turn


def test_recorded_logprobs_match_teacher_forcing(rollouts, gemma_model):
    _, trajectories, _ = rollouts
    for t in trajectories:
        recorded = torch.tensor([lp for lp, m in zip(t.logprobs, t.action_mask, strict=True) if m])
        # fp32 both ways; batching with left padding and the KV cache change only the summation order
        expected = teacher_forced_logprobs(gemma_model, t.token_ids, t.action_mask)
        torch.testing.assert_close(recorded, expected, atol=2e-4, rtol=0)


def test_answer_scores_on_gemma_equal_naive(rollouts, gemma_model, gemma_tokenizer, retriever):
    agent, trajectories, _ = rollouts
    (_, _, group), *_ = answer_groups(trajectories, gemma_tokenizer, agent.renderer, retriever.passages)
    fast = agent.engine.continuation_log_probs([group])[0]
    naive = []
    for cont, n in zip(group.continuations, group.num_scored, strict=True):
        mask = [0] * (len(group.prefix) + len(cont) - n) + [1] * n
        naive.append(teacher_forced_logprobs(gemma_model, [*group.prefix, *cont], mask).sum())
    torch.testing.assert_close(fast, torch.stack(naive), atol=1e-3, rtol=0)
