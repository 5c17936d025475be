"""Progress of long loops (evaluations, the warm-up) that a user can follow on a terminal and in a job's logs.

On a terminal (``sys.stderr.isatty()``) a tqdm bar; otherwise (Ray job logs, an actor's output, a redirected
file) a plain line each time another tenth of the work is done, with the elapsed time and an ETA: a log keeps
ten lines, not a bar redrawn thousands of times.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType

from tqdm import tqdm

LINES = 10  # plain lines per loop: one every 10%
# The smallest piece a long evaluation is cut into for its progress: smaller ones would batch the engine's
# generation worse (and change greedy outputs' batching); sets under two pieces per worker stay whole.
SMALLEST_PIECE = 256


def clock(seconds: float) -> str:
    """``mm:ss``, or ``h:mm:ss`` from an hour up."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def pieces_per_worker(items: int, workers: int, smallest: int = SMALLEST_PIECE) -> int:
    """How many pieces per worker a job of ``items`` is cut into so that its progress shows about every tenth:
    at least :data:`LINES` pieces in all where each keeps ``smallest`` items, else fewer (at least one)."""
    return max(1, min(math.ceil(LINES / workers), items // (workers * smallest)))


class Progress:
    """``total`` units of work named ``desc``; :meth:`update` as they finish, with figures to show (a loss).

    Plain lines go to ``log`` (default: stderr, like the bar: a command's results on stdout stay clean), the bar
    to stderr; ``terminal`` (default: whether stderr is one) picks which.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        *,
        log: Callable[[str], None] | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.done, self.started = 0, time.monotonic()
        self._next_line = 1  # the next tenth to report
        terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True) if terminal else None

    def update(self, n: int, **figures: float) -> None:
        self.done += n
        if self.bar is not None:
            if figures:
                self.bar.set_postfix({k: f"{v:.4g}" for k, v in figures.items()}, refresh=False)
            self.bar.update(n)
            return
        tenth = math.floor(LINES * self.done / self.total) if self.total else LINES
        if tenth >= self._next_line:
            self._next_line = tenth + 1
            self.log(self._line(figures))

    def _line(self, figures: dict[str, float]) -> str:
        elapsed = time.monotonic() - self.started
        left = self.total - self.done
        eta = f", ETA {clock(elapsed / self.done * left)}" if self.done and left > 0 else ""
        shown = "".join(f", {k} {v:.4g}" for k, v in figures.items())
        percent = 100 * self.done / self.total if self.total else 100
        return f"{self.desc}: {self.done}/{self.total} {self.unit} ({percent:.0f}%){shown}, {clock(elapsed)}{eta}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
