"""``train --dry-run`` checks that need no model: every configured path exists and is what it should be."""

from __future__ import annotations

from pathlib import Path

from bridge_ray.config import Config, ConfigError
from bridge_ray.engines.models import PACKAGED_GEMMA
from bridge_ray.retrieval.manifest import MANIFEST_FILE


def _existing(path: str, key: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path} does not exist")
    return p


def preflight(config: Config) -> list[str]:
    """Raise :class:`ConfigError` naming the key of a missing path; return one line per checked input."""
    lines = []
    for i, path in enumerate(config.data.train):
        _existing(path, f"data.train[{i}]")
    for name, path in config.data.eval.items():
        _existing(path, f"data.eval.{name}")
    lines.append(f"data: train {config.data.train or 'the bundled world'}, eval {dict(config.data.eval) or 'world'}")
    if config.retrieval.index.dir is not None:
        index = _existing(config.retrieval.index.dir, "retrieval.index.dir")
        if not (index / MANIFEST_FILE).is_file():
            raise ConfigError(f"retrieval.index.dir: {index} has no {MANIFEST_FILE} (not a finished build-index)")
    lines.append(f"index: {config.retrieval.index.dir or 'the bundled world, built into the cache on first use'}")
    model = config.policy.model
    local = model != PACKAGED_GEMMA and (model.startswith((".", "/", "~")) or Path(model).exists())
    if local and not (_existing(model, "policy.model") / "config.json").is_file():
        raise ConfigError(f"policy.model: {model} is not a Hugging Face model directory (no config.json)")
    lines.append(f"policy: {model} ({config.engine.backend} samplers, ZeRO-{config.learner.zero_stage} learner)")
    return lines
