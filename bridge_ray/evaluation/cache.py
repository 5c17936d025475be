"""Evaluations of a cached policy, kept in the cache root: a table that every run on one policy would compute
alike is computed once.

``bench learn`` starts by evaluating its warm-up policy with the frozen retriever and with the oracle, on the
held-out and the OOD set (four 200-question evaluations of ``--quick``, about 14 minutes on 2 cores); ``train``
evaluates the base policy and the warm-up before its rounds (on the demo's two worlds, 7 of its 25 minutes). Those
tables come out the same in every run that asks the same questions of the same policy. The key holds everything
such a table depends on: the evaluation's config (without the folders a run writes to), where it ran (the graph's
samplers or one process), the policy and the index (only directories the cache built, whose names are their
content keys), the question files' bytes, the package's own source, the installed libraries and the CPU (fp32
tables differ between CPU models): :data:`EVALUATION_KEY`. Any other policy or index is evaluated every time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Literal

import torch

import bridge_ray
from bridge_ray.atomic import write_text_atomic
from bridge_ray.cache import MARKER, cache_root
from bridge_ray.cache_key import CacheKey, file_digest
from bridge_ray.config import Config
from bridge_ray.engines.precision import cpu_kernels
from bridge_ray.errors import InputError
from bridge_ray.evaluation.table import read_table
from bridge_ray.model_paths import resolve_model_path

# A table depends on every setting but the folders a run writes to: each section whole, a new one's fields too
# (a spurious miss costs one evaluation, a wrong hit a wrong table). Bump the version when the table's content or
# the key's inputs change.
EVALUATION_KEY = CacheKey(
    "eval", version=2,
    fields=tuple(Config.model_fields),
    excluded={"run.output_dir": "where the run writes", "checkpoint.dir": "where the run writes"},
)
Where = Literal["local", "graph"]  # one process (train.local_eval) or the graph's samplers (coordinator.graph_eval)


def cached_table(
    config: Config, files: dict[str, str], policy: str, adapter: Path | str | None, index: Path, where: Where,
    evaluate: Callable[[], dict[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """``evaluate()``'s table (JSON-ready), or the one an earlier evaluation with the same key kept, and whether
    it was kept: ``policy`` with the base retriever (no ``adapter``) over ``index`` on ``files``, ``where`` said.
    Without a key, evaluated."""
    key = None if adapter is not None else evaluation_key(config, policy, index, files, where)
    if key is None:
        return evaluate(), False
    path = evaluation_file(key)
    if (kept := kept_table(path)) is not None:
        print(f"   {', '.join(files)}: {path} (the same evaluation, kept from an earlier run)", flush=True)
        return kept, True
    table = evaluate()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(table))
    return table, False


def kept_table(path: Path) -> dict[str, Any] | None:
    """The table kept at ``path`` (checked by the evaluation file's schema), or None where there is none; a damaged
    one is a miss, with a warning naming the file and the field, and is computed again and replaced."""
    if not path.is_file():
        return None
    try:
        return json.loads(read_table(path).to_json())
    except InputError as e:
        print(f"warning: a kept evaluation is damaged, computing it again: {e.problems[0]}", file=sys.stderr,
              flush=True)
        return None


def evaluation_key(config: Config, policy: str, index: Path, files: dict[str, str], where: Where) -> str | None:
    """The cache key of evaluating ``policy`` (a model name as ``policy.model`` takes it: the packaged GGUF's is
    its converted directory, converted here if it is not yet) over ``index`` on ``files`` as ``config`` says, or
    None where the policy or ``index`` is not a finished cache entry (a directory its owner may change) or the
    retriever starts from an adapter."""
    if config.retrieval.encoder.adapter is not None:
        return None
    root = cache_root().resolve()
    cached = [Path(p).resolve() for p in (resolve_model_path(policy), index)]
    if not all(_is_entry(p, root) for p in cached):
        return None
    return EVALUATION_KEY.of(
        config, where=where, policy=str(cached[0].relative_to(root)), index=str(cached[1].relative_to(root)),
        files={name: file_digest(path) for name, path in files.items()}, source=source_digest(),
        platform=platform_identity(),
    )


def settings_without_folders(config: Config) -> dict[str, Any]:
    """``config`` as JSON without the folders it writes to (:data:`EVALUATION_KEY`'s settings): two configs equal
    here compute the same thing."""
    return EVALUATION_KEY.payload(config)["config"]


def evaluation_file(key: str) -> Path:
    """Where the tables of ``key`` are kept."""
    return cache_root() / "evaluations" / f"{key}.json"


def _is_entry(path: Path, root: Path) -> bool:
    """A directory the cache built: under its root, with the marker of a finished build in it or above it."""
    if not path.is_relative_to(root):
        return False
    return any((parent / MARKER).is_file() for parent in [path, *path.parents] if parent.is_relative_to(root))


@cache
def source_digest() -> str:
    """sha256 over every file of the installed ``bridge_ray`` package (code and templates): a change to the code
    is a new key, so no table outlives the code that computed it."""
    package = Path(bridge_ray.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def platform_identity() -> dict[str, str | None]:
    """The libraries (every installed distribution's version: torch's kernels, the encoder's package, faiss) and
    the processors a table was computed with."""
    installed = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()})
    return {"libraries": hashlib.sha256("\n".join(installed).encode()).hexdigest(), "python": platform.python_version(),
            "cpu": _cpu_model(), "cpu_kernels": cpu_kernels(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _cpu_model() -> str:
    """The CPU's model, as ``/proc/cpuinfo`` gives it where there is one (its name, family, model and stepping: a
    virtual machine may name two generations alike), else the platform's word."""
    cpuinfo = Path("/proc/cpuinfo")
    fields = ("model name", "cpu family", "model", "stepping")
    if cpuinfo.is_file():
        first = cpuinfo.read_text().split("\n\n")[0]
        found = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
        found = {k.strip(): v.strip() for k, v in found.items()}
        if any(f in found for f in fields):
            return " / ".join(found.get(f, "") for f in fields)
    return platform.processor() or platform.machine()
