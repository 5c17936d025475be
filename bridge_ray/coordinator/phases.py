"""The timeline of every round: which phase ran when, under which policy and retriever versions.

The coordinator writes each phase as it ends (``phases.jsonl`` in the run directory), and checks the
BRIDGE order on every round: the retriever update (and with the two-state estimator η*'s update, its own
phase) must end before the policy update starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROLLOUT, REWARD, SCORE, RETRIEVER_UPDATE, POLICY_UPDATE, SYNC = (
    "rollout", "reward", "score", "retriever_update", "policy_update", "sync",
)
LOWER_RETRIEVER_UPDATE = "lower_retriever_update"  # two_state: η*'s update, after η_γ's, before the policy's
RECOVER = "recover"  # a learner died: the run went back to its last checkpoint and redoes the round


class OrderViolation(RuntimeError):
    """A round ran its phases out of the bilevel order."""


@dataclass
class PhaseRecord:
    round: int
    phase: str
    start: float
    end: float
    policy_version: int
    retriever_version: int
    info: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


class PhaseRecorder:
    """Times phases; ``versions()`` reports the (policy, retriever) versions at the moment a phase starts."""

    def __init__(self, versions: Callable[[], tuple[int, int]], path: str | Path | None = None):
        self.versions = versions
        self.path = Path(path) if path else None
        self.records: list[PhaseRecord] = []

    @contextmanager
    def phase(self, round_index: int, name: str, **info) -> Iterator[dict]:
        """Record ``name`` of ``round_index``; the yielded dict can collect extra figures for the record."""
        policy_version, retriever_version = self.versions()
        start = time.time()
        yield info
        record = PhaseRecord(round_index, name, start, time.time(), policy_version, retriever_version, info)
        self.records.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(asdict(record)) + "\n")

    def round_seconds(self, round_index: int) -> dict[str, float]:
        return {r.phase: r.seconds for r in self.records if r.round == round_index}

    def total_seconds(self) -> dict[str, float]:
        """Seconds spent in each phase over every round recorded here, in the order the phases first ran."""
        seconds: dict[str, float] = {}
        for r in self.records:
            seconds[r.phase] = seconds.get(r.phase, 0.0) + r.seconds
        return seconds

    def check_round(self, round_index: int) -> None:
        """The bilevel order of the latest attempt at ``round_index``; :class:`OrderViolation` if it is broken.

        The coordinator calls it as each round ends, so a broken order fails the run at the round that broke it.
        """
        since_recovery = self.records[_last_recovery(self.records) + 1:]
        check_bilevel_order([r for r in since_recovery if r.round == round_index])


def _last_recovery(records: Sequence[PhaseRecord]) -> int:
    return max((i for i, r in enumerate(records) if r.phase == RECOVER), default=-1)


def read_phases(path: str | Path) -> list[PhaseRecord]:
    return [PhaseRecord(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def check_bilevel_order(records: Sequence[PhaseRecord]) -> None:
    """Raise :class:`OrderViolation` unless, in every round, the retriever update ends before the policy update
    starts, and so does η*'s update (``lower_retriever_update``, two-state), which also starts after the retriever
    update ends: both retriever states are updated on the round's rollouts before the policy uses them. A
    two-state policy update after a retriever update with searches and no η* update is a violation too.

    A round redone after a recovery is checked as its own attempt (records are split at ``RECOVER``).
    """
    by_round: dict[tuple[int, int], dict[str, PhaseRecord]] = {}
    attempt = 0
    for r in records:
        attempt += r.phase == RECOVER
        by_round.setdefault((attempt, r.round), {})[r.phase] = r
    for (_, round_index), phases in sorted(by_round.items()):
        retriever, lower, policy = (phases.get(p) for p in (RETRIEVER_UPDATE, LOWER_RETRIEVER_UPDATE, POLICY_UPDATE))
        two_state = policy is not None and policy.info.get("estimator") == "two_state"
        if two_state and retriever and retriever.info.get("turns") and lower is None:
            raise OrderViolation(f"round {round_index}: two_state {POLICY_UPDATE} without {LOWER_RETRIEVER_UPDATE}")
        for first, then in ((retriever, policy), (lower, policy), (retriever, lower)):
            if first and then and first.end > then.start:
                raise OrderViolation(
                    f"round {round_index}: {first.phase} ended at {first.end:.3f}, after {then.phase} started at "
                    f"{then.start:.3f} (BRIDGE updates the retriever first, then the policy)"
                )
