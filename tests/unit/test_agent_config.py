import pytest

from bridge_ray.config import ConfigError, load_config


def test_policy_and_engine_defaults():
    cfg = load_config()
    assert cfg.policy.model == "Qwen/Qwen2.5-3B" and not cfg.policy.trust_remote_code
    assert cfg.policy.chat_template == "auto" and cfg.policy.prompt_template is None
    assert cfg.engine.backend == "vllm" and cfg.engine.vllm.enable_prefix_caching


def test_policy_and_engine_validation(tmp_path):
    template = tmp_path / "t.txt"
    template.write_text("Q: {question}")
    cfg = load_config(None, [f"policy.prompt_template={template}", "engine.backend=hf", "engine.hf.batch_size=4"])
    assert cfg.policy.prompt_template == str(template) and cfg.engine.hf.batch_size == 4
    with pytest.raises(ConfigError, match=r"policy\.prompt_template.*does not exist"):
        load_config(None, [f"policy.prompt_template={tmp_path / 'nope.txt'}"])
    with pytest.raises(ConfigError, match=r"engine\.backend"):
        load_config(None, ["engine.backend=sglang"])
    with pytest.raises(ConfigError, match=r"policy\.dtype"):
        load_config(None, ["policy.dtype=int8"])
    with pytest.raises(ConfigError, match=r"engine\.vllm\.gpu_memory_utilization"):
        load_config(None, ["engine.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"engine\.vllm\.max_lora_rnk.*max_lora_rank"):
        load_config(None, ["engine.vllm.max_lora_rnk=8"])
    with pytest.raises(ConfigError, match=r"max_model_len \(1000\).*max_prompt_length"):
        load_config(None, ["engine.vllm.max_model_len=1000"])


def test_bench_agent_is_registered(capsys):
    from bridge_ray.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "agent", "--help"])
    assert done.value.code == 0 and "--group-size" in capsys.readouterr().out
