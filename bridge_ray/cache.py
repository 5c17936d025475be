"""Where bridge-ray keeps what it builds once and reuses (the bundled world, its index, converted and warmed-up
models, judgments), and the one way a cached directory is built.

The root is ``$BRIDGE_RAY_CACHE``, else ``$XDG_CACHE_HOME/bridge_ray``, else ``~/.cache/bridge_ray``; on a
cluster, point ``BRIDGE_RAY_CACHE`` at shared storage so every node finds what one node built.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Written into a cached directory once its build has finished: a directory without it is never trusted.
MARKER = "bridge_ray_cache.json"


def cache_root() -> Path:
    """``$BRIDGE_RAY_CACHE``, else ``$XDG_CACHE_HOME/bridge_ray``, else ``~/.cache/bridge_ray``."""
    if os.environ.get("BRIDGE_RAY_CACHE"):
        return Path(os.environ["BRIDGE_RAY_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bridge_ray"


def cached_directory(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, filled once by ``build(directory)``: complete whenever it holds :data:`MARKER`.

    ``build`` fills a sibling temporary directory that gets the marker and is renamed into place, under a lock
    file beside ``target``, so concurrent processes (test workers, actors, nodes sharing the cache) build it
    once and never see half of it; a failed build leaves nothing behind. An unmarked ``target`` (an interrupted
    build or removal) is rebuilt.
    """
    target = Path(target)

    def complete() -> bool:
        return (target / MARKER).is_file()

    if complete():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():  # another process built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp)
            (tmp / MARKER).write_text(json.dumps({"key": target.name}))
            tmp.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
