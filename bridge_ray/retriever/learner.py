"""The retriever-LoRA learner actor: the query encoder with its trainable adapter and optimizer.

It reads g(d) of the logged candidates from the shard holders, so it never encodes a document.
A restart rebuilds it from the adapter directory it is given (the last checkpoint's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bridge_ray.config import Config
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever.update import ADAPTER_DIR, OPTIMIZER_FILE, RetrieverBatch, RetrieverUpdater
from bridge_ray.runtime.placement import role_device


class RetrieverLearner:
    """Made a Ray actor by the coordinator (``ray.remote(RetrieverLearner)``)."""

    def __init__(self, config: Config, shards: list, *, checkpoint_dir: str | None = None, version: int = 0) -> None:
        if config.graph.torch_threads:
            torch.set_num_threads(config.graph.torch_threads)
        adapter = Path(checkpoint_dir) / ADAPTER_DIR if checkpoint_dir else None
        encoder = QueryEncoder.from_config(config.retrieval, adapter, device=role_device())
        self.shards = ShardSet(shards)
        objective = config.algorithm.retriever
        self.updater = RetrieverUpdater(
            encoder, self.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size, version=version
        )
        if checkpoint_dir and (Path(checkpoint_dir) / OPTIMIZER_FILE).is_file():
            self.updater.load_optimizer(checkpoint_dir)

    def doc_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shards.doc_embeddings(ids)

    def update(self, batch: RetrieverBatch) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
        """One retriever update; returns its figures, the new adapter and its version (for the samplers)."""
        stats = self.updater.step(batch)
        return stats, self.updater.encoder.adapter_state_dict(), self.updater.version

    def adapter(self) -> tuple[dict[str, torch.Tensor], int]:
        return self.updater.encoder.adapter_state_dict(), self.updater.version

    def save(self, directory: str) -> None:
        self.updater.save(directory)
