"""The coordinator as a Ray actor, and its typed handle: the driver's one way to start and call it.

The coordinator is a one-actor :class:`ActorGroup` that reserves nothing (no CPU, no placement group: it only waits
on the other roles and must never hold a bundle they need) and is never restarted (:attr:`Restart.NONE`). It runs on
the driver's node (a cluster's head, where ``ray job submit`` runs the driver): a worker node that dies takes roles
with it, which the coordinator recovers from, never the coordinator itself. Each
method of :class:`CoordinatorHandle` sends the :class:`Coordinator` method itself and waits for it: its start
(which starts the whole graph), a round, a run's rounds and an evaluation within ``run.driver_timeout_s``, the
short calls within ``run.call_timeout_s``; a timeout or the actor's death is an error naming the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from bridge_ray.config import Config
from bridge_ray.coordinator.coordinator import Coordinator
from bridge_ray.evaluation.table import EvalTable
from bridge_ray.runtime.actor_group import ActorGroup, Restart, RoleSpec

ROLE = "coordinator"
RESTART = Restart.NONE
SPEC = RoleSpec(count=1, cpus=0.0)  # only waits on the other actors: it must never hold a bundle they need


class CoordinatorHandle:
    """The coordinator actor of one graph."""

    def __init__(self, group: ActorGroup, config: Config) -> None:
        self.group, self.config = group, config

    def ready(self) -> None:
        """Wait until the coordinator has started its graph, within ``run.driver_timeout_s``."""
        self.group.ready()

    def run(self, rounds: int | None = None) -> int:
        """Rounds until ``rounds`` (default ``run.rounds``) are complete (:meth:`Coordinator.run`)."""
        return self._wait(Coordinator.run, "run", rounds)

    def run_round(self, total: int | None = None) -> dict[str, float]:
        return self._wait(Coordinator.run_round, "round", total)

    def evaluate(self, label: str) -> EvalTable:
        return self._wait(Coordinator.evaluate, f"evaluation {label}", label)

    def phase_seconds(self) -> dict[str, float]:
        return self._wait(Coordinator.phase_seconds, "phase seconds", timeout_s=self.config.run.call_timeout_s)

    def state(self) -> dict[str, Any]:
        return self._wait(Coordinator.state, "state", timeout_s=self.config.run.call_timeout_s)

    def shutdown(self) -> None:
        """Close the coordinator's telemetry and end its graph, then the coordinator itself: a driver that starts
        graph after graph (a sweep, a base evaluation before the warm-up) leaves no control plane behind."""
        try:
            self._wait(Coordinator.shutdown, "shutdown", timeout_s=self.config.run.call_timeout_s)
        finally:
            self.group.shutdown()

    def _wait(self, method: Callable[..., Any], what: str, *args: Any, timeout_s: float | None = None) -> Any:
        """``method(*args)`` on the coordinator, waited for within ``timeout_s`` (default ``run.driver_timeout_s``)."""
        return self.group.collect([self.group.call(0, method, *args)], what, timeout_s).values[0]


def start_coordinator(config: Config, *, resume: bool = False) -> CoordinatorHandle:
    """The coordinator actor of one graph, named ``coordinator-0`` on the dashboard, in a namespace of its own: two
    runs on one cluster, or a retry beside a failed run's dead coordinator, never claim a taken name. Returns
    without waiting for it (:meth:`CoordinatorHandle.ready`)."""
    limit = config.run.driver_timeout_s
    return CoordinatorHandle(ActorGroup.start(
        ROLE, Coordinator, SPEC, RESTART, label="coordinator", kwargs={"config": config, "resume": resume},
        call_timeout_s=limit, startup_timeout_s=limit, startup_key="run.driver_timeout_s",
        node_id=ray.get_runtime_context().get_node_id(),
    ), config)
