"""``train`` checks that need no model, run before Ray starts (and all that ``--dry-run`` checks besides the
resources): every configured path exists and is what it should be, and every question file parses with the
run's own loader, so a malformed line fails here, naming file and line, not inside an actor minutes later.
"""

from __future__ import annotations

from pathlib import Path

from bridge_ray.config import Config, ConfigError
from bridge_ray.data.qa import load_questions
from bridge_ray.model_paths import PACKAGED_GEMMA
from bridge_ray.retrieval.manifest import MANIFEST_FILE


def _existing(path: str, key: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {path} does not exist")
    return p


def _question_files(config: Config) -> str:
    """Load every configured question file as the run will (train as one mixture, eval set by set)."""
    data = config.data
    for i, path in enumerate(data.train):
        _existing(path, f"data.train[{i}]")
    for name, path in data.eval.items():
        _existing(path, f"data.eval.{name}")
    train = f"{data.train} ({len(load_questions(data.train))} questions)" if data.train else "the bundled world"
    evals = [f"{name} {path} ({len(load_questions([path]))} questions)" for name, path in data.eval.items()]
    return f"data: train {train}; eval {', '.join(evals) or 'the bundled world'}"


def preflight(config: Config) -> list[str]:
    """Raise an :class:`~bridge_ray.errors.InputError` naming the key of a missing path or the file:line of a
    malformed question; return one line per checked input."""
    lines = [_question_files(config)]
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
