"""The one rule every cache entry is named by: ``<kind>-<hash>``, the hash of the cache's kind, its version, the config
fields it declares and the other inputs its code passes (file digests, a resolved model path, the platform).

Each cache declares a :class:`CacheKey` next to its code: the config fields (dotted paths) whose values enter the
key, and the fields of the same sections it leaves out, each with the reason. ``tests/unit/test_cache_key.py`` walks
the config schema and fails on a field of a section a cache reads that is neither, so a new setting is decided for
every cache that reads its section instead of silently entering or missing its key. Pure: no torch, no Ray.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

HASH_LENGTH = 16  # hex digits of sha256 in a key: 64 bits, no collision among one cache's entries


class Dumpable(Protocol):
    """A config (or a section of one): what pydantic's ``model_dump`` gives."""

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CacheKey:
    """How one cache names its entries.

    ``version``: bump it when the code changes what the same inputs produce. ``fields``: config paths whose values
    enter the key (a path naming a whole section takes its fields, present and future). ``excluded``: path -> why
    its value does not enter (irrelevant to the entry, or entering resolved through an input, which the reason names).
    """

    kind: str
    version: int
    fields: tuple[str, ...] = ()
    excluded: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = sorted(set(self.fields) & set(self.excluded))
        if both:
            raise ValueError(f"cache key {self.kind!r}: {both} both declared and excluded")

    def payload(self, config: Dumpable | None = None, *, omit: Iterable[str] = (), **inputs: Any) -> dict[str, Any]:
        """What the key hashes: the kind, the version, the declared fields' values (as JSON, less the declared fields
        in ``omit``: those this configuration does not use) and ``inputs`` (JSON-ready)."""
        omitted = set(omit)
        if unknown := sorted(omitted - set(self.fields)):
            raise ValueError(f"cache key {self.kind!r}: omits undeclared fields {unknown}")
        settings = config.model_dump(mode="json") if config is not None else {}
        for path in self.excluded:  # a field left out of a section declared whole
            *section, name = path.split(".")
            if any(".".join(section[:n]) in self.fields for n in range(1, len(section) + 1)):
                _at(settings, ".".join(section)).pop(name)
        return {
            "kind": self.kind,
            "version": self.version,
            "config": {path: _at(settings, path) for path in self.fields if path not in omitted},
            "inputs": inputs,
        }

    def of(self, config: Dumpable | None = None, *, omit: Iterable[str] = (), label: str = "", **inputs: Any) -> str:
        """``<kind>-<hash>`` of :meth:`payload` (``<kind>-<label>-<hash>`` with a ``label``: a readable summary of
        the inputs for whoever lists the cache, which adds nothing to the hash): equal for equal inputs, another for
        any declared input changed."""
        text = json.dumps(self.payload(config, omit=omit, **inputs), sort_keys=True, separators=(",", ":"))
        return "-".join(filter(None, (self.kind, label, hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH])))


def under(section: str, *names: str) -> tuple[str, ...]:
    """The dotted paths of ``names`` in ``section``: ``under("rollout", "max_turns")`` -> ``("rollout.max_turns",)``."""
    return tuple(f"{section}.{name}" for name in names)


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (hex): a cache's input that depends on a file's content, not its name; an index's
    checksums."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _at(settings: dict[str, Any], path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"no config field {path!r}")
        value = value[part]
    return value
