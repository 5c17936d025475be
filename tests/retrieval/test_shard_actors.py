"""Shard-holder Ray actors: the client over actors (through their handle) equals the in-process client; a restart
reloads from disk; another actor attaches to them by name."""

import dataclasses
import sys

import numpy as np
import pytest
import ray

from bridge_ray.config import load_config
from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import LocalShards, RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.manifest import IndexMismatchError
from bridge_ray.shard_holder.group import start_shard_holders
from bridge_ray.shard_holder.handle import ShardHolders

pytestmark = pytest.mark.slow


def test_actor_shards_answer_exactly_like_in_process_shards(local_ray, world_index, small_world, minilm_spec):
    encoder = QueryEncoder(minilm_spec)
    questions = [q["question"] for q in load_split(small_world, "dev")]
    holders = start_shard_holders(world_index, minilm_spec, num_cpus=0.5, max_restarts=1)
    assert len(holders) == 2
    remote = RetrieverClient(encoder, holders, num_candidates=40)
    local = RetrieverClient.from_index(encoder, world_index, num_candidates=40)
    assert isinstance(remote.shards.calls, ShardHolders) and isinstance(local.shards.calls, LocalShards)
    for a, b in zip(remote.retrieve(questions), local.retrieve(questions), strict=True):
        assert (a.doc_ids, a.scores, a.shown) == (b.doc_ids, b.scores, b.shown)
    ids = [0, 147, 73, 74, 1]  # both shards, out of order
    np.testing.assert_array_equal(remote.doc_embeddings(ids).numpy(), local.doc_embeddings(ids).numpy())
    assert remote.passages(ids) == local.passages(ids)
    # a shard holder searches with numpy and faiss alone: its process loads no torch (seconds and hundreds of MB
    # per shard at every graph start)
    assert not ray.get(holders.group[0].__ray_call__.remote(lambda _: "torch" in sys.modules), timeout=60)

    # A killed shard holder restarts, reloads its shard from disk in its constructor and answers the same, also to
    # a client attached by name, as a sampler's is.
    pid = holders.loaded()[0]["pid"]
    ray.kill(holders.group[0], no_restart=False)
    attached = ShardHolders.attach(holders.named(), load_config(None, ["run.call_timeout_s=120"]))
    again = RetrieverClient(encoder, attached, num_candidates=40)
    assert attached.loaded()[0]["pid"] != pid
    assert [r.doc_ids for r in again.retrieve(questions)] == [r.doc_ids for r in local.retrieve(questions)]
    holders.shutdown()


def test_wrong_index_fails_before_any_actor_starts(local_ray, world_index, minilm_spec):
    with pytest.raises(IndexMismatchError, match="passage_prefix"):
        start_shard_holders(world_index, dataclasses.replace(minilm_spec, passage_prefix="passage: "))
    holders = start_shard_holders(world_index, num_cpus=0.25)
    try:  # an actor handle among in-process shards: the handle of the holders is the one way to reach them
        with pytest.raises(TypeError, match="must be IndexShard objects"):
            ShardSet([holders.group[0], *ShardSet.local(world_index).calls.shards[1:]])
    finally:
        holders.shutdown()
