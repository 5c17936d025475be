"""η*, the two-state estimator's second retriever state: it trains on L_RAG alone, over its own candidates."""

import math

import torch

from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.config import load_config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retriever_learner.two_state import LowerLevelState
from bridge_ray.retriever_learner.update import RetrieverBatch


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


def _trajectory(uid: str, queries: list[str], logged_ids: list[list[int]]) -> Trajectory:
    t = Trajectory.start(uid, "q", ["blue"], 0, [1, 2], 0)
    t.retrieval_turns = [RetrievalTurn(n, [1, 2, n], "", query, ids, [0.5] * len(ids), [], 0, 0)
                         for n, (query, ids) in enumerate(zip(queries, logged_ids, strict=True))]
    return t


def test_own_trajectories_hold_eta_stars_top_k_for_each_logged_query_and_its_update_ranks_them(world_index):
    """two_state.candidates own: each logged turn keeps its query and h_t and gets η*'s own top k and scores, which
    a sampler scores like the logged candidates; η*'s update then reads g(d) of those, not of the logged ones."""
    config = load_config(None, [f"retrieval.index.dir={world_index}", "algorithm.retriever.num_candidates=4",
                                "algorithm.retriever.num_shown=2", "algorithm.retriever.lr=1e-2"])
    shards = ShardSet.local(world_index, config.retrieval.encoder.spec())
    fetched: list[torch.Tensor] = []

    def doc_embeddings(ids: torch.Tensor) -> torch.Tensor:
        fetched.append(ids.clone())
        return shards.doc_embeddings(ids)

    lower = LowerLevelState(config.retrieval, config.algorithm.retriever, shards, doc_embeddings=doc_embeddings)
    queries = ["Who founded the city of Varnholt?", "Which river runs through Ostrava?", "Who built Couxholm?"]
    own_ids, own_scores = lower.retrieval_log(queries)
    logged_ids = [[i for i in range(40) if i not in row][:4] for row in own_ids]  # none of η*'s own top k
    logged = [_trajectory("a", queries[:2], logged_ids[:2]), _trajectory("b", queries[2:], logged_ids[2:]),
              _trajectory("c", [], [])]
    own = lower.own_trajectories(logged)
    turns = [turn for t in own for turn in t.retrieval_turns]
    assert [turn.query for turn in turns] == queries and [turn.prefix_ids for turn in turns] == [
        turn.prefix_ids for t in logged for turn in t.retrieval_turns], "the logged turns, as logged"
    assert [turn.doc_ids for turn in turns] == own_ids != logged_ids
    assert [turn.scores for turn in turns] == own_scores
    assert [turn.doc_ids for t in logged for turn in t.retrieval_turns] == logged_ids, "the logged ones untouched"

    batch = RetrieverBatch.from_turns(queries, [t.doc_ids for t in turns], [t.scores for t in turns],
                                      [[-1.0, -5.0, -5.0, -5.0]] * 3, [1.0, -1.0, 0.5])
    before = {k: v.clone() for k, v in lower.updater.encoder.adapter_state_dict().items()}
    lower.update_on(batch)
    after = lower.updater.encoder.adapter_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the update moved eta*'s adapter"
    assert [row.tolist() for row in fetched[-1]] == own_ids
    assert [t.retrieval_turns[0].retriever_version for t in lower.own_trajectories(logged[:1])] == [1], (
        "a later retrieval log is η*'s next version's")


def test_own_candidates_train_with_the_two_state_estimator():
    assert load_config(None).algorithm.two_state.candidates == "logged", "the default"
    config = load_config(None, ["algorithm.estimator=two_state", "algorithm.two_state.candidates=own"])
    assert (config.algorithm.estimator, config.algorithm.two_state.candidates) == ("two_state", "own")
