"""Shard-holder Ray actors: the client over actors equals the in-process client; a restart reloads from disk."""

import dataclasses

import numpy as np
import pytest
import ray

from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.manifest import IndexMismatchError
from bridge_ray.shard_holder.group import start_shard_holders

pytestmark = pytest.mark.slow


def test_actor_shards_answer_exactly_like_in_process_shards(local_ray, world_index, small_world, minilm_spec):
    encoder = QueryEncoder(minilm_spec)
    questions = [q["question"] for q in load_split(small_world, "dev")]
    handles = start_shard_holders(world_index, minilm_spec, num_cpus=0.5, max_restarts=1)
    assert len(handles) == 2
    remote = RetrieverClient(encoder, handles, num_candidates=40)
    local = RetrieverClient.from_index(encoder, world_index, num_candidates=40)
    assert remote.shards.actors and not local.shards.actors
    for a, b in zip(remote.retrieve(questions), local.retrieve(questions), strict=True):
        assert (a.doc_ids, a.scores, a.shown) == (b.doc_ids, b.scores, b.shown)
    ids = [0, 147, 73, 74, 1]  # both shards, out of order
    np.testing.assert_array_equal(remote.doc_embeddings(ids).numpy(), local.doc_embeddings(ids).numpy())
    assert remote.passages(ids) == local.passages(ids)

    # A killed shard holder restarts, reloads its shard from disk in its constructor and answers the same.
    pid = ray.get(handles[0].info.remote())["pid"]
    ray.kill(handles[0], no_restart=False)
    again = RetrieverClient(encoder, handles, num_candidates=40)
    assert ray.get(handles[0].info.remote())["pid"] != pid
    assert [r.doc_ids for r in again.retrieve(questions)] == [r.doc_ids for r in local.retrieve(questions)]
    for h in handles:
        ray.kill(h)


def test_wrong_index_fails_before_any_actor_starts(local_ray, world_index, minilm_spec):
    with pytest.raises(IndexMismatchError, match="passage_prefix"):
        start_shard_holders(world_index, dataclasses.replace(minilm_spec, passage_prefix="passage: "))
    with pytest.raises(TypeError, match="all Ray actor handles or all in-process"):
        ShardSet([*start_shard_holders(world_index, num_cpus=0.25)[:1], *ShardSet.local(world_index).shards[1:]])
