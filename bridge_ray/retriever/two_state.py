"""η*, the second retriever state of the two-state estimator (eq. penalty-theorem-2).

Only the two-state estimator needs it: a retriever trained on ``L_RAG`` alone (γ = ∞), beside the penalised
η_γ that BRIDGE keeps. It costs what Section 3.2 says it does — its own adapter, its own optimizer state and
its own retrieval log (the top k of *its* queries, whose document embeddings the update fetches) — which is
what ``bench retriever-update`` measures against BRIDGE's single state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bridge_ray.config import RetrievalConfig, RetrieverObjectiveConfig
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever.update import RetrieverBatch, RetrieverUpdater


class LowerLevelState:
    """η*: a query encoder with its own LoRA adapter and optimizer, updated on ``L_RAG`` over its own candidates."""

    def __init__(
        self, retrieval: RetrievalConfig, objective: RetrieverObjectiveConfig, shards: ShardSet, device: str = "auto"
    ) -> None:
        encoder = QueryEncoder.from_config(retrieval, device=device)
        self.client = RetrieverClient(
            encoder, shards, num_candidates=objective.num_candidates, num_shown=objective.num_shown
        )
        rag_only = objective.model_copy(update={"gamma": math.inf})
        self.updater = RetrieverUpdater(
            encoder, shards.doc_embeddings, rag_only, micro_batch_size=objective.micro_batch_size
        )

    def retrieval_log(self, queries: Sequence[str]) -> tuple[list[list[int]], list[list[float]]]:
        """The k candidates η* ranks highest for each query, and their scores: the turns its update runs on."""
        results = self.client.retrieve(list(queries))
        return [r.doc_ids for r in results], [r.scores for r in results]

    def step(
        self, queries: Sequence[str], answer_logp: Sequence[Sequence[float]], advantages: Sequence[float]
    ) -> dict[str, float]:
        """One η* update: retrieve with η*, then ``L_RAG`` on those candidates (``answer_logp`` scores them)."""
        doc_ids, scores = self.retrieval_log(queries)
        batch = RetrieverBatch.from_turns(queries, doc_ids, scores, answer_logp, advantages)
        return self.updater.step(batch)
