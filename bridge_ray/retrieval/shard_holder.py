"""FAISS shard-holder actors: one :class:`IndexShard` per actor, loaded from disk in the constructor.

A restarted actor (``max_restarts``) re-runs the constructor and so rebuilds its shard from the index
directory, which must be readable at the same path on every node (shared storage). An actor given GPUs
moves its FAISS index to the GPU when faiss-gpu is installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from bridge_ray.retrieval.manifest import VerifyMode, load_manifest
from bridge_ray.retrieval.presets import EncoderSpec
from bridge_ray.retrieval.shard import IndexShard
from bridge_ray.runtime.calls import get_within

ShardHolder = ray.remote(IndexShard)


def start_shard_holders(
    index_dir: str | Path,
    encoder: EncoderSpec | None = None,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_restarts: int = 3,
    hnsw_ef_search: int = 128,
    ivf_nprobe: int = 32,
    verify: VerifyMode = "auto",
    options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    timeout_s: float = 600.0,
) -> list[ray.actor.ActorHandle]:
    """One shard-holder actor per shard of ``index_dir``; waits until every shard has loaded.

    ``options``: extra ``.options()`` for every actor (e.g. a placement-group scheduling strategy), or
    one mapping per shard. Calls are retried on a restarted actor (``max_task_retries``), searches
    being read-only. ``timeout_s`` bounds the wait for every shard to load. The index is checked here
    (sizes, and sha256 as ``verify`` says: ``retrieval.index.verify``), so a damaged one is a clean error on
    the driver; the actors then check only sizes, also when Ray restarts them.
    """
    index_dir = str(Path(index_dir).resolve())
    manifest = load_manifest(index_dir, encoder, verify=verify)  # fail here, before any actor starts
    per_shard = list(options) if isinstance(options, Sequence) else [options or {}] * len(manifest.shards)
    if len(per_shard) != len(manifest.shards):
        raise ValueError(f"{len(per_shard)} option sets for {len(manifest.shards)} shards of {index_dir}")
    handles = [
        ShardHolder.options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_restarts=max_restarts,
            max_task_retries=max_restarts,
            **per_shard[shard.id],
        ).remote(
            index_dir, shard.id, encoder, use_gpu=num_gpus > 0, hnsw_ef_search=hnsw_ef_search,
            ivf_nprobe=ivf_nprobe, verify="never",
        )
        for shard in manifest.shards
    ]
    get_within([h.info.remote() for h in handles], timeout_s, f"shard holders of {index_dir} (loading)")
    return handles
