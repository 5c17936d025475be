"""What the graph asks of the cluster, as ``train --dry-run`` prints it, and the error for a cluster too small:
each role that cannot be placed even alone, named with the keys that size it.

The dry run of inputs that fail still reports the graph's needs: against the Ray cluster it has joined, else
against this machine's own CPUs and GPUs (what a local Ray would get), so that a missing index or data set does
not hide that the graph needs GPUs the machine lacks.
"""

from __future__ import annotations

import ray
from ray._private.accelerators import get_accelerator_manager_for_resource
from ray._private.utils import get_num_cpus

from bridge_ray.config import Config, derive
from bridge_ray.coordinator.graph import check_graph_resources, graph_bundles
from bridge_ray.errors import InputError, InputErrors
from bridge_ray.retrieval.manifest import read_manifest
from bridge_ray.runtime.placement import PlacementError, require_capacity


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items()) if amount) or "nothing"


def _summed(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for name, amount in b.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def _cpus_gpus(resources: dict[str, float], custom: list[str] | tuple[str, ...] = ()) -> str:
    """CPUs, GPUs and the ``custom`` resources (node pools) the graph asks for, zeros included: "GPU 0" or
    "pool_learn 0" is the news on a cluster without them."""
    return ", ".join(f"{name} {resources.get(name, 0.0):g}" for name in ("CPU", "GPU", *custom))


def custom_resources(bundles: list[dict[str, float]]) -> list[str]:
    """The custom resources (``roles.<role>.resources``) among ``bundles``, sorted."""
    return sorted({name for b in bundles for name in b} - {"CPU", "GPU"})


def planned(config: Config) -> Config:
    """``config`` as the report sizes it: an index folder without a readable manifest (not built or copied yet)
    counts as ``roles.shard_holder.count`` shard holders, else ``retrieval.index.num_shards``; the preflight names
    what is wrong with it."""
    index = config.retrieval.index
    if index.dir is None:
        return config
    try:
        read_manifest(index.dir)
    except InputError:
        shards = config.roles.shard_holder.count or index.num_shards
        return derive(config, {"retrieval.index.dir": None, "retrieval.index.num_shards": shards},
                      source="the resource report")
    return config


def resource_table(config: Config, seen: tuple[str, str] | None = None) -> str:
    """What each role asks of the cluster (count, one actor's bundle, in all), the graph's sum and the resources
    ``seen`` (a row's label and text; by default the joined Ray cluster's, in all and free), as ``--dry-run``
    prints it."""
    rows = [("role", "count", "each", "in all")]
    everything, sized = [], planned(config)
    for role, bundles in graph_bundles(sized).items():
        rows.append((role, str(len(bundles)), _amounts(bundles[0]) if bundles else "-", _amounts(_summed(bundles))))
        everything += bundles
    rows.append(("graph", "", "", _amounts(_summed(everything))))
    if seen is None:
        custom = custom_resources(everything)
        seen = ("cluster", f"{_cpus_gpus(ray.cluster_resources(), custom)} "
                f"(free: {_cpus_gpus(ray.available_resources(), custom)})")
    rows.append((seen[0], "", "", seen[1]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if sized is not config:
        lines.append(f"(shard holders: retrieval.index.num_shards={config.retrieval.index.num_shards}, until "
                     f"{config.retrieval.index.dir} holds an index)")
    return "\n".join(lines)


def _sizing(role: str, bundles: list[dict[str, float]]) -> str:
    """The keys that size ``role``'s demand (and, for a role in a node pool, the key that names the pool)."""
    if role == "shard_holder":
        sizing = "rebuild the index with fewer shards (build-index --shards K) or lower roles.shard_holder.cpus/gpus"
    else:
        sizing = f"lower roles.{role}.count or roles.{role}.cpus/gpus"
    if pools := custom_resources(bundles):
        sizing += f", add a node that declares {', '.join(pools)} or change roles.{role}.resources"
    return sizing


def resource_problems(config: Config, graph: Exception) -> InputErrors:
    """The error for a graph the cluster cannot hold: each role that cannot be placed even alone, named with the
    keys that size it; else the graph as a whole (``graph``, the error of the whole graph's check)."""
    problems = []
    for role, bundles in graph_bundles(planned(config)).items():
        try:
            require_capacity(role, bundles)
        except PlacementError as exc:
            problems.append(f"{exc}; {_sizing(role, bundles)}, or run on a larger cluster (run.ray_address)")
    whole = (f"the cluster cannot hold the whole graph at once: {graph}; lower the roles' counts, cpus or gpus "
             "(roles.*), or run on a larger cluster (run.ray_address)")
    return InputErrors(problems or [whole])


def require_graph_capacity(config: Config) -> None:
    """The run's check, before the warm-up and before any actor starts: the cluster holds the whole graph (after
    asking the autoscaler, ``run.autoscale_timeout_s``), else the error naming the roles that are short."""
    try:
        check_graph_resources(config)
    except PlacementError as exc:
        errors = resource_problems(config, exc)
        if waited := config.run.autoscale_timeout_s:
            errors = InputErrors([f"{p} (still missing after run.autoscale_timeout_s={waited:g}s)"
                                  for p in errors.problems])
        raise errors from None


def report_capacity(config: Config) -> bool:
    """``--dry-run``'s check that the cluster can hold the graph, with its per-role table; False when it cannot yet
    but the autoscaler will be asked (``run.autoscale_timeout_s``)."""
    print(resource_table(config))
    try:
        check_graph_resources(planned(config), scale_up=False)
    except PlacementError as exc:
        if not config.run.autoscale_timeout_s:
            raise resource_problems(config, exc) from None
        print(f"{exc}\nthe run will ask the autoscaler for it (run.autoscale_timeout_s)")
        return False
    print("the cluster can hold the graph")
    return True


def local_machine() -> dict[str, float]:
    """The CPUs and GPUs a local Ray would declare on this machine, counted as Ray counts them (cgroup limits,
    CUDA_VISIBLE_DEVICES), without starting it."""
    gpus = get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators()
    return {"CPU": float(get_num_cpus()), "GPU": float(gpus)}


def machine_problems(config: Config, machine: dict[str, float]) -> list[str]:
    """What keeps ``machine`` (one node) from holding the graph: each role beyond it even alone, named with the
    keys that size it; else the graph as a whole; empty when it fits."""
    def beyond(need: dict[str, float]) -> dict[str, float]:
        return {k: v - machine.get(k, 0.0) for k, v in need.items() if v > machine.get(k, 0.0) + 1e-9}

    bundles = graph_bundles(planned(config))
    has = f"this machine has {_cpus_gpus(machine, custom_resources([b for r in bundles.values() for b in r]))}"
    elsewhere = "or run on a Ray cluster that has them (run.ray_address)"
    problems = []
    for role, role_bundles in bundles.items():
        need = _summed(role_bundles)
        if missing := beyond(need):
            each = f"{len(role_bundles)} x {{{_amounts(role_bundles[0])}}}"
            problems.append(f"role {role!r} needs {_amounts(need)} ({each}); {has}: missing {_amounts(missing)}; "
                            f"{_sizing(role, role_bundles)}, {elsewhere}")
    whole = _summed([b for role_bundles in bundles.values() for b in role_bundles])
    if not problems and (missing := beyond(whole)):
        problems.append(f"the graph needs {_amounts(whole)} at once; {has}: missing {_amounts(missing)}; lower the "
                        f"roles' counts, cpus or gpus (roles.*), {elsewhere}")
    return problems


def report_machine(config: Config) -> None:
    """``--dry-run``'s resource report when no Ray was started (the inputs failed): the per-role table against this
    machine, and what it lacks as errors."""
    machine = local_machine()
    custom = custom_resources([b for r in graph_bundles(planned(config)).values() for b in r])
    print(resource_table(config, ("machine", f"{_cpus_gpus(machine, custom)} (no Ray started: the inputs failed)")))
    if problems := machine_problems(config, machine):
        raise InputErrors(problems)
    print("this machine can hold the graph")
