import pytest
import yaml

from bridge_ray.config import ConfigError, load_config


def test_learner_and_checkpoint_defaults():
    cfg = load_config()
    learner = cfg.learner
    ranks = cfg.roles.policy_learner.count
    assert (ranks, learner.zero_stage, learner.dtype, learner.lr_schedule) == (1, 2, "auto", "constant")
    assert not learner.lora.enabled and learner.lora.rank == 16 and "q_proj" in learner.lora.target_modules
    assert (cfg.checkpoint.dir, cfg.checkpoint.keep, cfg.checkpoint.every_rounds) == (None, 3, 1)


def test_learner_keys_from_a_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "learner:\n  zero_stage: 3\n"
        "  lora:\n    enabled: true\n    alpha: 32\n    target_modules: [q_proj, v_proj]\n"
        "checkpoint:\n  dir: /tmp/ck\n  keep: 1\n"
        "roles:\n  policy_learner: {count: 2, cpus: 0.5, gpus: 0}\n"
    )
    cfg = load_config(path)
    assert cfg.roles.policy_learner.cpus == 0.5 and cfg.learner.lora.alpha == 32.0
    assert cfg.learner.lora.target_modules == ["q_proj", "v_proj"] and cfg.checkpoint.keep == 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.zero_stage=4", r"learner\.zero_stage"),
        ("roles.policy_learner.count=0", r"roles\.policy_learner\.count"),
        ("learner.dtype=fp16", r"learner\.dtype"),
        ("roles.policy_learner.cpus=0", r"roles\.policy_learner\.cpus"),
        ("learner.min_lr_ratio=1.5", r"learner\.min_lr_ratio"),
        ("learner.lr_schedule=linear", r"learner\.lr_schedule"),
        ("learner.lora.target_modules=[]", r"learner\.lora\.target_modules"),
        ("learner.lora.rnak=8", r"learner\.lora\.rnak: unknown key \(did you mean 'rank'\?\)"),
        ("checkpoint.keep=0", r"checkpoint\.keep"),
        ("checkpoint.every_rounds=0", r"checkpoint\.every_rounds"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_fractional_gpus_cannot_share_a_device_between_ranks():
    with pytest.raises(ConfigError, match=r"roles\.policy_learner: gpus \(0.5\) must be 0 or >= 1 when count \(2\)"):
        load_config(None, ["roles.policy_learner.count=2", "roles.policy_learner.gpus=0.5"])
    one_rank = ["roles.policy_learner.count=1", "roles.policy_learner.gpus=0.5"]
    assert load_config(None, one_rank).roles.policy_learner.gpus == 0.5


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ('{"GPU": 1}', r"roles\.sampler\.resources: 'GPU' is set by cpus/gpus"),
        ('{"memory": 1.0e9}', r"roles\.sampler\.resources: 'memory' is set by cpus/gpus or by Ray itself"),
        ('{"pool_rollout": 0}', r"roles\.sampler\.resources: pool_rollout: 0 must be positive"),
    ],
)
def test_a_role_asks_only_for_positive_custom_resources(resources, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"roles.sampler.resources={resources}"])


def test_a_role_in_a_node_pool_asks_for_its_resource_in_every_bundle():
    from bridge_ray.coordinator.graph import graph_bundles

    cfg = load_config(None, ['roles.sampler.resources={"pool_rollout": 1}', "roles.sampler.count=2"])
    assert graph_bundles(cfg)["sampler"] == [{"CPU": 1.0, "pool_rollout": 1.0}] * 2
    assert graph_bundles(cfg)["shard_holder"] == [{"CPU": 1.0}] * cfg.retrieval.index.num_shards


