"""Every cache names its entries by one rule (:mod:`bridge_ray.cache_key`), and each declares the config fields of
the sections it reads: a field that is neither declared nor excluded fails here, so a new setting is decided for
every cache that reads its section instead of silently entering or missing its key."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from bridge_ray.cache import MARKER
from bridge_ray.cache_key import CacheKey, file_digest, under
from bridge_ray.config import Config, WarmupConfig

PACKAGE = Path(__file__).resolve().parents[2] / "bridge_ray"
# Every cache of the project: (module, the name its key is declared under).
CACHES = {
    ("bridge_ray.data.world", "WORLD_KEY"), ("bridge_ray.coordinator.inputs", "INDEX_KEY"),
    ("bridge_ray.model_paths", "GEMMA_KEY"), ("bridge_ray.warmup.trainer", "WARMUP_KEY"),
    ("bridge_ray.evaluation.cache", "EVALUATION_KEY"), ("bridge_ray.bench.replay", "REPLAY_KEY"),
    ("bridge_ray.evaluation.judge", "JUDGMENT_KEY"),
}


def declared_keys() -> set[tuple[str, str]]:
    """(module, name) of every module-level ``NAME = CacheKey(...)`` in the package."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "CacheKey":
                found.update((module, target.id) for target in node.targets if isinstance(target, ast.Name))
    return found


def cache(module: str, name: str) -> CacheKey:
    return getattr(importlib.import_module(module), name)


def section(path: str, root: type[BaseModel] = Config) -> type[BaseModel] | None:
    """The model of the config section at ``path`` ("" is the whole config), None when it is a plain field."""
    model: Any = root
    for part in filter(None, path.split(".")):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            raise KeyError(path)
        model = model.model_fields[part].annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def undecided(key: CacheKey, root: type[BaseModel] = Config) -> list[str]:
    """Declared or excluded paths that name no field, and fields of a section ``key`` reads (one holding a declared
    field that is no section, or an excluded one) that are neither declared, nor excluded, nor under a section
    declared whole."""
    paths = set(key.fields) | set(key.excluded)
    problems, whole = [], set()
    for path in sorted(paths):
        try:
            if section(path, root) is not None and path in key.fields:
                whole.add(path)
        except KeyError:
            problems.append(f"{path}: no such field")
    read = {path.rpartition(".")[0] for path in paths - whole}
    for parent in sorted(read):
        model = section(parent, root)
        for name in model.model_fields if model is not None else ():
            path = f"{parent}.{name}" if parent else name
            if not (path in paths or path in read or any(path.startswith(f"{f}.") for f in key.fields)):
                problems.append(f"{path}: neither declared nor excluded")
    return problems


class Dumped:
    """A config as the key reads it (``model_dump``), with any value set: what changes one field alone."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings

    def model_dump(self, *, mode: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.settings))


def changed(path: str, value: Any = "changed") -> Dumped:
    """The default config's settings with the field at ``path`` set to ``value``."""
    settings = Config().model_dump(mode="json")
    *parents, name = path.split(".")
    target = settings
    for part in parents:
        target = target[part]
    assert name in target, path
    target[name] = value
    return Dumped(settings)


def leaf(path: str, key: CacheKey) -> str:
    """``path``, or where it names a section declared whole, its first field that ``key`` does not exclude."""
    model = section(path)
    if model is None:
        return path
    return leaf(next(f"{path}.{name}" for name in model.model_fields if f"{path}.{name}" not in key.excluded), key)


def with_setting(config: Config, path: str, value: Any) -> Config:
    """``config`` with the field at ``path`` set to ``value`` (unvalidated: the key reads values, not checks)."""
    head, _, rest = path.partition(".")
    if not rest:
        return config.model_copy(update={head: value})
    return config.model_copy(update={head: with_setting(getattr(config, head), rest, value)})


def test_the_package_declares_exactly_the_known_caches():
    assert declared_keys() == CACHES


