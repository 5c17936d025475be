"""Atomic writers: the written file has the mode the umask gives any new file (pods of another user can read it)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge_ray.atomic import replacing, write_jsonl_atomic, write_text_atomic


@pytest.fixture
def umask() -> Iterator[None]:
    """The process umask set to 022 (a cluster's usual) for the test, restored after."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("write", [
    lambda p: write_text_atomic(p, "x\n"),
    lambda p: write_jsonl_atomic(p, [{"a": 1}]),
])
def test_written_files_and_folders_get_the_umask_mode(tmp_path, umask, write):
    target = tmp_path / "new" / "deeper" / "file.jsonl"
    write(target)
    assert mode(target) == 0o644
    assert mode(target.parent) == mode(target.parent.parent) == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["file.jsonl"]  # no temporary file left


def test_a_stricter_umask_is_honoured(tmp_path):
    old = os.umask(0o077)
    try:
        write_text_atomic(tmp_path / "private.txt", "secret")
    finally:
        os.umask(old)
    assert mode(tmp_path / "private.txt") == 0o600


def test_replacing_an_existing_file_takes_the_umask_mode_and_a_failure_keeps_the_old_one(tmp_path, umask):
    target = tmp_path / "f.txt"
    target.write_text("old")
    target.chmod(0o600)
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o644
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]
