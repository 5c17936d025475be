"""Deriving a config (:func:`bridge_ray.config.derive`): validated like a loaded one, and the one way code does it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bridge_ray.config import Config, ConfigError, derive, load_config

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"


def test_a_derived_config_holds_the_changes_and_leaves_the_original():
    config = load_config(None, ["run.rounds=5"])
    derived = derive(config, {"run.rounds": 1, "warmup.enabled": False}, source="a test")
    assert (derived.run.rounds, derived.warmup.enabled, config.run.rounds) == (1, False, 5)
    assert derived.algorithm == config.algorithm


@pytest.mark.parametrize(("changes", "key"), [
    ({"run.rounds": 0}, "run.rounds"),
    ({"rollout.temperature": -1.0}, "rollout.temperature"),
    ({"run.roundz": 1}, "run.roundz"),
    ({"policy.model": 3}, "policy.model"),  # strict, as loading is: no number for a name
])
def test_a_bad_value_is_an_error_naming_the_key_and_the_source(changes, key):
    with pytest.raises(ConfigError, match=rf"invalid configuration \(bench learn\):\n  {re.escape(key)}: .*"
                                          rf"\[bench learn: {re.escape(key)}="):
        derive(Config(), changes, source="bench learn")


def test_a_cross_field_check_runs_on_the_derived_config():
    with pytest.raises(ConfigError, match=r"optim.mini_batch_size \(64\) must divide rollout.questions_per_batch"):
        derive(Config(), {"rollout.questions_per_batch": 100}, source="a test")


def test_a_section_derives_alone_and_its_errors_name_its_own_keys():
    objective = Config().algorithm.retriever
    assert math.isinf(derive(objective, {"gamma": math.inf}, source="RAG only").gamma)
    with pytest.raises(ConfigError, match=r"gamma: .*\[bench estimators --gammas: gamma=-1"):
        derive(objective, {"gamma": -1}, source="bench estimators --gammas")


def test_a_list_item_is_changed_by_its_index():
    stages = ["stages=[{name: a, train: both, rounds: 2}, {name: b, train: policy, rounds: 3}]"]
    derived = derive(load_config(None, stages), {"stages.1.rounds": 6}, source="a test")
    assert [stage.rounds for stage in derived.stages] == [2, 6]
    with pytest.raises(ConfigError, match=r"a test: stages.2.rounds: stages has items 0 to 1, not '2'"):
        derive(load_config(None, stages), {"stages.2.rounds": 6}, source="a test")


def test_the_keys_set_stay_the_keys_set():
    """A prebuilt index's manifest is compared with the build keys the config sets, not with their defaults."""
    config = load_config(None, ["retrieval.index.num_shards=2"])
    derived = derive(config, {"run.rounds": 1}, source="a test")
    assert derived.retrieval.index.build_keys_set() == {"num_shards": 2}
    assert derived.model_fields_set == {"retrieval", "run"}


def test_a_renamed_key_is_refused_naming_its_new_spelling():
    with pytest.raises(ConfigError, match=r"was renamed roles.policy_learner.count"):
        derive(Config(), {"learner.num_ranks": 2}, source="a test")


def test_no_config_is_derived_any_other_way():
    """``model_copy(update=...)`` skips validation: a derived config could hold what no user could write."""
    helper = PACKAGE / "config" / "loading.py"
    found = [f"{path.relative_to(PACKAGE.parent)}:{n}" for path in sorted(PACKAGE.rglob("*.py")) if path != helper
             for n, line in enumerate(path.read_text().splitlines(), 1) if "model_copy(" in line]
    assert found == []
