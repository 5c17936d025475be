"""One role's actors as one object: placement, creation, calls that return refs, and collection under the
role's restart policy.

Every role is an :class:`ActorGroup` (README, "How the pieces fit"): the coordinator, the samplers, the shard
holders, the retriever learner and the policy-learner ranks. What differs between them is only the policy
that :class:`Restart` names, which decides the Ray options of their actors and what :meth:`ActorGroup.collect`
does when one dies (README, "Faults"), and the limits their owner reads from the config. Each role's typed
handle (the ``handle`` module of its package: ``SamplerGroup``, ``ShardHolders``, ``RetrieverLearnerGroup``,
``PolicyLearnerGroup``, ``CoordinatorHandle``) wraps its group: only the handles name actor methods, passing the
method itself, and a call with several returns reads them by the names of the bundle its method returns
(:class:`Call` ``.out``), never by position.

Actors are named by role and index (``sampler-0``, ``shard-holder-1``, ...), so the Ray dashboard reads like the
graph. Each group names its actors in a namespace of its own (``bridge-ray-<role>-<random>``): several graphs in
one Ray instance, or a group rebuilt while its predecessor's actors are still dying, never claim a taken name.
"""

from __future__ import annotations

import enum
import itertools
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import psutil
import ray
from ray._private.state import actors
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bridge_ray.runtime import traffic
from bridge_ray.runtime.calls import ActorLost, ActorRestarting, get_within
from bridge_ray.runtime.placement import RolePlacement, bundle, place_role

# How long :meth:`ActorGroup.shutdown` waits for its killed actors' processes to exit. ``ray.kill`` returns at
# once, and a replacement started beside a dying process (a policy learner rebuilt after a fault while the old
# ranks were still inside ``train_on``) doubles the memory.
EXIT_TIMEOUT_S = 60.0


class Restart(enum.Enum):
    """What happens when an actor of the group dies."""

    # Ray restarts it (its constructor reloads the initial state); the group waits for the restart, primes it
    # with the run's current state and sends the dead call again. No automatic task retry: a retried call
    # would run on the restarted actor's stale state. For actors whose calls depend on state (samplers). An
    # actor that died between calls is restarted before any call fails; it raises StateLost at its next call
    # until primed, and that call is sent again the same way.
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
    resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per actor (a node pool)

    def bundles(self) -> list[dict[str, float]]:
        return [bundle(self.cpus, self.gpus, self.resources)] * self.count


R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[R]):
    """One remote call on one actor of a group, kept so that it can be sent again.

    ``method`` is the actor class's own function (``Sampler.rollout``), never its name: a renamed method is an
    error at import, not at the first call. ``returns`` is the NamedTuple the method returns, declared beside it
    (one ref when None): Ray stores each field as an object of its own, and ``out`` is the same bundle of their
    refs, so the method and its callers name the fields alike and a reordering cannot swap them.
    :meth:`ActorGroup.collect` fetches only the first (``result``); the others (``out``) stay in the object store
    for whoever the caller hands them to.
    """

    index: int
    method: Callable[..., Any]
    args: tuple
    refs: tuple[ray.ObjectRef, ...]
    returns: type[R] | None = None

    @property
    def result(self) -> ray.ObjectRef:
        return self.refs[0]

    @property
    def out(self) -> R:
        """The refs by name (an instance of ``returns`` holding a ref in each field)."""
        if self.returns is None:
            raise TypeError(f"{self.method.__qualname__} has one return: read .result")
        return self.returns(*self.refs)


@dataclass(frozen=True)
class Collected(Generic[R]):
    """What :meth:`ActorGroup.collect` fetched: the first result of every call, and the calls as they were
    answered: a call sent again to a revived actor is replaced by its fresh copy (new refs), at ``resent``."""

    values: list[Any]
    calls: list[Call[R]]
    resent: frozenset[int] = frozenset()


def num_returns(returns: type | None) -> int:
    """How many refs a call whose method returns the NamedTuple ``returns`` has."""
    return 1 if returns is None else len(returns._fields)


