"""One cache root and one way to build into it: the world, its index, converted and warmed-up models and the
judge's judgments all land under the root, and a cached directory is built once, whole or not at all."""

import multiprocessing
import time
from pathlib import Path

import pytest

from bridge_ray.cache import MARKER, cache_root, cached_directory
from bridge_ray.config import load_config
from bridge_ray.coordinator.inputs import configured_world, index_dir
from bridge_ray.evaluation.judge import judge_cache_dir
from bridge_ray.model_paths import PACKAGED_GEMMA, cached_model, resolve_model_path


def slow_build(out: Path, log: Path) -> None:
    with open(log, "a") as f:
        f.write("built\n")
    time.sleep(0.5)
    (out / "weights.bin").write_text("w")


def race(target: Path, log: Path) -> str:
    return str(cached_directory(target, lambda out: slow_build(out, log)))


def test_a_cached_directory_is_built_once_whole_and_reused(tmp_path):
    target, log = tmp_path / "models" / "abc123", tmp_path / "log"
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # two processes race for the same directory
        paths = pool.starmap(race, [(target, log)] * 2)
    assert paths == [str(target)] * 2 and log.read_text() == "built\n"
    assert cached_directory(target, lambda out: pytest.fail("rebuilt")) == target
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "weights.bin"]

    def failing(out: Path) -> None:
        (out / "partial").write_text("x")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        cached_directory(tmp_path / "models" / "broken", failing)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["abc123", "abc123.lock", "broken.lock"]


def test_an_unmarked_directory_is_rebuilt(tmp_path):
    leftover = tmp_path / "interrupted"
    leftover.mkdir()
    (leftover / "stale").write_text("no marker: never trusted")
    rebuilt = cached_directory(leftover, lambda out: (out / "fresh").write_text("y"))
    assert sorted(p.name for p in rebuilt.iterdir()) == [MARKER, "fresh"]
    assert cached_directory(leftover, lambda out: pytest.fail("rebuilt")) == leftover, "marked: built once"


def test_every_location_lands_under_xdg_cache_home(tmp_path, monkeypatch):
    """BRIDGE_RAY_CACHE unset: the world, its index, the converted Gemma, a warm-up and the judge all go to
    $XDG_CACHE_HOME/bridge_ray (the builds are stubbed: where they land is the point, not what they hold)."""
    import bridge_ray.model_paths
    import bridge_ray.retrieval.build

    monkeypatch.delenv("BRIDGE_RAY_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(bridge_ray.retrieval.build, "build_configured_index",
                        lambda cfg, corpus, out, progress: (out / "manifest.json").write_text("{}"))
    monkeypatch.setattr(bridge_ray.model_paths, "_convert_gguf", lambda assemble, out: None)
    root = tmp_path / "xdg" / "bridge_ray"
    config = load_config(None, ["data.world_size=small"])

    assert cache_root() == root
    assert configured_world(config).parent == root and (configured_world(config) / "corpus.jsonl").is_file()
    assert index_dir(config).parent == root / "indexes"
    assert Path(resolve_model_path(PACKAGED_GEMMA)).parent == root / "models"
    assert cached_model("warmup-x", lambda out: None) == root / "models" / "warmup-x"
    assert judge_cache_dir(config.judge) == root / "judge"
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path / "shared"))
    assert cache_root() == tmp_path / "shared"
