"""The retriever-LoRA learner actor: the query encoder with its trainable adapter and optimizer.

It reads g(d) of the logged candidates from the shard holders, so it never encodes a document, and builds
its batch itself from the round's trajectories and answer scores, which it receives by reference. The new
adapter leaves as a ref too (its calls have two returns), for the samplers. It is never restarted: its death
rolls the run back to the last checkpoint, which it is then rebuilt from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import ray
import torch

from bridge_ray.agent.types import Trajectory
from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR, RETRIEVER_OPTIMIZER_FILE
from bridge_ray.config import Config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever.update import RetrieverBatch, RetrieverUpdater
from bridge_ray.runtime.placement import role_device

# (adapter state dict, retriever version): what the samplers load (``Sampler.set_retriever_adapter``).
Adapter = tuple[dict[str, torch.Tensor], int]


def retriever_batch(
    trajectories: Sequence[Trajectory], answer_logp: Sequence[Sequence[Sequence[float]]], advantages: torch.Tensor
) -> RetrieverBatch:
    """Every logged retrieval turn, with its trajectory's advantage (eq. app_retrieval_rl_loss's A_i)."""
    rows = [
        (turn, logp, float(advantages[i]))
        for i, t in enumerate(trajectories)
        for turn, logp in zip(t.retrieval_turns, answer_logp[i], strict=True)
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
        adapter = Path(checkpoint_dir) / RETRIEVER_ADAPTER_DIR if checkpoint_dir else None
        encoder = QueryEncoder.from_config(config.retrieval, adapter, device=role_device())
        self.shards = ShardSet(shards)
        objective = config.algorithm.retriever
        self.updater = RetrieverUpdater(
            encoder, self.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size, version=version
        )
        if checkpoint_dir and (Path(checkpoint_dir) / RETRIEVER_OPTIMIZER_FILE).is_file():
            self.updater.load_optimizer(checkpoint_dir)

    def doc_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shards.doc_embeddings(ids)

    def update(
        self, trajectories: list[ray.ObjectRef], answer_logp: list[ray.ObjectRef], advantages: torch.Tensor
    ) -> tuple[tuple[dict[str, float], int], Adapter]:
        """One retriever update on every retrieval turn of the round: ``trajectories`` and ``answer_logp`` are each
        sampler's share (the scores' second return), ``advantages`` one per trajectory in the same order.

        Two returns: (its figures, the new version) for the coordinator, and the new adapter for the samplers.
        """
        shares = zip(ray.get(trajectories), ray.get(answer_logp), strict=True)
        pairs = [pair for part, scores in shares for pair in zip(part, scores, strict=True)]
        stats = self.updater.step(retriever_batch([t for t, _ in pairs], [s for _, s in pairs], advantages))
        return (stats, self.updater.version), self.adapter()[1]

    def adapter(self) -> tuple[int, Adapter]:
        """(version, adapter) as two returns: the caller waits on the version, the adapter goes by ref."""
        return self.updater.version, (self.updater.encoder.adapter_state_dict(), self.updater.version)

    def save(self, directory: str) -> None:
        self.updater.save(directory)
