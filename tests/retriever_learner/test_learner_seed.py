"""A run's fresh query adapter is drawn from ``run.seed``: the retriever learner's η_γ, its η* and every sampler's
encoder start from the same η_0, and two runs of one seed start (and so train) alike."""

import pytest
import torch
from job_fixtures import LOCAL_CPU

from bridge_ray.config import load_config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever_learner.learner import RetrieverLearner
from bridge_ray.sampler.sampler import Sampler

pytestmark = pytest.mark.slow


def _config(world_index, seed: int):
    return load_config(LOCAL_CPU, [f"retrieval.index.dir={world_index}", f"run.seed={seed}", "warmup.enabled=false",
                                   "algorithm.estimator=two_state", "algorithm.retriever.gamma=1.0"])


def _adapter(learner: RetrieverLearner) -> dict[str, torch.Tensor]:
    return learner.adapter().adapter[0]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_fresh_adapter_is_drawn_from_run_seed_and_shared_by_every_role(world_index, tiny_policy):
    config = _config(world_index, 0)
    shards = ShardSet.local(world_index, config.retrieval.encoder.spec())
    torch.manual_seed(1)  # the process's RNG state does not matter
    first = RetrieverLearner(config, shards)
    torch.manual_seed(2)
    again = RetrieverLearner(config, shards)
    other_seed = RetrieverLearner(_config(world_index, 1), shards)

    adapter = _adapter(first)
    assert any("lora_A" in k and v.abs().sum() > 0 for k, v in adapter.items()), "A is drawn, not zero"
    assert _equal(adapter, _adapter(again)), "two runs of one seed start from the same adapter"
    assert not any(torch.equal(adapter[k], v) for k, v in _adapter(other_seed).items() if "lora_A" in k)
    assert _equal(adapter, first.lower.updater.encoder.adapter_state_dict()), "η* starts at η_γ's η_0"

    sampler = Sampler(config, shards, seed=5, model=str(tiny_policy))
    assert _equal(adapter, sampler.client.encoder.adapter_state_dict()), "the samplers serve the learner's η_0"
