"""The shard-holder role: one :class:`IndexShard` per Ray actor, loaded from disk in the constructor.

The shards themselves (and :class:`~bridge_ray.retrieval.client.ShardSet`, which fans searches out to them, in
process or on these actors) are the Ray-free ``retrieval`` library; this module only makes them a role. The
training graph (:class:`bridge_ray.coordinator.graph.Graph`) starts it with the ``roles.shard_holder`` resources and
start-up timeout; ``serve-retriever --ray`` and ``bench retrieval`` start it on their own.

The holders are one :class:`ActorGroup` under :attr:`Restart.RETRY`, behind their typed handle
(:class:`~bridge_ray.shard_holder.handle.ShardHolders`): a restarted actor re-runs the
constructor and so rebuilds its shard from the index directory, which must be readable at the same path on
every node (shared storage), and Ray retries the searches sent to it, searches being read-only. An actor
given GPUs moves its FAISS index to the GPU when faiss-gpu is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.retrieval.manifest import VerifyMode, load_index_manifest
from bridge_ray.retrieval.shard import IndexShard
from bridge_ray.runtime.actor_group import ActorGroup, RoleSpec
from bridge_ray.shard_holder.handle import RESTART, ROLE, ShardHolders


def start_shard_holders(
    index_dir: str | Path,
    encoder: EncoderSpec | None = None,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    resources: Mapping[str, float] | None = None,
    max_restarts: int = 3,
    hnsw_ef_search: int = 128,
    ivf_nprobe: int = 32,
    verify: VerifyMode = "auto",
    timeout_s: float = 600.0,
) -> ShardHolders:
    """One shard-holder actor per shard of ``index_dir``, in their own placement group (each bundle with custom
    ``resources`` too: ``roles.shard_holder.resources``); waits until every shard has loaded.

    ``timeout_s`` bounds the placement, the wait for every shard to load and the holders' calls. The index is
    checked here (sizes, and sha256 as ``verify`` says: ``retrieval.index.verify``), so a damaged one is a clean
    error on the driver; the actors then check only sizes, also when Ray restarts them.
    """
    index_dir = str(Path(index_dir).resolve())
    manifest = load_index_manifest(index_dir, encoder, verify=verify)  # fail here, before any actor starts
    spec = RoleSpec(len(manifest.shards), num_cpus, num_gpus, max_restarts, dict(resources or {}))
    holders = ShardHolders(ActorGroup.start(
        ROLE, IndexShard, spec, RESTART, label=f"shard holders of {index_dir}",
        args=(index_dir,), per_actor=lambda i: {"shard_id": manifest.shards[i].id},
        kwargs={"encoder": encoder, "use_gpu": num_gpus > 0, "hnsw_ef_search": hnsw_ef_search,
                "ivf_nprobe": ivf_nprobe, "verify": "never"},
        call_timeout_s=timeout_s, startup_timeout_s=timeout_s,
    ))
    try:
        holders.loaded()
    except BaseException:
        holders.shutdown()
        raise
    return holders