@dataclass(frozen=True)
class NamedActors:
    """A group's actors by name, and how they are called: what another actor is given in place of their handles,
    to call them through :meth:`ActorGroup.attach`.

    Ray warns (an ``E`` line) about any actor with ``max_restarts > 0`` whose constructor arguments sit in the
    object store, which actor handles in the arguments make them do; names are plain strings, and a restarted
    actor looks the handles up again.
    """

    namespace: str
    names: tuple[str, ...]
    role: str
    label: str
    spec: RoleSpec
    restart: Restart

    def handles(self) -> list[ray.actor.ActorHandle]:
        return [ray.get_actor(name, namespace=self.namespace) for name in self.names]


def actor_name(role: str, index: int) -> str:
    """``sampler-0``, ``shard-holder-1``: the role as the dashboard shows it, and the actor's index."""
    return f"{role.replace('_', '-')}-{index}"


def fresh_namespace(role: str) -> str:
    """``bridge-ray-<role>-<random>``: a namespace no other graph, run or earlier attempt has used, so a name in
    it is never taken (not even by a dead actor of a failed run that Ray still lists)."""
    return f"bridge-ray-{role.replace('_', '-')}-{secrets.token_hex(4)}"


def split_evenly(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``parts`` contiguous slices whose sizes differ by at most one (whole questions per sampler)."""
    bounds = [len(items) * p // parts for p in range(parts + 1)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds)]


class ActorGroup:
    """``spec.count`` actors of one role, each pinned to its bundle of the role's placement group (a role that
    reserves nothing, the coordinator, has none).

    ``call_timeout_s`` bounds the wait for a call's result, ``startup_timeout_s`` the wait for the constructors
    (:meth:`ready`); None: no limit (the driver's waits on the coordinator, whose own waits are all bounded).
    """

    def __init__(
        self,
        role: str,
        label: str,
        handles: list[ray.actor.ActorHandle],
        placement: RolePlacement | None,
        spec: RoleSpec,
        restart: Restart,
        *,
        call_timeout_s: float | None,
        startup_timeout_s: float | None,
        startup_key: str,
        namespace: str,
    ) -> None:
        self.role, self.label, self.handles, self.placement = role, label, handles, placement
        self.namespace = namespace
        self.spec, self.restart = spec, restart
        self.call_timeout_s, self.startup_timeout_s, self.startup_key = call_timeout_s, startup_timeout_s, startup_key
        # Under Restart.RESEND, set by the role's handle: the calls that give revived actor ``index`` the run's
        # current state, before its dead call is sent again.
        self.prime: Callable[[int], list[Call]] | None = None
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
        call_timeout_s: float | None,
        startup_timeout_s: float | None,
        startup_key: str | None = None,
        node_id: str | None = None,
    ) -> ActorGroup:
        """Place the role (failing fast, naming it, when the cluster cannot hold it) and create its actors:
        ``actor_class(*args, **kwargs, **per_actor(i))`` for actor ``i``. Returns without waiting for them.

        ``startup_timeout_s`` bounds the placement, then the actors' start-up; errors name ``startup_key``, the
        key that set it (default ``roles.<role>.startup_timeout_s``). A role whose bundles are empty (no CPU, no
        GPU: the coordinator) is not placed; ``node_id`` then pins its actors to that node."""
        startup_key = startup_key or f"roles.{role}.startup_timeout_s"
        placement = (
            place_role(role, spec.bundles(), startup_timeout_s, timeout_key=startup_key) if any(spec.bundles())
            else None
        )
        pinned = NodeAffinitySchedulingStrategy(node_id, soft=False) if node_id is not None else None
        retries = {
            Restart.RESEND: (spec.max_restarts, 0),
            Restart.RETRY: (spec.max_restarts, spec.max_restarts),
            Restart.NONE: (0, 0),
        }[restart]
        remote = ray.remote(actor_class)
        namespace = fresh_namespace(role)
        handles: list[ray.actor.ActorHandle] = []
        try:
            for i in range(spec.count):
                options = remote.options(
                    num_cpus=spec.cpus, num_gpus=spec.gpus, resources=dict(spec.resources),
                    scheduling_strategy=placement.strategy(i) if placement is not None else pinned,
                    max_restarts=retries[0], max_task_retries=retries[1], name=actor_name(role, i),
                    namespace=namespace,
                )
                handles.append(options.remote(*args, **(kwargs or {}), **(per_actor(i) if per_actor else {})))
        except BaseException:
            for handle in handles:
                ray.kill(handle, no_restart=True)
            if placement is not None:
                placement.remove()
            raise
        return cls(role, label, handles, placement, spec, restart, call_timeout_s=call_timeout_s,
                   startup_timeout_s=startup_timeout_s, startup_key=startup_key, namespace=namespace)

    def __len__(self) -> int:
        return len(self.handles)

    @classmethod
    def attach(cls, named: NamedActors, *, call_timeout_s: float) -> ActorGroup:
        """The group of ``named``'s actors as another actor calls them: the same calls and collection under the
        same restart policy, without their ownership (their starter ends them)."""
        return cls(named.role, named.label, named.handles(), None, named.spec, named.restart,
                   call_timeout_s=call_timeout_s, startup_timeout_s=call_timeout_s, startup_key="run.call_timeout_s",
                   namespace=named.namespace)

    def named(self) -> NamedActors:
        """The group's actors by name (:class:`NamedActors`)."""
        return NamedActors(self.namespace, tuple(actor_name(self.role, i) for i in range(len(self))), self.role,
                           self.label, self.spec, self.restart)

    def __getitem__(self, index: Any) -> Any:
        return self.handles[index]

    def __iter__(self) -> Iterator[ray.actor.ActorHandle]:
        return iter(self.handles)

    # ---- calls ----------------------------------------------------------------------------------------

    def call(
        self, index: int, method: Callable[..., Any], *args: Any, returns: type[R] | None = None
    ) -> Call[R]:
        """``method(*args)`` on actor ``index``; its refs named by ``returns`` (see :class:`Call`)."""
        return Call(index, method, args, self._send(index, method, args, num_returns(returns)), returns)

    def call_all(self, method: Callable[..., Any], *args: Any, returns: type[R] | None = None) -> list[Call[R]]:
        return [self.call(i, method, *args, returns=returns) for i in range(len(self))]

    def call_split(
        self, method: Callable[..., Any], items: Sequence[Any], *args: Any, pieces_per_actor: int = 1,
        returns: type[R] | None = None,
    ) -> list[Call[R]]:
        """``method(part, *args)`` for every non-empty part of ``items`` cut into ``pieces_per_actor`` contiguous
        parts per actor, in order, dealt round-robin (part ``j`` to actor ``j % len(self)``): every actor gets the
        same share, and collecting the calls in order follows the work as it finishes."""
        parts = split_evenly(items, len(self) * pieces_per_actor)
        return [
            self.call(j % len(self), method, part, *args, returns=returns)
            for j, part in enumerate(parts) if part
        ]

    def _send(self, index: int, method: Callable[..., Any], args: tuple, count: int) -> tuple[ray.ObjectRef, ...]:
        refs = getattr(self.handles[index], method.__name__).options(num_returns=count).remote(*args)
        refs = tuple(refs) if count > 1 else (refs,)
        if (ledger := traffic.ledger()) is not None:  # cluster-check: what crosses between nodes
            ledger.sent(self.handles[index], args, refs)
        return refs

    # ---- collection -----------------------------------------------------------------------------------

    def ready(self) -> None:
        """Wait until every actor's constructor has run, within the role's start-up timeout: a constructor that
        failed is an error here, at start-up, not at the role's first call."""
        get_within([h.__ray_ready__.remote() for h in self.handles], self.startup_timeout_s,
                   f"{self.label} (start-up)", self.startup_key)

    def collect(self, calls: Sequence[Call[R]], what: str, timeout_s: float | None = None) -> Collected[R]:
        """The first result of every call, in order, failing at the first error (naming the actors and ``what``),
        within ``timeout_s`` (default: the group's ``call_timeout_s``).

        Under :attr:`Restart.RESEND` a call whose actor died is sent again once Ray has restarted it and it
        has been primed (up to ``max_restarts`` times), and reported in :attr:`Collected.resent`; otherwise a
        death is an :class:`ActorLost`.
        """
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        if self.restart is not Restart.RESEND:
            return Collected(get_within([c.result for c in calls], timeout_s, f"{self.label} ({what})"), list(calls))
        answered = [self._collect_resending(call, what, timeout_s) for call in calls]
        return Collected(
            [value for value, _ in answered], [call for _, call in answered],
            frozenset(i for i, (_, call) in enumerate(answered) if call is not calls[i]),
        )

    def _collect_resending(self, call: Call[R], what: str, timeout_s: float) -> tuple[Any, Call[R]]:
        """The call's first result, and the call that gave it (``call``, or the copy sent to the revived actor).

        A death while the revived actor is primed is one more restart, like a death in the call itself."""
        for attempt in itertools.count():
            try:
                if attempt:
                    self._revive(call.index)
                    call = replace(call, refs=self._send(call.index, call.method, call.args, len(call.refs)))
                return get_within(call.result, timeout_s, f"{self.label} {call.index} ({what})"), call
            except ActorLost:
                if attempt >= self.spec.max_restarts:
                    raise

    def _revive(self, index: int) -> None:
        """Wait for Ray to restart actor ``index``, then send it what ``prime`` says it must hold now."""
        what = f"{self.label} {index} (restart; roles.{self.role}.max_restarts={self.spec.max_restarts})"
        handle = self.handles[index]
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                get_within(handle.__ray_ready__.remote(), max(deadline - time.monotonic(), 0.0), what,
                           self.startup_key)
                break
            except ActorRestarting:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        if self.prime is not None:
            pushes = [call.result for call in self.prime(index)]
            get_within(pushes, self.call_timeout_s, f"{self.label} {index} (state after restart)")
        print(f"{self.label} {index} died and was restarted; it now holds the run's current state", flush=True)
        self.revived.append(index)

    def shutdown(self) -> None:
        """End every actor and wait until their processes have exited, then free the placement group: whatever
        is started next (a rebuilt learner group) never runs beside them. A process that outlives
        :data:`EXIT_TIMEOUT_S` is an error naming it, rather than a silent second copy."""
        alive = _alive_pids(self.handles)
        for handle in self.handles:
            ray.kill(handle, no_restart=True)
        self.handles = []
        running = _wait_on_nodes(alive, EXIT_TIMEOUT_S)
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
        if running:
            raise RuntimeError(f"{self.label}: process(es) {running} still running {EXIT_TIMEOUT_S:g}s after "
                               "ray.kill; not starting anything beside them")


def _alive_pids(handles: Sequence[ray.actor.ActorHandle]) -> dict[str, list[int]]:
    """Node id -> pids of the actors among ``handles`` that are alive, from the GCS's actor table (which, unlike
    Ray's state API, needs no dashboard). Actors already dead or restarting are left out: Ray reports those
    once their process is gone, and their pid may since belong to another process."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for handle in handles:
        info = actors(actor_id=handle._actor_id.hex())
        if info and info["State"] == "ALIVE" and info["Pid"]:
            by_node[info["Address"]["NodeID"]].append(info["Pid"])
    return by_node


def _wait_on_nodes(pids_by_node: Mapping[str, list[int]], timeout_s: float) -> list[int]:
    """:func:`wait_for_exit` on each node (here directly, elsewhere as a task pinned to the node); the pids still
    running after ``timeout_s``. A node that died (before or during the wait; the GCS may still list its actors
    as alive) took its processes with it: none of them is running."""
    here = ray.get_runtime_context().get_node_id()
    waiter = ray.remote(num_cpus=0)(wait_for_exit)
    running = [pid for node, pids in pids_by_node.items() if node == here for pid in wait_for_exit(pids, timeout_s)]
    remote = [
        waiter.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(pids, timeout_s)
        for node, pids in pids_by_node.items() if node != here
    ]
    for ref in remote:
        try:
            running += ray.get(ref)
        except (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError):
            continue
    return running


def wait_for_exit(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Wait until no process of ``pids`` on this node runs; the pids still running after ``timeout_s``. A zombie
    has exited (its memory is free; only its parent has not collected its status yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [pid for pid in pids if _running(pid)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
