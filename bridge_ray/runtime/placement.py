"""Placement groups per role that fail fast instead of hanging.

Before a placement group is created its demand is compared with the cluster: a bundle that no node can
hold or a total beyond the cluster is an immediate error naming the role and what is missing; a total
beyond what is free now gets a few seconds for resources being released, then the same error. The group
is then awaited with a timeout. Bundle indices are returned sorted by node, because PACK does not
promise that consecutive bundles share a node and ranks should be node-contiguous.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.autoscaler.sdk import request_resources
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

Bundle = Mapping[str, float]
# The environment of every actor and task of a Ray that :func:`~bridge_ray.runtime.auth.init_ray` starts or joins:
# Ray (since 2.60, ray-project/ray#54868) no longer hides the GPUs from a worker that reserved none, so the
# coordinator and the shard holders would open a CUDA context on a device a learner or a sampler reserved (seen on an
# H200: the coordinator held 724 MiB). This restores the hiding, which :func:`role_device` relies on.
HIDE_UNRESERVED_GPUS = {"env_vars": {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}}
# How long a demand that fits the cluster but not its free resources may wait for them to be released.
RELEASE_GRACE_S = 10.0


class PlacementError(RuntimeError):
    """A role's resources cannot be placed; the message says which role and what is missing."""


@dataclass(frozen=True)
class RolePlacement:
    """A ready placement group and its bundle indices in node order (rank r uses ``bundle_indices[r]``)."""

    role: str
    group: PlacementGroup
    bundles: tuple[dict[str, float], ...]
    bundle_indices: tuple[int, ...]
    node_ids: tuple[str, ...]

    def strategy(self, rank: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that pins an actor to the bundle of ``rank``."""
        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundle_indices[rank]
        )

    def remove(self, timeout_s: float = 10.0) -> None:
        """Remove the group once every bundle of it is free again, i.e. the processes of its killed actors are gone.

        ``ray.kill`` returns before the actor has exited, and removing its placement group meanwhile makes the
        raylet SIGTERM it: Ray's handler then raises SystemExit in whatever Python the actor runs, typically an
        ``ActorHandle.__del__``, which prints a SystemExit traceback at the end of a run that went fine.
        """
        group_id = self.group.id.hex()
        deadline = time.monotonic() + timeout_s
        while not _bundles_free(group_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        remove_placement_group(self.group)


def _bundles_free(group_id: str) -> bool:
    total, free = ray.cluster_resources(), ray.available_resources()
    return all(free.get(name, 0.0) >= amount for name, amount in total.items() if group_id in name)


def role_device() -> str:
    """In a Ray actor, ``cuda`` when Ray gave it a GPU, else ``cpu``: a role computes on the bundle it reserved.

    A Ray started by :func:`~bridge_ray.runtime.auth.init_ray` hides the GPUs an actor did not ask for
    (:data:`HIDE_UNRESERVED_GPUS`), so a GPU-less role never lands on a neighbour's device.
    Outside an actor (an in-process sampler of ``eval`` or a bench) it is ``auto``, and starts no Ray.
    """
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        return "cuda" if ray.get_gpu_ids() else "cpu"
    return "auto"


def bundle(cpus: float, gpus: float = 0.0, resources: Mapping[str, float] | None = None) -> dict[str, float]:
    """A bundle of ``cpus`` (fractions allowed), ``gpus`` and custom ``resources`` (a node pool's, which pin the
    bundle to the nodes that declare them); zero amounts are left out, as Ray requires."""
    amounts = {"CPU": cpus, "GPU": gpus, **(resources or {})}
    return {name: amount for name, amount in amounts.items() if amount > 0}


def _describe(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items())) or "nothing"


def _describe_bundles(bundles: Sequence[Bundle]) -> str:
    kinds: dict[str, int] = {}
    for b in bundles:
        kinds[_describe(b)] = kinds.get(_describe(b), 0) + 1
    return " + ".join(f"{count} bundle(s) of {{{kind}}}" for kind, count in kinds.items())


def require_capacity(
    role: str, bundles: Sequence[Bundle], release_grace_s: float = 0.0, scale_up_s: float = 0.0
) -> None:
    """Raise :class:`PlacementError` unless the cluster can hold ``bundles``: in total, per node, and free now.

    A demand beyond the cluster's total or beyond every node fails at once, unless ``scale_up_s`` > 0:
    then the demand is handed to the autoscaler (``request_resources``) and re-checked until nodes
    arrive or ``scale_up_s`` passes (release the request with :func:`release_scale_up` once placed).
    A demand that only exceeds what is free now is re-checked for ``release_grace_s`` first: Ray frees
    the resources of a removed placement group or killed actor asynchronously, e.g. while a learner
    group is being rebuilt.
    """
    if scale_up_s > 0:
        request_resources(bundles=[dict(b) for b in bundles])
    start = time.monotonic()
    while True:
        problem, beyond_cluster = shortfall(role, bundles)
        waited = time.monotonic() - start
        if problem is None:
            return
        if waited >= max(scale_up_s, 0.0 if beyond_cluster else release_grace_s):
            if scale_up_s > 0:
                problem += f" (after {waited:.0f}s waiting for the autoscaler; run.autoscale_timeout_s={scale_up_s:g})"
            raise PlacementError(problem)
        time.sleep(0.5 if scale_up_s > 0 else 0.2)


def release_scale_up() -> None:
    """Withdraw the standing autoscaler request, so that idle nodes can be scaled down again."""
    request_resources(bundles=[])


def shortfall(role: str, bundles: Sequence[Bundle]) -> tuple[str | None, bool]:
    """What keeps ``bundles`` from being placed now (None if nothing), and whether it is beyond the cluster."""
    demand: dict[str, float] = {}
    for b in bundles:
        for name, amount in b.items():
            demand[name] = demand.get(name, 0.0) + amount
    total, free = ray.cluster_resources(), ray.available_resources()
    short = {k: need - free.get(k, 0.0) for k, need in demand.items() if need > free.get(k, 0.0) + 1e-9}
    beyond_total = any(need > total.get(k, 0.0) + 1e-9 for k, need in demand.items())
    if short:
        return (
            f"role {role!r} needs {_describe_bundles(bundles)} (total {_describe(demand)}); "
            f"the cluster has {_describe({k: total.get(k, 0.0) for k in demand})} "
            f"of which {_describe({k: free.get(k, 0.0) for k in demand})} free: missing {_describe(short)}"
        ), beyond_total
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for b in bundles:
        if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in b.items()) for node in nodes):
            biggest = max(nodes, key=lambda node: tuple(node.get(k, 0.0) for k in b), default={})
            return (
                f"role {role!r}: no node can hold a bundle of {_describe(b)} "
                f"(largest node has {_describe({k: biggest.get(k, 0.0) for k in b})})"
            ), True
    return None, False


def place_role(
    role: str, bundles: Sequence[Bundle], timeout_s: float, *, timeout_key: str, strategy: str = "PACK"
) -> RolePlacement:
    """Create and await the placement group of ``role``; fail fast when the cluster cannot hold it.

    ``timeout_key`` is the config key that set ``timeout_s``, named in the error when the group is not ready."""
    if not bundles:
        raise PlacementError(f"role {role!r}: no bundles requested")
    require_capacity(role, bundles, release_grace_s=min(timeout_s, RELEASE_GRACE_S))
    name = f"bridge-{role}-{uuid.uuid4().hex[:6]}"  # one role may be placed twice (tests, a second retriever)
    group = placement_group([dict(b) for b in bundles], strategy=strategy, name=name)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise PlacementError(
            f"role {role!r}: placement group of {_describe_bundles(bundles)} not ready within "
            f"{timeout_key}={timeout_s:g}s (free now: {_describe(ray.available_resources())}); "
            "another job may hold the resources"
        ) from None
    table = placement_group_table(group)["bundles_to_node_id"]
    order = sorted(range(len(bundles)), key=lambda i: (table[i], i))
    return RolePlacement(
        role=role,
        group=group,
        bundles=tuple(dict(b) for b in bundles),
        bundle_indices=tuple(order),
        node_ids=tuple(table[i] for i in order),
    )
