"""Atomic per-round checkpoints: a crash while writing one never damages the previous one.

Layout under the checkpoint root::

    latest                     the name of the newest complete checkpoint (replaced atomically)
    round-00000003/
      manifest.json            round, versions, data cursor, RNG states, sizes of every file below
      config.yaml              the resolved config of the run
      policy/                  the policy learner: the policy as an HF directory (safetensors + tokenizer),
      policy_adapter/            its LoRA in peft format (learner.lora.enabled),
      policy_state/state/        its DeepSpeed engine state, optimizer included
      retriever_adapter/       the retriever learner: the query encoder's LoRA in peft format,
      retriever_optimizer.pt     its optimizer state
      lower_retriever_adapter/   two_state only: η*, the second retriever state (peft format),
      lower_retriever_optimizer.pt  its optimizer state

A checkpoint is written into a hidden temporary directory next to its final place, flushed to disk
(every file and directory fsync'ed), then renamed into place; only then does ``latest`` move. A
directory without a manifest is never taken for a checkpoint, and leftovers of a crashed write are
removed by the next save.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from bridge_ray.config import Config, dump_config
from bridge_ray.errors import InputError

MANIFEST, CONFIG, LATEST = "manifest.json", "config.yaml", "latest"
# The layout above, shared by the learners that write it and by resume, eval, export and bench learn that read it.
POLICY_DIR, POLICY_ADAPTER_DIR = "policy", "policy_adapter"
POLICY_STATE_DIR, POLICY_STATE_TAG = "policy_state", "state"  # DeepSpeed's save_checkpoint(dir, tag)
RETRIEVER_ADAPTER_DIR, RETRIEVER_OPTIMIZER_FILE = "retriever_adapter", "retriever_optimizer.pt"
LOWER_RETRIEVER_ADAPTER_DIR, LOWER_RETRIEVER_OPTIMIZER_FILE = "lower_retriever_adapter", "lower_retriever_optimizer.pt"
FORMAT_VERSION = 1
_NAME = re.compile(r"round-(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or malformed; the message names the file."""


@dataclass
class Manifest:
    """Everything besides model and optimizer tensors that a resumed run needs to continue exactly."""

    round: int
    policy_version: int
    retriever_version: int
    data_cursor: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)  # relative path -> size in bytes, filled by save
    format: int = FORMAT_VERSION

    @classmethod
    def read(cls, path: Path) -> Manifest:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: unreadable manifest: {exc}") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: the manifest must be a JSON object")
        names = {f.name for f in fields(cls)}
        unknown, missing = set(data) - names, {"round", "policy_version", "retriever_version"} - set(data)
        if unknown or missing:
            raise CheckpointError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
        if data.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise CheckpointError(f"{path}: format {data['format']} is not {FORMAT_VERSION}")
        for key in ("round", "policy_version", "retriever_version"):
            if not isinstance(data[key], int) or data[key] < 0:
                raise CheckpointError(f"{path}: {key} must be a non-negative integer, got {data[key]!r}")
        return cls(**data)


def checkpoint_root(config: Config) -> Path:
    """``checkpoint.dir``, or ``<run.output_dir>/checkpoints`` when it is null."""
    return Path(config.checkpoint.dir or Path(config.run.output_dir) / "checkpoints")


