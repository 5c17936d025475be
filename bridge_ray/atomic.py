"""Files written whole or not at all: written beside their target, then renamed over it.

``os.replace`` within one folder is atomic, so a reader (or a rerun after a crash) sees the old file or the
new one, never half of one; a failed write removes its temporary file. The temporary file is created with
mode ``0o666`` and the kernel applies the umask (and a folder's default ACL), so the result has the mode any
``open(path, "w")`` would give: readable by pods running as another user where the umask allows
(``tempfile.mkstemp`` would leave it ``0600``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed over ``path`` when the block ends without error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def filling(folder: Path) -> Iterator[Path]:
    """A temporary folder beside ``folder`` to write a command's files into; when the block ends without error
    each moves to its place in ``folder`` (other files there stay), else the temporary folder is removed, so a
    command that fails half-way leaves none of its files behind."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        yield tmp
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            target = folder / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _create_beside(path: Path) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` beside ``path``, created exclusively with the umask's mode."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


def write_text_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line (UTF-8, non-ASCII kept as is)."""
    with replacing(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
