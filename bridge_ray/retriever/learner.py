"""The retriever-LoRA learner actor: the query encoder with its trainable adapter and optimizer.

It reads g(d) of the logged candidates from the shard holders, so it never encodes a document, and builds
its batch itself from the round's trajectories and answer scores, which it receives by reference. The new
adapter leaves as a ref too (its calls have several returns, named by the bundles of
:mod:`bridge_ray.retriever.handle`), for the samplers. With the Drop and two-state
estimators it also returns what the policy ranks need for their ``L_RAG(θ, η)`` terms (:class:`RetrievalRows`)
and, for two-state, holds η* (:class:`~bridge_ray.retriever.two_state.LowerLevelState`) and updates it in its
own call. It is never restarted: its death rolls the run back to the last checkpoint, which it is then rebuilt
from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ray
import torch

from bridge_ray.agent.types import Trajectory
from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR, RETRIEVER_OPTIMIZER_FILE
from bridge_ray.config import Config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder, adapter_init_seed
from bridge_ray.retriever.two_state import LowerLevelState, logged_log_rho
from bridge_ray.retriever.update import RetrieverBatch, RetrieverUpdater
from bridge_ray.runtime.placement import role_device

# (adapter state dict, retriever version): what the samplers load (``Sampler.set_retriever_adapter``).
Adapter = tuple[dict[str, torch.Tensor], int]


@dataclass(frozen=True)
class RetrievalRows:
    """The retriever side of ``L_RAG(θ, η)`` for the policy ranks: ``log ρ_η(d | h_t)`` [M, K] of every logged
    retrieval turn's candidates under one retriever state, in the round's turn order, and their mask."""

    log_rho: torch.Tensor
    candidate_mask: torch.Tensor


def retriever_batch(
    trajectories: Sequence[Trajectory],
    answer_logp: Sequence[Sequence[Sequence[float]]],
    advantages: torch.Tensor,
    turns: Literal["all", "last"] = "all",
) -> RetrieverBatch:
    """The logged retrieval turns that train the retriever, each with its trajectory's advantage
    (eq. app_retrieval_rl_loss's A_i): every turn, or with ``turns="last"`` each trajectory's last search."""
    rows = [
        (turn, logp, float(advantages[i]))
        for i, t in enumerate(trajectories)
        for n, (turn, logp) in enumerate(zip(t.retrieval_turns, answer_logp[i], strict=True))
        if turns == "all" or n == len(t.retrieval_turns) - 1
    ]
    return RetrieverBatch.from_turns(
        [turn.query for turn, _, _ in rows],
        [turn.doc_ids for turn, _, _ in rows],
        [turn.scores for turn, _, _ in rows],
        [logp for _, logp, _ in rows],
        [adv for _, _, adv in rows],
    )


class RetrieverLearner:
    """Made a Ray actor by the coordinator (``ray.remote(RetrieverLearner)``)."""

    def __init__(self, config: Config, shards: list, *, checkpoint_dir: str | None = None, version: int = 0) -> None:
        if config.graph.torch_threads:
            torch.set_num_threads(config.graph.torch_threads)
        seed = adapter_init_seed(config.run.seed)
        torch.manual_seed(seed)  # what the learner itself draws (LoRA dropout) repeats from run to run
        adapter = Path(checkpoint_dir) / RETRIEVER_ADAPTER_DIR if checkpoint_dir else None
        encoder = QueryEncoder.from_config(config.retrieval, adapter, device=role_device(), init_seed=seed)
        self.shards = ShardSet(shards, call_timeout_s=config.run.call_timeout_s)
        self._round: tuple[RetrieverBatch, torch.Tensor] | None = None  # this round's batch and its g(d)
        self.estimator = config.algorithm.estimator
        objective = config.algorithm.retriever
        self.turns = objective.turns
        self.updater = RetrieverUpdater(
            encoder, self.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size, version=version
        )
        if checkpoint_dir and (Path(checkpoint_dir) / RETRIEVER_OPTIMIZER_FILE).is_file():
            self.updater.load_optimizer(checkpoint_dir)
        self.lower = (
            LowerLevelState(
                config.retrieval, objective, self.shards, role_device(), checkpoint_dir, self.doc_embeddings, seed
            )
            if self.estimator == "two_state" else None
        )

    def doc_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """g(d) of ``ids`` from the shard holders; the round's candidates are fetched once for every use."""
        if self._round is not None and torch.equal(ids, self._round[0].doc_ids.clamp(min=0)):
            return self._round[1]
        return self.shards.doc_embeddings(ids)

    def update(
        self, trajectories: list[ray.ObjectRef], answer_logp: list[ray.ObjectRef], advantages: torch.Tensor
    ) -> tuple[tuple[dict[str, float], int], Adapter, RetrievalRows | None]:
        """One retriever update on every retrieval turn of the round: ``trajectories`` and ``answer_logp`` are each
        sampler's share (the scores' second return), ``advantages`` one per trajectory in the same order.

        Three returns (``RetrieverUpdateRefs``): (its figures, the new version) for the coordinator, the new
        adapter for the samplers, and for Drop and two-state the :class:`RetrievalRows` of the updated η_γ for the
        policy ranks (else None).
        """
        shares = zip(ray.get(trajectories), ray.get(answer_logp), strict=True)
        pairs = [pair for part, scores in shares for pair in zip(part, scores, strict=True)]
        batch = retriever_batch([t for t, _ in pairs], [s for _, s in pairs], advantages, self.turns)
        ids = batch.doc_ids.clamp(min=0)
        self._round = batch, self.shards.doc_embeddings(ids).float()
        stats = self.updater.step(batch)
        rows = None if self.estimator == "bridge" else self._rows(self.updater)
        if self.lower is None:
            self._round = None  # g(d) of every candidate: large, and only η*'s update still needs it
        return (stats, self.updater.version), self.adapter()[1], rows

    def update_lower(self) -> tuple[dict[str, float], RetrievalRows]:
        """Two-state: η*'s update on the turns of this round's :meth:`update`, and the :class:`RetrievalRows` of
        the updated η* (two returns, ``LowerUpdateRefs``: the figures for the coordinator, the rows for the policy
        ranks)."""
        if self.lower is None or self._round is None:
            raise RuntimeError("update_lower needs estimator two_state and a round's update() first")
        stats = self.lower.update_on(self._round[0])
        rows = self._rows(self.lower.updater)
        self._round = None
        return stats, rows

    def _rows(self, updater: RetrieverUpdater) -> RetrievalRows:
        batch, g = self._round
        return RetrievalRows(logged_log_rho(updater, batch, g), batch.candidate_mask.cpu())

    def adapter(self) -> tuple[int, Adapter]:
        """(version, adapter) as two returns (``AdapterRefs``): the caller waits on the version, the adapter goes
        by ref."""
        return self.updater.version, (self.updater.encoder.adapter_state_dict(), self.updater.version)

    def save(self, directory: str) -> None:
        self.updater.save(directory)
        if self.lower is not None:
            self.lower.save(directory)