OLD_ROLE_KEYS = [
    ("graph.num_samplers=2", "roles.sampler.count"),
    ("graph.sampler_cpus=0.5", "roles.sampler.cpus"),
    ("graph.sampler_gpus=1", "roles.sampler.gpus"),
    ("graph.sampler_max_restarts=1", "roles.sampler.max_restarts"),
    ("graph.retriever_learner_cpus=0.5", "roles.retriever_learner.cpus"),
    ("graph.retriever_learner_gpus=0.5", "roles.retriever_learner.gpus"),
    ("learner.num_ranks=2", "roles.policy_learner.count"),
    ("learner.cpus_per_rank=0.5", "roles.policy_learner.cpus"),
    ("learner.gpus_per_rank=0", "roles.policy_learner.gpus"),
    ("retrieval.index.shard_num_cpus=0.5", "roles.shard_holder.cpus"),
    ("retrieval.index.shard_num_gpus=1", "roles.shard_holder.gpus"),
    ("retrieval.index.shard_max_restarts=1", "roles.shard_holder.max_restarts"),
    ("learner.startup_timeout_s=5", "roles.policy_learner.startup_timeout_s"),
    ("graph.torch_threads=3", "roles.torch_threads"),
]


@pytest.fixture
def fresh_notes(monkeypatch):
    """Notes are printed once per process: each test sees its own."""
    from bridge_ray.config import renamed

    monkeypatch.setattr(renamed, "_noted", set())


@pytest.mark.parametrize(("override", "new_key"), OLD_ROLE_KEYS)
def test_an_old_per_role_key_loads_as_its_new_key_with_a_note_naming_the_override(override, new_key, capsys,
                                                                                  fresh_notes):
    old_key, value = override.split("=")
    config = load_config(None, [override])
    node = config
    for part in new_key.split("."):
        node = getattr(node, part)
    assert node == yaml.safe_load(value)
    assert f"note: override '{override}': {old_key} is now {new_key}; write that" in capsys.readouterr().err


def test_an_old_key_in_a_file_names_its_line_and_its_section_goes(tmp_path, capsys, fresh_notes):
    """A saved run's config.yaml, which writes every key of ``graph:``, loads."""
    path = tmp_path / "old.yaml"
    path.write_text("graph:\n  torch_threads: null\n  num_samplers: 3\nlearner:\n  startup_timeout_s: 60.0\n")
    config = load_config(path)
    assert (config.roles.torch_threads, config.roles.sampler.count) == (None, 3)
    assert config.roles.policy_learner.startup_timeout_s == 60.0
    err = capsys.readouterr().err
    assert f"note: {path}:3: graph.num_samplers is now roles.sampler.count; write that" in err
    assert f"note: {path}:5: learner.startup_timeout_s is now roles.policy_learner.startup_timeout_s" in err


def test_an_old_key_beside_its_new_key_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"override 'graph.torch_threads=2': graph.torch_threads was renamed "
                                          r"roles.torch_threads, which is set too"):
        load_config(None, ["roles.torch_threads=1", "graph.torch_threads=2"])


def test_what_is_left_of_a_removed_section_says_where_its_keys_went():
    with pytest.raises(ConfigError, match=r"graph was removed: its keys moved to roles"):
        load_config(None, ["graph.sampler_threads=2"])


def test_role_counts_and_restarts_are_checked():
    assert load_config(None, ["retrieval.index.num_shards=2"]).roles.shard_holder.count is None, "one per shard"
    assert load_config(None, ["retrieval.index.num_shards=2", "roles.shard_holder.count=2"])
    with pytest.raises(ConfigError, match=r"roles\.shard_holder\.count \(3\) must equal retrieval\.index\.num_shards"):
        load_config(None, ["roles.shard_holder.count=3"])
    with pytest.raises(ConfigError, match=r"roles\.policy_learner\.max_restarts: must be 0"):
        load_config(None, ["roles.policy_learner.max_restarts=1"])
    with pytest.raises(ConfigError, match=r"roles\.retriever_learner\.count: must be 1"):
        load_config(None, ["roles.retriever_learner.count=2"])
    partial = load_config(None, ["roles.sampler.cpus=0.5"]).roles.sampler
    assert (partial.count, partial.cpus, partial.max_restarts) == (1, 0.5, 3), "unset keys keep the role's defaults"
