"""One role's actors as one object: placement, creation, calls that return refs, and collection under the
role's restart policy.

Every role of the graph is an :class:`ActorGroup` (README, "How the pieces fit"): the samplers, the shard
holders, the retriever learner and the policy-learner ranks. What differs between them is only the policy
that :class:`Restart` names, which decides the Ray options of their actors and what :meth:`ActorGroup.collect`
does when one dies (README, "Faults").

Actors are named by role and index (``sampler-0``, ``shard-holder-1``, ...), so the Ray dashboard reads like the
graph. Each group names its actors in a namespace of its own (``bridge-ray-<role>-<random>``): several graphs in
one Ray instance, or a group rebuilt while its predecessor's actors are still dying, never claim a taken name.
"""

from __future__ import annotations

import enum
import itertools
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from bridge_ray.runtime.calls import ActorLost, ActorRestarting, get_within
from bridge_ray.runtime.placement import RolePlacement, bundle, place_role


class Restart(enum.Enum):
    """What happens when an actor of the group dies."""

    # Ray restarts it (its constructor reloads the initial state); the group waits for the restart, primes it
    # with the run's current state and sends the dead call again. No automatic task retry: a retried call
    # would run on the restarted actor's stale state. For actors whose calls depend on state (samplers).
    RESEND = "resend"
    # Ray restarts it and retries the calls sent to it. For stateless readers (shard holders).
    RETRY = "retry"
    # No restart: a death is an ActorLost for the owner, who rolls back (learners: a rank cannot rejoin a
    # live process group, and the retriever learner's optimizer state would be lost).
    NONE = "none"


@dataclass(frozen=True)
class RoleSpec:
    """What one role asks of the cluster (an entry of the ``roles:`` config section)."""

    count: int
    cpus: float
    gpus: float = 0.0
    max_restarts: int = 0  # Ray restarts of one actor; -1: unlimited (Restart.RETRY only)

    def bundles(self) -> list[dict[str, float]]:
        return [bundle(self.cpus, self.gpus)] * self.count


@dataclass
class Call:
    """One remote call on one actor of a group, kept so that it can be sent again.

    ``refs`` holds the call's ``num_returns`` object refs; :meth:`ActorGroup.collect` fetches only the first
    (``result``), the others stay in the object store for whoever the caller hands them to.
    """

    index: int
    method: str
    args: tuple
    refs: list[ray.ObjectRef]

    @property
    def result(self) -> ray.ObjectRef:
        return self.refs[0]


@dataclass(frozen=True)
class NamedActors:
    """A group's actors by name: what an actor that Ray may restart is given in place of their handles.

    Ray warns (an ``E`` line) about any actor with ``max_restarts > 0`` whose constructor arguments sit in the
    object store, which actor handles in the arguments make them do; names are plain strings, and a restarted
    actor looks the handles up again.
    """

    namespace: str
    names: tuple[str, ...]

    def handles(self) -> list[ray.actor.ActorHandle]:
        return [ray.get_actor(name, namespace=self.namespace) for name in self.names]


