"""The sampler actors as one pool whose calls survive a sampler's death.

Samplers run with ``max_restarts`` (Ray re-runs the constructor, which loads the initial weights) and
no automatic task retries: a retried rollout would silently run on the restarted actor's stale weights.
Instead every call is kept as a :class:`SamplerCall`; when its sampler dies, the pool waits for the
restart, pushes the weights the run is serving now, and sends the same call again. A call's result is
all of that sampler's share (every trajectory of its questions), so a re-sent share replaces the lost
one whole: nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from bridge_ray.runtime.calls import ActorLost, ActorRestarting, get_within

# (policy weights ref or None, (adapter state ref, retriever version) or None): what a revived sampler needs.
ServingState = tuple[ray.ObjectRef | None, tuple[ray.ObjectRef, int] | None]


@dataclass
class SamplerCall:
    """One remote call on one sampler, kept so that it can be sent again."""

    index: int
    method: str
    args: tuple
    ref: ray.ObjectRef


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``parts`` contiguous slices whose sizes differ by at most one (whole questions per sampler)."""
    bounds = [len(items) * p // parts for p in range(parts + 1)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


class SamplerPool:
    def __init__(
        self,
        handles: list[ray.actor.ActorHandle],
        *,
        call_timeout_s: float,
        restart_timeout_s: float,
        max_restarts: int,
        serving_state: Callable[[], ServingState],
    ) -> None:
        self.handles = handles
        self.call_timeout_s, self.restart_timeout_s, self.max_restarts = call_timeout_s, restart_timeout_s, max_restarts
        self.serving_state = serving_state
        self.revived: list[int] = []  # indices of samplers revived since the caller last read it

    def __len__(self) -> int:
        return len(self.handles)

    def submit(self, index: int, method: str, *args: Any) -> SamplerCall:
        return SamplerCall(index, method, args, getattr(self.handles[index], method).remote(*args))

    def submit_split(self, method: str, items: Sequence[Any], *args: Any) -> list[SamplerCall]:
        """``method(part, *args)`` on each sampler with a non-empty contiguous part of ``items``."""
        parts = split_evenly(items, len(self.handles))
        return [self.submit(i, method, part, *args) for i, part in enumerate(parts) if part]

    def submit_all(self, method: str, *args: Any) -> list[SamplerCall]:
        return [self.submit(i, method, *args) for i in range(len(self.handles))]

    def collect(self, calls: list[SamplerCall], what: str) -> list[Any]:
        """The results of ``calls`` in order; a call whose sampler died is sent again after its restart."""
        results = []
        for call in calls:
            for attempt in itertools.count():
                try:
                    results.append(get_within(call.ref, self.call_timeout_s, f"sampler {call.index} ({what})"))
                    break
                except ActorLost:
                    if attempt >= self.max_restarts:
                        raise
                    self.revive(call.index)
                    call.ref = getattr(self.handles[call.index], call.method).remote(*call.args)
        return results

    def revive(self, index: int) -> None:
        """Wait for Ray to restart sampler ``index``, then make it serve the run's current weights."""
        what = f"sampler {index} (restart; graph.sampler_max_restarts={self.max_restarts})"
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                get_within(self.handles[index].versions.remote(), max(deadline - time.monotonic(), 0.0), what)
                break
            except ActorRestarting:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        weights, adapter = self.serving_state()
        pushes = []
        if adapter is not None:
            pushes.append(self.handles[index].set_retriever_adapter.remote(*adapter))
        if weights is not None:
            pushes.append(self.handles[index].update_policy.remote(weights))
        get_within(pushes, self.call_timeout_s, f"sampler {index} (weights after restart)")
        print(f"sampler {index} died and was restarted; it now serves the current weights", flush=True)
        self.revived.append(index)

    def kill(self) -> None:
        for handle in self.handles:
            ray.kill(handle, no_restart=True)
        self.handles = []
