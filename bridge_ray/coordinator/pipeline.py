"""The rounds in flight: the batches drawn ahead, the syncs not yet confirmed, and the data cursor a checkpoint
records (README, "Asynchronous rounds").

With ``rollout.max_staleness: s`` (the pipeline's depth) the samplers generate the next s rounds' batches while
the learners work on the current one, and a sync is confirmed only once s newer ones are queued: each sampler's
pushes queue behind the batches it still generates, and waiting for them at once would drain the pipeline every
round (the actor's call order still puts them before any later batch). Synchronous training is depth 0: no batch
is drawn ahead and every sync is confirmed as it is sent. The coordinator runs the same round at any depth.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bridge_ray.data.qa import QuestionRecord
from bridge_ray.runtime.actor_group import Call
from bridge_ray.sampler.sampler import RolloutReturns, ScoreReturns

S = TypeVar("S")


@dataclass
class RoundBatch:
    """A round's questions and the calls generating them (drawn up to ``max_staleness`` rounds ahead)."""

    # The data cursor and the RNG state before this batch was drawn: what a checkpoint taken before it records.
    cursor_state: dict[str, int]
    rng_state: dict[str, Any]
    questions: list[QuestionRecord]
    seeds: list[int]  # the sampling seed of each sampler's share
    rollouts: list[Call[RolloutReturns]]  # each sampler's share
    scores: list[Call[ScoreReturns]]  # on a retriever round, each sampler's scoring of its share, queued behind it
    sent: float  # when the rollouts were sent (before the previous round's learner updates, when drawn ahead)


class RoundPipeline(Generic[S]):
    """Up to ``depth`` batches ahead of the round being trained and up to ``depth`` unconfirmed syncs.

    ``draw(r)`` sends round ``r``'s batch; ``confirm(sync)`` waits until every sampler serves what ``sync`` sent.
    No batch is drawn for a round at or past ``rounds`` (the run's last round).
    """

    def __init__(
        self, depth: int, rounds: int, draw: Callable[[int], RoundBatch], confirm: Callable[[S], None]
    ) -> None:
        self.depth, self.rounds, self.draw, self.confirm = depth, rounds, draw, confirm
        self.ahead: deque[RoundBatch] = deque()
        self.syncs: deque[S] = deque()

    def next_batch(self, round_index: int) -> RoundBatch:
        """Round ``round_index``'s batch (drawn ahead, else drawn now), once the next rounds' are sent."""
        batch = self.ahead.popleft() if self.ahead else self.draw(round_index)
        while len(self.ahead) < min(self.depth, self.rounds - round_index - 1):
            self.ahead.append(self.draw(round_index + 1 + len(self.ahead)))
        return batch

    def sent(self, sync: S) -> None:
        """Queue a sync just sent, and confirm the oldest until at most ``depth`` are unconfirmed."""
        self.syncs.append(sync)
        while len(self.syncs) > self.depth:
            self.confirm(self.syncs.popleft())

    def drain(self) -> None:
        """Confirm every sync still queued (before anything evaluates the samplers, or the run ends)."""
        while self.syncs:
            self.confirm(self.syncs.popleft())

    def drop(self) -> None:
        """Forget the batches ahead and the unconfirmed syncs (a rollback redraws and resends them)."""
        self.ahead.clear()
        self.syncs.clear()

    def drawn_from(self) -> tuple[dict[str, int], dict[str, Any]] | None:
        """The data cursor and RNG state from before the first batch drawn ahead, if any: what a checkpoint
        records, since a resumed run draws those batches again."""
        return (self.ahead[0].cursor_state, self.ahead[0].rng_state) if self.ahead else None