class CheckpointManager:
    """Writes, finds and prunes the checkpoints under ``root``, keeping the newest ``keep``."""

    def __init__(self, root: str | Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root, self.keep = Path(root), keep

    def save(self, manifest: Manifest, write: Callable[[Path], None], config: Config | None = None) -> Path:
        """Write checkpoint ``manifest.round``: ``write(tmp_dir)`` fills it, then it is published atomically.

        If ``write`` raises, the partial directory is removed and the previous checkpoint stays the latest.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"round-{manifest.round:08d}"
        staging = self.root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            write(staging)
            if config is not None:
                (staging / CONFIG).write_text(dump_config(config))
            manifest.files = {
                str(p.relative_to(staging)): p.stat().st_size for p in sorted(staging.rglob("*")) if p.is_file()
            }
            (staging / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1))
            _fsync_tree(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        final = self.root / name
        if final.exists():  # a run resumed from an older round reaches this round again: replace it
            stale = self.root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            final.rename(stale)
            staging.rename(final)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            staging.rename(final)
        _fsync_dir(self.root)
        pointer = self.root / f".{LATEST}.tmp"
        pointer.write_text(name)
        _fsync_file(pointer)
        os.replace(pointer, self.root / LATEST)
        _fsync_dir(self.root)
        self._prune(keep=final)
        return final

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (those with a manifest), oldest round first."""
        return [path for _, path in self._complete()]

    def rounds(self) -> list[int]:
        """The rounds of the complete checkpoints, oldest first."""
        return [number for number, _ in self._complete()]

    def _complete(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.root.glob("round-*") if self.root.is_dir() else ():
            match = _NAME.fullmatch(path.name)
            if match and (path / MANIFEST).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names, else the newest complete one (a crash can precede the pointer)."""
        pointer = self.root / LATEST
        if pointer.is_file():
            target = self.root / pointer.read_text().strip()
            if (target / MANIFEST).is_file():
                return target
        complete = self.checkpoints()
        return complete[-1] if complete else None

    def clear(self) -> None:
        """Remove every checkpoint (complete or not), ``latest`` and the leftovers of crashed writes; anything else
        under the root stays, and the root goes only when that leaves it empty (``train --overwrite``)."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if _NAME.fullmatch(path.name) or path.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(path)
            elif path.name in (LATEST, f".{LATEST}.tmp"):
                path.unlink()
        if not any(self.root.iterdir()):
            self.root.rmdir()

    def _prune(self, keep: Path) -> None:
        for path in self.root.iterdir():
            if path.name.startswith((".tmp-", ".old-")) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        complete = self.checkpoints()
        surplus = len(complete) - self.keep
        for path in [p for p in complete if p != keep][: max(0, surplus)]:
            shutil.rmtree(path)


def retriever_adapter_dir(checkpoint: Path | None) -> Path | None:
    """The retriever adapter ``checkpoint``'s system retrieves with: the one it holds, or, when its run kept the
    retriever fixed, the adapter that run started from (its saved config's ``retrieval.encoder.adapter``: e.g. a
    policy-only stage after a retriever stage); None without a checkpoint or with the base encoder."""
    if checkpoint is None:
        return None
    if (checkpoint / RETRIEVER_ADAPTER_DIR).is_dir():
        return checkpoint / RETRIEVER_ADAPTER_DIR
    saved = checkpoint / CONFIG
    started = yaml.safe_load(saved.read_text()) if saved.is_file() else None
    adapter = ((started or {}).get("retrieval") or {}).get("encoder", {}).get("adapter")
    return Path(adapter) if adapter else None


def find_checkpoint(path: str | Path, flag: str = "--checkpoint", model: str | None = None) -> tuple[Path, Manifest]:
    """The checkpoint ``path`` names, or the latest under a run's checkpoint root, and its manifest, every file
    it lists checked whole; bad input is an :class:`~bridge_ray.errors.InputError` naming ``flag``. ``model``:
    a subfolder that must hold an HF model (``policy``), checked first for the plainer message."""
    directory = Path(path)
    if not (directory / MANIFEST).is_file():
        latest = CheckpointManager(directory, keep=1).latest()
        if latest is None:
            raise InputError(f"{flag} {path}: neither a checkpoint nor a directory of checkpoints")
        directory = latest
    if model is not None and not (directory / model / "config.json").is_file():
        raise InputError(f"{flag} {path}: {directory / model} holds no model (no config.json)")
    try:
        return directory, load_manifest(directory)
    except CheckpointError as exc:
        raise InputError(f"{flag} {path}: {exc}") from None


def load_manifest(directory: str | Path) -> Manifest:
    """The manifest of a checkpoint directory, after checking that every file it lists is there, whole."""
    directory = Path(directory)
    manifest = Manifest.read(directory / MANIFEST)
    for rel, size in manifest.files.items():
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {directory / MANIFEST} but missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, the manifest says {size}")
    return manifest


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states, as JSON-serialisable values."""
    version, mt, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": _encode(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_encode(s) for s in torch.cuda.get_rng_state_all()]
    return state


def seed_rng(seed: int) -> None:
    """Seed the generators :func:`capture_rng_state` saves: the start of a run, before any checkpoint exists."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_decode(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_decode(s) for s in state["cuda"]])


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file, then every directory (deepest first), so the rename publishes durable data."""
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for path in paths:
        if path.is_file():
            _fsync_file(path)
    for path in [*(p for p in paths if p.is_dir()), root]:
        _fsync_dir(path)