@pytest.mark.parametrize(("module", "name"), sorted(CACHES))
def test_every_field_of_a_section_a_cache_reads_is_declared_or_excluded(module, name):
    key = cache(module, name)
    assert undecided(key) == []
    assert all(reason.strip() for reason in key.excluded.values()), "an exclusion says why"


@pytest.mark.parametrize(("module", "name"), sorted(CACHES))
def test_each_declared_field_changes_the_key_and_no_excluded_one_does(module, name):
    key = cache(module, name)
    plain = key.of(Dumped(Config().model_dump(mode="json")))
    assert plain == key.of(Dumped(Config().model_dump(mode="json")))
    assert re.fullmatch(rf"{re.escape(key.kind)}-[0-9a-f]{{16}}", plain)
    assert [path for path in key.fields if key.of(changed(leaf(path, key))) == plain] == []
    assert [path for path in key.excluded if key.of(changed(path)) != plain] == []


def test_a_new_warmup_field_fails_until_the_warmup_key_decides_on_it():
    """A new field of a section the warm-up reads is reported until the warm-up's key declares or excludes it."""

    class WiderWarmup(WarmupConfig):
        new_setting: int = 0

    class WiderConfig(Config):
        warmup: WiderWarmup = Field(default_factory=WiderWarmup)

    warmup = cache("bridge_ray.warmup.trainer", "WARMUP_KEY")
    assert undecided(warmup, WiderConfig) == ["warmup.new_setting: neither declared nor excluded"]
    decided = dataclasses.replace(warmup, excluded={**warmup.excluded, "warmup.new_setting": "a reason"})
    assert undecided(decided, WiderConfig) == []


def test_the_walk_reports_misspelt_and_undecided_fields():
    key = CacheKey("t", 1, fields=("warmup.epoch", "rollout.max_turns"), excluded={"rollout.top_p": "why"})
    problems = undecided(key)
    assert problems[0] == "warmup.epoch: no such field"
    assert "rollout.temperature: neither declared nor excluded" in problems
    assert not any(p.startswith(("rollout.max_turns", "rollout.top_p")) for p in problems)
    whole = CacheKey("t", 1, fields=("run",), excluded={"run.output_dir": "why"})
    assert undecided(whole) == [], "a section declared whole takes its fields along"


def test_inputs_version_and_omitted_fields():
    key = CacheKey("t", 1, fields=("warmup.epochs", "warmup.lr"), excluded={"warmup.seed": "why"})
    config = Config()
    assert key.of(config, a=1) == key.of(config, a=1) != key.of(config, a=2) != key.of(config, b=2)
    assert dataclasses.replace(key, version=2).of(config, a=1) != key.of(config, a=1)
    assert dataclasses.replace(key, kind="u").of(config, a=1).startswith("u-")
    assert key.of(changed("warmup.lr", 0.5), omit=["warmup.lr"]) == key.of(config, omit=["warmup.lr"])
    assert key.of(changed("warmup.lr", 0.5)) != key.of(config)
    with pytest.raises(ValueError, match="omits undeclared"):
        key.of(config, omit=["warmup.seed"])
    with pytest.raises(ValueError, match="both declared and excluded"):
        CacheKey("t", 1, fields=("warmup.lr",), excluded={"warmup.lr": "why"})
    with pytest.raises(KeyError, match=r"warmup\.nope"):
        CacheKey("t", 1, fields=("warmup.nope",)).of(config)


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc" * 1000)
    assert file_digest(path) == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert under("a.b", "c", "d") == ("a.b.c", "a.b.d")


# Each cache's own key function, on inputs that build nothing: the key it computes must follow its declaration.
def _world_key(tmp_path):
    from bridge_ray.data.world import DEFAULT_WORLD, SMALL_SIZE, world_key

    return world_key(0, SMALL_SIZE, "default", DEFAULT_WORLD)


def _index_key(tmp_path):
    from bridge_ray.coordinator.inputs import index_key

    return index_key(Config(), "world-0123")


