"""η*, the second retriever state of the two-state estimator (eq. penalty-theorem-2).

Only the two-state estimator needs it: a retriever trained on ``L_RAG`` alone (γ = ∞), beside the penalised
η_γ that BRIDGE keeps. It costs what Section 3.2 says it does — its own adapter, its own optimizer state and
its own retrieval log ρ_η* — which is what ``bench retriever-update`` measures against BRIDGE's single state
(:meth:`LowerLevelState.step`: η* retrieves its own top k, whose document embeddings the update fetches).

In training, ``algorithm.two_state.candidates`` says which candidates η* ranks (:meth:`LowerLevelState.update_on`
steps on the batch the retriever learner builds). ``logged`` (the default): the round's logged candidates, the
same k of every retrieval turn that the η_γ update uses, so ``L_RAG(θ, η*)`` and ``L_RAG(θ, η_γ)`` are taken over
the same candidate sets and the samplers' one scoring serves both. ``own``: η* retrieves its own top k for each
logged query (:meth:`LowerLevelState.own_trajectories`), the samplers score p_θ(y | h, d) of those candidates like
the logged ones, and η*'s update and the policy's ``−γ∇θ L_RAG(θ, η*)`` term both take them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.checkpoint import LOWER_RETRIEVER_ADAPTER_DIR, LOWER_RETRIEVER_OPTIMIZER_FILE
from bridge_ray.config import RetrievalConfig, RetrieverObjectiveConfig, derive
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater


class LowerLevelState:
    """η*: a query encoder with its own LoRA adapter and optimizer, updated on ``L_RAG`` alone.

    ``checkpoint_dir``: a checkpoint holding η* (``lower_retriever_adapter/`` and its optimizer) to resume
    from; without one η* starts at η_0, the base encoder with a fresh adapter drawn from ``init_seed`` (the
    retriever learner passes η_γ's, so both states start at the same η_0). ``doc_embeddings``: where its
    update reads g(d) (default: the shard holders; the retriever learner passes its per-round cache).
    """

    def __init__(
        self,
        retrieval: RetrievalConfig,
        objective: RetrieverObjectiveConfig,
        shards: ShardSet,
        device: str = "auto",
        checkpoint_dir: str | Path | None = None,
        doc_embeddings: Callable[[torch.Tensor], torch.Tensor] | None = None,
        init_seed: int = 0,
    ) -> None:
        saved = Path(checkpoint_dir) / LOWER_RETRIEVER_ADAPTER_DIR if checkpoint_dir else None
        encoder = QueryEncoder.from_config(
            retrieval, saved if saved and saved.is_dir() else None, device=device, init_seed=init_seed
        )
        self.client = RetrieverClient(
            encoder, shards, num_candidates=objective.num_candidates, num_shown=objective.num_shown,
            candidates=objective.candidates,
        )
        rag_only = derive(objective, {"gamma": math.inf}, source="the two-state lower retriever (RAG only)")
        self.updater = RetrieverUpdater(
            encoder, doc_embeddings or shards.doc_embeddings, rag_only, micro_batch_size=objective.micro_batch_size
        )
        if saved and (Path(checkpoint_dir) / LOWER_RETRIEVER_OPTIMIZER_FILE).is_file():
            self.updater.load_optimizer(checkpoint_dir, LOWER_RETRIEVER_OPTIMIZER_FILE)

    def retrieval_log(self, queries: Sequence[str]) -> tuple[list[list[int]], list[list[float]]]:
        """The k candidates η* ranks highest for each query, and their scores: the turns its update runs on."""
        results = self.client.retrieve(list(queries))
        return [r.doc_ids for r in results], [r.scores for r in results]

    def step(
        self, queries: Sequence[str], answer_logp: Sequence[Sequence[float]], advantages: Sequence[float]
    ) -> dict[str, float]:
        """One η* update: retrieve with η*, then ``L_RAG`` on those candidates (``answer_logp`` scores them, row by
        row in η*'s rank order: what ``bench retriever-update`` times, whose cost does not depend on the values)."""
        doc_ids, scores = self.retrieval_log(queries)
        return self.update_on(RetrieverBatch.from_turns(queries, doc_ids, scores, answer_logp, advantages))

    def own_trajectories(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """η*'s own retrieval log of ``trajectories``' retrieval turns (``two_state.candidates: own``): each turn
        as logged (its query and h_t) with η*'s top k from the index and their scores under η* (its update's old
        scores), so that a sampler scores p(y | h, d) of them as it scores the logged candidates."""
        queries = [turn.query for t in trajectories for turn in t.retrieval_turns]
        rows = iter(zip(*self.retrieval_log(queries), strict=True))

        def own(turn: RetrievalTurn) -> RetrievalTurn:
            doc_ids, scores = next(rows)
            return replace(turn, doc_ids=doc_ids, scores=scores, retriever_version=self.updater.version)

        return [replace(t, retrieval_turns=[own(turn) for turn in t.retrieval_turns]) for t in trajectories]

    def update_on(self, batch: RetrieverBatch) -> dict[str, float]:
        """One η* update on ``batch``: the round's logged turns with their candidates as η_γ's samplers logged them
        (``two_state.candidates: logged``), or with η*'s own (:meth:`own_trajectories`, scored by the samplers).

        Logged, the old scores are η_γ's, so the update's ``score_mismatch`` measures how far η* has drifted from
        the served retriever, not staleness; L_RAG alone has no ratio that would use them.
        """
        return self.updater.step(batch)

    def save(self, directory: str | Path) -> None:
        self.updater.save(directory, LOWER_RETRIEVER_ADAPTER_DIR, LOWER_RETRIEVER_OPTIMIZER_FILE)
