"""What the graph reserves and writes without Ray: only the roles that train, and a frozen policy's copy."""

from __future__ import annotations

import pytest

from bridge_ray.config import load_config
from bridge_ray.coordinator.graph import copy_policy, graph_bundles


@pytest.mark.parametrize(
    ("overrides", "roles"),
    [([], {"shard_holder", "sampler", "policy_learner", "retriever_learner"}),
     (["algorithm.train_policy=false"], {"shard_holder", "sampler", "retriever_learner"}),
     (["algorithm.train_retriever=false"], {"shard_holder", "sampler", "policy_learner"})],
)
def test_only_the_learners_of_what_trains_are_reserved(overrides, roles):
    config = load_config(None, ["roles.policy_learner.gpus=1", *overrides])
    bundles = graph_bundles(config)
    assert set(bundles) == roles
    assert sum(b.get("GPU", 0) for role in bundles.values() for b in role) == (1 if "policy_learner" in roles else 0)


def test_a_frozen_policy_is_copied_file_for_file(tmp_path):
    source = tmp_path / "policy"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    copy_policy(str(source), tmp_path / "checkpoint" / "policy")
    copied = tmp_path / "checkpoint" / "policy"
    assert (copied / "config.json").read_text() == "{}" and (copied / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
