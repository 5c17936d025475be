"""No tracked file outside tests/ carries an absolute path of a developer's machine: a home folder, a work or scratch
folder of the machines the results were measured on, or a local wheel store. Such paths mean nothing to a user and
leak how one machine was laid out; reports and raw result files name paths relative to the repository or as
placeholders (``<cache>/``, ``runs/``). Plain defaults in code (``/tmp`` alone, ``/dev/null``, ``/usr/bin/env``,
a container's ``/app`` or ``/home/ray``, Ray's ``/tmp/ray``) are not developer paths and are not flagged."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# An absolute path starts the string or follows a character that cannot end a word, a URL or a relative path.
START = r"(?<![\w.~/:-])"
DEVELOPER_PATH = re.compile(START + "|".join((
    r"(?:/root/[\w.~-]",                      # root's home: /root/.cache/...
    r"/home/[\w.-]+/",                       # a user's home on Linux
    r"/Users/[\w.-]+/",                      # a user's home on macOS
    r"/work/[\w.-]",                         # the machines' work tree and run folders
    r"/opt/(?:wheels|torch)\b",              # local wheel stores and prebuilt environments
    r"/tmp/[\w.-]+/)",                       # a scratch folder with a name: a run's output, a mktemp folder
)))
# Paths of the tools' own layouts, the same on every machine: the rayproject images' user, Ray's session folder.
ALLOWED = ("/home/ray/", "/tmp/ray/")
SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".safetensors", ".bin", ".gguf", ".pt", ".npy", ".parquet"}


def tracked_files() -> list[Path]:
    """The repository's tracked files outside tests/ (the tests plant such paths on purpose)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n and not n.startswith("tests/")]
    return [ROOT / n for n in names if Path(n).suffix.lower() not in SKIP_SUFFIXES and (ROOT / n).is_file()]


def developer_paths(text: str) -> list[str]:
    """Each developer-machine path in ``text``, as far as the regex matched it."""
    return [m.group(0) for m in DEVELOPER_PATH.finditer(text) if not m.group(0).startswith(ALLOWED)]


def offending_lines(paths: list[Path]) -> list[str]:
    bad = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if found := developer_paths(line):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(found)}")
    return bad


def test_no_tracked_file_holds_a_developer_machine_path() -> None:
    bad = offending_lines(tracked_files())
    assert not bad, "absolute paths of a developer's machine (use a relative path or a placeholder):\n" + "\n".join(
        bad[:40])


def test_a_planted_path_is_caught(tmp_path: Path) -> None:
    planted = {
        '"warmup_policy": "/root/.cache/bridge_ray/models/warmup-dd6adc"': "/root/.",
        "--out /tmp/exp6-regen4/results.json": "/tmp/exp6-regen4/",
        "rootdir: /work/main": "/work/m",
        "see /home/alice/runs/a.json": "/home/alice/",
        "open /Users/bob/notes.md": "/Users/bob/",
        "pip install --find-links /opt/wheels torch": "/opt/wheels",
    }
    for line, start in planted.items():
        assert [p[: len(start)] for p in developer_paths(line)] == [start], line
    planted_file = tmp_path / "results.json"
    planted_file.write_text('{"seed": 0,\n "path": "/tmp/tmp.KInmrhd3BS/run"}\n')
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert offending_lines([planted_file]) == ["results.json:2: /tmp/tmp.KInmrhd3BS/"]
    finally:
        ROOT = root


def test_ordinary_paths_are_not_flagged() -> None:
    for line in ("#!/usr/bin/env bash", "2>/dev/null", "default: /tmp", "WORKDIR /app", "tempfile in /tmp or $TMPDIR",
                 "see docs/results/gap-world-calibration/test-avx2.json", "https://example.org/home/user/x",
                 "~/.cache/bridge_ray/models", "<cache>/models/warmup-1", "runs/exp6-regen4", "$TMPDIR/run",
                 "src/work/x.py", "jobs/tmp/a/b", "WORKDIR /home/ray/app", "ray logs in /tmp/ray/session_latest"):
        assert developer_paths(line) == [], line
