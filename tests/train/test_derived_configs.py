"""The configs the job derives for one use hold only what a user could write (:func:`bridge_ray.config.derive`)."""

from __future__ import annotations

from bridge_ray.config import load_config
from bridge_ray.coordinator.capacity import planned
from bridge_ray.coordinator.graph import shard_count
from bridge_ray.train.run_evals import world_config


def test_an_unbuilt_prebuilt_index_is_sized_as_the_holders_the_config_names(tmp_path):
    """Without a manifest to count, the report sizes ``roles.shard_holder.count`` holders (else num_shards); the
    derived config stays valid (one holder per shard of the index it describes)."""
    missing = str(tmp_path / "not-built")
    counted = planned(load_config(None, [f"retrieval.index.dir={missing}", "roles.shard_holder.count=3"]))
    assert (counted.retrieval.index.dir, shard_count(counted)) == (None, 3)
    assert shard_count(planned(load_config(None, [f"retrieval.index.dir={missing}"]))) == 1


def test_a_world_of_eval_worlds_is_a_run_of_its_own_world(tmp_path):
    config = load_config(None, ["eval.worlds=[gap]", f"retrieval.index.dir={tmp_path}", "roles.shard_holder.count=3",
                                "eval.worlds_max_questions=5"])
    world = world_config(config, "gap")
    assert (world.data.world, world.eval.worlds, world.data.eval, world.eval.max_questions) == ("gap", [], {}, 5)
    assert (world.retrieval.index.dir, world.roles.shard_holder.count) == (None, None)