def _gemma_key(tmp_path):
    import bridge_ray.model_paths as model_paths

    return model_paths.resolve_model_path(model_paths.PACKAGED_GEMMA)  # cached_model stubbed: its key


def _warmup_key(tmp_path):
    from bridge_ray.warmup.trainer import warmup_key

    return warmup_key(Config(), "some/model", {"data": "0123"})


def _evaluation_key(tmp_path):
    from bridge_ray.evaluation.cache import evaluation_key

    entries = [tmp_path / "models" / "policy", tmp_path / "indexes" / "index"]
    for entry in entries:
        entry.mkdir(parents=True, exist_ok=True)
        (entry / MARKER).write_text("{}")
    (tmp_path / "test.jsonl").write_text("{}\n")
    return evaluation_key(Config(), str(entries[0]), entries[1], {"world": str(tmp_path / "test.jsonl")}, "local")


def _replay_key(tmp_path):
    from bridge_ray.bench.replay import collection_key

    return collection_key(with_setting(Config(), "warmup.enabled", False), 4, 2, str(tmp_path / "dev.jsonl"))


def _judgment_key(tmp_path):
    from bridge_ray.evaluation.judge import cache_key

    return cache_key({"kind": "local", "model": "m"}, [{"role": "user", "content": "Why?"}])


KEY_FUNCTIONS = {
    ("bridge_ray.data.world", "WORLD_KEY"): _world_key, ("bridge_ray.coordinator.inputs", "INDEX_KEY"): _index_key,
    ("bridge_ray.model_paths", "GEMMA_KEY"): _gemma_key, ("bridge_ray.warmup.trainer", "WARMUP_KEY"): _warmup_key,
    ("bridge_ray.evaluation.cache", "EVALUATION_KEY"): _evaluation_key,
    ("bridge_ray.bench.replay", "REPLAY_KEY"): _replay_key,
    ("bridge_ray.evaluation.judge", "JUDGMENT_KEY"): _judgment_key,
}


@pytest.mark.parametrize(("module", "name"), sorted(KEY_FUNCTIONS))
def test_each_cache_keys_on_its_declaration_and_a_version_bump_gives_another_key(module, name, tmp_path,
                                                                                monkeypatch):
    assert set(KEY_FUNCTIONS) == CACHES
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path))
    monkeypatch.setattr("bridge_ray.model_paths.cached_model", lambda key, build: Path(key))
    key = cache(module, name)
    first = KEY_FUNCTIONS[module, name](tmp_path)
    assert Path(first).name.startswith(f"{key.kind}-")
    assert KEY_FUNCTIONS[module, name](tmp_path) == first
    monkeypatch.setattr(f"{module}.{name}", dataclasses.replace(key, version=key.version + 1))
    assert KEY_FUNCTIONS[module, name](tmp_path) != first


def test_a_world_kinds_own_version_changes_its_key():
    from bridge_ray.data.world import DEFAULT_WORLD, SMALL_SIZE, world_key

    bumped = dataclasses.replace(DEFAULT_WORLD, version=DEFAULT_WORLD.version + 1)
    assert world_key(0, SMALL_SIZE, "default", bumped) != world_key(0, SMALL_SIZE, "default", DEFAULT_WORLD)
    assert world_key(0, SMALL_SIZE, "paraphrase", DEFAULT_WORLD) != world_key(0, SMALL_SIZE, "default", DEFAULT_WORLD)


def test_the_index_key_leaves_out_what_its_index_type_does_not_read():
    from bridge_ray.coordinator.inputs import index_key

    flat, hnsw = Config(), with_setting(Config(), "retrieval.index.index_type", "hnsw")
    assert index_key(with_setting(flat, "retrieval.index.hnsw_m", 8), "w") == index_key(flat, "w")
    assert index_key(with_setting(hnsw, "retrieval.index.hnsw_m", 8), "w") != index_key(hnsw, "w")
    assert index_key(with_setting(flat, "retrieval.index.verify", "always"), "w") == index_key(flat, "w")
    assert index_key(flat, "w") != index_key(flat, "v"), "another world"
