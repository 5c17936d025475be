"""η*, the two-state estimator's second retriever state: it trains on L_RAG alone, over its own candidates."""

import math

import torch

from bridge_ray.config import load_config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever.two_state import LowerLevelState


def test_the_lower_level_state_retrieves_with_its_own_queries_and_moves_its_own_adapter(world_index):
    config = load_config(None, [f"retrieval.index.dir={world_index}", "algorithm.retriever.num_candidates=4",
                                "algorithm.retriever.num_shown=2", "algorithm.retriever.lr=1e-2"])
    shards = ShardSet.local(world_index, config.retrieval.encoder.spec())
    lower = LowerLevelState(config.retrieval, config.algorithm.retriever, shards)
    assert math.isinf(lower.updater.objective.gamma), "eta* minimises L_RAG alone"
    queries = ["Who founded the city of Varnholt?", "Which river runs through Ostrava?"]
    doc_ids, scores = lower.retrieval_log(queries)
    assert [len(ids) for ids in doc_ids] == [4, 4] and all(s[0] >= s[-1] for s in scores)
    before = {k: v.clone() for k, v in lower.updater.encoder.adapter_state_dict().items()}
    answer_logp = [[-1.0, -5.0, -5.0, -5.0], [-5.0, -1.0, -5.0, -5.0]]
    figures = lower.step(queries, answer_logp, [1.0, -1.0])
    after = lower.updater.encoder.adapter_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the update moved eta*'s adapter"
    assert figures["retriever_version"] == 1.0
    # its next retrieval log ranks with the moved adapter: the scores of its own top k change
    assert lower.retrieval_log(queries)[1] != scores