def actor_name(role: str, index: int) -> str:
    """``sampler-0``, ``shard-holder-1``: the role as the dashboard shows it, and the actor's index."""
    return f"{role.replace('_', '-')}-{index}"


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``parts`` contiguous slices whose sizes differ by at most one (whole questions per sampler)."""
    bounds = [len(items) * p // parts for p in range(parts + 1)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


class ActorGroup:
    """``spec.count`` actors of one role, each pinned to its bundle of the role's placement group."""

    def __init__(
        self,
        role: str,
        label: str,
        handles: list[ray.actor.ActorHandle],
        placement: RolePlacement | None,
        spec: RoleSpec,
        restart: Restart,
        *,
        call_timeout_s: float,
        restart_timeout_s: float,
        namespace: str,
        prime: Callable[[ray.actor.ActorHandle], list[ray.ObjectRef]] | None = None,
    ) -> None:
        self.role, self.label, self.handles, self.placement = role, label, handles, placement
        self.namespace = namespace
        self.spec, self.restart = spec, restart
        self.call_timeout_s, self.restart_timeout_s, self.prime = call_timeout_s, restart_timeout_s, prime
        self.revived: list[int] = []  # indices of actors revived since the owner last cleared it

    @classmethod
    def start(
        cls,
        role: str,
        actor_class: type,
        spec: RoleSpec,
        restart: Restart,
        *,
        label: str,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        per_actor: Callable[[int], Mapping[str, Any]] | None = None,
        call_timeout_s: float,
        startup_timeout_s: float,
        prime: Callable[[ray.actor.ActorHandle], list[ray.ObjectRef]] | None = None,
    ) -> ActorGroup:
        """Place the role (failing fast, naming it, when the cluster cannot hold it) and create its actors:
        ``actor_class(*args, **kwargs, **per_actor(i))`` for actor ``i``. Returns without waiting for them."""
        placement = place_role(role, spec.bundles(), startup_timeout_s)
        retries = {
            Restart.RESEND: (spec.max_restarts, 0),
            Restart.RETRY: (spec.max_restarts, spec.max_restarts),
            Restart.NONE: (0, 0),
        }[restart]
        remote = ray.remote(actor_class)
        namespace = f"bridge-ray-{role.replace('_', '-')}-{secrets.token_hex(4)}"
        handles: list[ray.actor.ActorHandle] = []
        try:
            for i in range(spec.count):
                options = remote.options(
                    num_cpus=spec.cpus, num_gpus=spec.gpus, scheduling_strategy=placement.strategy(i),
                    max_restarts=retries[0], max_task_retries=retries[1], name=actor_name(role, i),
                    namespace=namespace,
                )
                handles.append(options.remote(*args, **(kwargs or {}), **(per_actor(i) if per_actor else {})))
        except BaseException:
            for handle in handles:
                ray.kill(handle, no_restart=True)
            placement.remove()
            raise
        return cls(role, label, handles, placement, spec, restart, call_timeout_s=call_timeout_s,
                   restart_timeout_s=startup_timeout_s, prime=prime, namespace=namespace)

    def __len__(self) -> int:
        return len(self.handles)

    def named(self) -> NamedActors:
        """The group's actors by name (:class:`NamedActors`)."""
        return NamedActors(self.namespace, tuple(actor_name(self.role, i) for i in range(len(self))))

    def __getitem__(self, index: Any) -> Any:
        return self.handles[index]

    def __iter__(self) -> Iterator[ray.actor.ActorHandle]:
        return iter(self.handles)

    # ---- calls ----------------------------------------------------------------------------------------

    def call(self, index: int, method: str, *args: Any, num_returns: int = 1) -> Call:
        return Call(index, method, args, self._send(index, method, args, num_returns))

    def call_all(self, method: str, *args: Any, num_returns: int = 1) -> list[Call]:
        return [self.call(i, method, *args, num_returns=num_returns) for i in range(len(self))]

    def call_split(
        self, method: str, items: Sequence[Any], *args: Any, pieces_per_actor: int = 1, num_returns: int = 1
    ) -> list[Call]:
        """``method(part, *args)`` for every non-empty part of ``items`` cut into ``pieces_per_actor`` contiguous
        parts per actor, in order, dealt round-robin (part ``j`` to actor ``j % len(self)``): every actor gets the
        same share, and collecting the calls in order follows the work as it finishes."""
        parts = split_evenly(items, len(self) * pieces_per_actor)
        return [
            self.call(j % len(self), method, part, *args, num_returns=num_returns)
            for j, part in enumerate(parts) if part
        ]

    def _send(self, index: int, method: str, args: tuple, num_returns: int) -> list[ray.ObjectRef]:
        refs = getattr(self.handles[index], method).options(num_returns=num_returns).remote(*args)
        return list(refs) if num_returns > 1 else [refs]

    # ---- collection -----------------------------------------------------------------------------------

    def collect(self, calls: Sequence[Call], what: str, timeout_s: float | None = None) -> list[Any]:
        """The first result of every call, in order, failing at the first error (naming the actors and ``what``).

        Under :attr:`Restart.RESEND` a call whose actor died is sent again once Ray has restarted it and it
        has been primed (up to ``max_restarts`` times); otherwise a death is an :class:`ActorLost`.
        """
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        if self.restart is not Restart.RESEND:
            return get_within([c.result for c in calls], timeout_s, f"{self.label} ({what})")
        return [self._collect_resending(call, what, timeout_s) for call in calls]

    def _collect_resending(self, call: Call, what: str, timeout_s: float) -> Any:
        for attempt in itertools.count():
            try:
                return get_within(call.result, timeout_s, f"{self.label} {call.index} ({what})")
            except ActorLost:
                if attempt >= self.spec.max_restarts:
                    raise
                self._revive(call.index)
                call.refs = self._send(call.index, call.method, call.args, len(call.refs))

    def _revive(self, index: int) -> None:
        """Wait for Ray to restart actor ``index``, then send it what ``prime`` says it must hold now."""
        what = f"{self.label} {index} (restart; roles.{self.role}.max_restarts={self.spec.max_restarts})"
        handle = self.handles[index]
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                get_within(handle.__ray_ready__.remote(), max(deadline - time.monotonic(), 0.0), what)
                break
            except ActorRestarting:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        if self.prime is not None:
            get_within(self.prime(handle), self.call_timeout_s, f"{self.label} {index} (state after restart)")
        print(f"{self.label} {index} died and was restarted; it now holds the run's current state", flush=True)
        self.revived.append(index)

    def shutdown(self) -> None:
        """End every actor, then free the placement group once their processes are gone."""
        for handle in self.handles:
            ray.kill(handle, no_restart=True)
        self.handles = []
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
