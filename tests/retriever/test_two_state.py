"""η*, the two-state estimator's second retriever state: it trains on L_RAG alone, over its own candidates."""

import math

import pytest
import torch

from bridge_ray.config import ConfigError, load_config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever.two_state import LowerLevelState
from bridge_ray.retriever.update import RetrieverBatch


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


@pytest.mark.parametrize("candidates", ["logged", "own"])
def test_update_on_ranks_the_logged_candidates_or_its_own_top_k(world_index, candidates):
    """logged: η*'s update reads g(d) of the candidates η_γ logged and needs no scores; own: of its own top k for
    each logged query, which the caller's scorer is asked for."""
    config = load_config(None, [f"retrieval.index.dir={world_index}", "algorithm.retriever.num_candidates=4",
                                "algorithm.retriever.num_shown=2", "algorithm.retriever.lr=1e-2",
                                f"algorithm.two_state.candidates={candidates}"])
    shards = ShardSet.local(world_index, config.retrieval.encoder.spec())
    fetched: list[torch.Tensor] = []

    def doc_embeddings(ids: torch.Tensor) -> torch.Tensor:
        fetched.append(ids.clone())
        return shards.doc_embeddings(ids)

    lower = LowerLevelState(config.retrieval, config.algorithm.retriever, shards, doc_embeddings=doc_embeddings,
                            candidates=config.algorithm.two_state.candidates)
    queries = ["Who founded the city of Varnholt?", "Which river runs through Ostrava?"]
    own_ids, _ = lower.retrieval_log(queries)
    logged_ids = [[i for i in range(40) if i not in row][:4] for row in own_ids]  # none of η*'s own top k
    logged = RetrieverBatch.from_turns(queries, logged_ids, [[0.5, 0.4, 0.3, 0.2]] * 2,
                                       [[-1.0, -5.0, -5.0, -5.0]] * 2, [1.0, -1.0])
    asked: list[list[list[int]]] = []

    def score(qs, ids):
        assert list(qs) == queries
        asked.append([list(row) for row in ids])
        return [[-1.0, -5.0, -5.0, -5.0]] * len(ids)

    before = {k: v.clone() for k, v in lower.updater.encoder.adapter_state_dict().items()}
    lower.update_on(logged, score)
    after = lower.updater.encoder.adapter_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the update moved eta*'s adapter"
    expected = logged_ids if candidates == "logged" else own_ids
    assert [row.tolist() for row in fetched[-1]] == expected
    assert asked == ([] if candidates == "logged" else [own_ids])
    if candidates == "own":
        with pytest.raises(ValueError, match="needs score"):
            lower.update_on(logged)


def test_own_candidates_are_refused_where_training_cannot_score_them():
    assert load_config(None).algorithm.two_state.candidates == "logged", "the default is today's behaviour"
    with pytest.raises(ConfigError, match=r"two_state\.candidates: own is not trained yet.*algorithm\.two_state"):
        load_config(None, ["algorithm.estimator=two_state", "algorithm.two_state.candidates=own"])
