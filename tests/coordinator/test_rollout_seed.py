"""A rollout's seed fixes its tokens, whatever the sampler sampled before: what lets a resumed run, a redone
round and a share re-sent to a revived sampler sample what the first attempt sampled. The tiny policy and the
small world's index, in process."""

import pytest
from job_fixtures import job_config, tiny_policy_overrides

from bridge_ray.coordinator.inputs import index_dir, train_questions
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.sampler.sampler import Sampler

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sampler(tiny_policy, module_dir):
    config = job_config(module_dir, *tiny_policy_overrides(tiny_policy))
    sampler = Sampler(config, ShardSet.local(index_dir(config), config.retrieval.encoder.spec()), seed=0)
    yield sampler, train_questions(config)
    sampler.client.close()


def test_the_same_seed_samples_the_same_tokens_after_other_rollouts(sampler):
    sampler, questions = sampler
    _, first = sampler.rollout(questions[:2], 2, seed=11)
    sampler.rollout(questions[2:4], 2, seed=12)  # moves the engine's generator on
    _, again = sampler.rollout(questions[:2], 2, seed=11)
    summaries, other = sampler.rollout(questions[:2], 2, seed=13)
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    assert [t.token_ids for t in other] != [t.token_ids for t in first]
    assert [s.sample_index for s in summaries] == [t.sample_index for t in other], "a summary per trajectory"
