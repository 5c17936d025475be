"""Where a run's time went: each step of the job (checks, model conversion, indexes, evaluations, warm-up, the
rounds) timed by the driver and kept in ``timings.json`` in the run folder, the rounds split by the phases the
coordinator timed (``phases.jsonl``); :func:`timings_markdown` is the table ``train`` prints as it ends.

The file is rewritten as each step ends, so a run stopped part-way still says where its time went until then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bridge_ray.atomic import write_text_atomic

TIMINGS_FILE = "timings.json"
ROUNDS = "rounds"


class JobTimings:
    """The wall time of each step of one run, in the order they ran, written to ``<run_dir>/timings.json``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / TIMINGS_FILE
        self.started = time.time()
        self.steps: list[dict] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time ``name``; a step that fails is not recorded (the run stops there)."""
        start = time.time()
        yield
        self.steps.append({"step": name, "start": start, "seconds": time.time() - start})
        self.write()

    def add_round_phases(self, seconds: dict[str, float]) -> None:
        """Split the last ``rounds`` step by the seconds its rounds spent in each phase."""
        next(s for s in reversed(self.steps) if s["step"] == ROUNDS)["phases"] = seconds
        self.write()

    def record(self) -> dict:
        """What ``timings.json`` holds: the steps so far and the run's wall time until now."""
        return {"steps": self.steps, "total": time.time() - self.started}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(self.record(), indent=2) + "\n")


def _clock(seconds: float) -> str:
    """``m:ss``."""
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def timings_markdown(timings: dict) -> str:
    """``timings.json`` as a table of wall times (m:ss) and shares of the total; the rounds' phases in rows after
    theirs, with what the rounds spent outside any phase (checkpoints, logging) as ``other``."""
    total = timings["total"]
    lines = ["| step | time | share |", "|---|---:|---:|"]

    def row(name: str, seconds: float) -> None:
        share = f"{100 * seconds / total:.0f}%" if total else "–"
        lines.append(f"| {name} | {_clock(seconds)} | {share} |")

    for step in timings["steps"]:
        row(step["step"], step["seconds"])
        phases = step.get("phases", {})
        for phase, seconds in phases.items():
            row(f"{step['step']}: {phase.replace('_', ' ')}", seconds)
        if phases:
            row(f"{step['step']}: other (checkpoints, logging)", max(0.0, step["seconds"] - sum(phases.values())))
    row("**total**", total)
    return "\n".join(lines)
