import pytest

from bridge_ray.config import ConfigError, load_config


def test_learner_and_checkpoint_defaults():
    cfg = load_config()
    learner = cfg.learner
    assert (learner.num_ranks, learner.zero_stage, learner.dtype, learner.lr_schedule) == (1, 2, "auto", "constant")
    assert not learner.lora.enabled and learner.lora.rank == 16 and "q_proj" in learner.lora.target_modules
    assert (cfg.checkpoint.dir, cfg.checkpoint.keep, cfg.checkpoint.every_rounds) == (None, 3, 1)


def test_learner_keys_from_a_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "learner:\n  num_ranks: 2\n  zero_stage: 3\n  cpus_per_rank: 0.5\n  gpus_per_rank: 0\n"
        "  lora:\n    enabled: true\n    alpha: 32\n    target_modules: [q_proj, v_proj]\n"
        "checkpoint:\n  dir: /tmp/ck\n  keep: 1\n"
    )
    cfg = load_config(path)
    assert cfg.learner.cpus_per_rank == 0.5 and cfg.learner.lora.alpha == 32.0
    assert cfg.learner.lora.target_modules == ["q_proj", "v_proj"] and cfg.checkpoint.keep == 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.zero_stage=4", r"learner\.zero_stage"),
        ("learner.num_ranks=0", r"learner\.num_ranks"),
        ("learner.dtype=fp16", r"learner\.dtype"),
        ("learner.cpus_per_rank=0", r"learner\.cpus_per_rank"),
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
    with pytest.raises(ConfigError, match=r"learner: gpus_per_rank \(0.5\) must be 0 or >= 1 when num_ranks \(2\)"):
        load_config(None, ["learner.num_ranks=2", "learner.gpus_per_rank=0.5"])
    assert load_config(None, ["learner.num_ranks=1", "learner.gpus_per_rank=0.5"]).learner.gpus_per_rank == 0.5
