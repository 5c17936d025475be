"""What the graph asks of the cluster, as ``train --dry-run`` prints it, and the error for a cluster too small:
each role that cannot be placed even alone, named with the keys that size it."""

from __future__ import annotations

import ray

from bridge_ray.config import Config
from bridge_ray.errors import InputErrors
from bridge_ray.runtime.placement import PlacementError, require_capacity
from bridge_ray.train.graph import check_graph_resources, graph_bundles


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items()) if amount) or "nothing"


def _summed(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for name, amount in b.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def resource_table(config: Config) -> str:
    """What each role asks of the cluster (count, one actor's bundle, in all), the graph's sum and the cluster's
    resources, as ``--dry-run`` prints it."""
    rows = [("role", "count", "each", "in all")]
    everything = []
    for role, bundles in graph_bundles(config).items():
        rows.append((role, str(len(bundles)), _amounts(bundles[0]) if bundles else "-", _amounts(_summed(bundles))))
        everything += bundles
    rows.append(("graph", "", "", _amounts(_summed(everything))))
    cluster = ray.cluster_resources()
    rows.append(("cluster", "", "", f"{_amounts({k: cluster.get(k, 0.0) for k in ('CPU', 'GPU')})} "
                 f"(free: {_amounts({k: ray.available_resources().get(k, 0.0) for k in ('CPU', 'GPU')})})"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def resource_problems(config: Config, graph: Exception) -> InputErrors:
    """The error for a graph the cluster cannot hold: each role that cannot be placed even alone, named with the
    keys that size it; else the graph as a whole (``graph``, the error of the whole graph's check)."""
    sizing = {"shard_holder": "rebuild the index with fewer shards (build-index --shards K) or lower "
                              "roles.shard_holder.cpus/gpus"}
    problems = []
    for role, bundles in graph_bundles(config).items():
        try:
            require_capacity(role, bundles)
        except PlacementError as exc:
            fix = sizing.get(role, f"lower roles.{role}.count or roles.{role}.cpus/gpus")
            problems.append(f"{exc}; {fix}, or run on a larger cluster (run.ray_address)")
    whole = (f"the cluster cannot hold the whole graph at once: {graph}; lower the roles' counts, cpus or gpus "
             "(roles.*), or run on a larger cluster (run.ray_address)")
    return InputErrors(problems or [whole])


def require_graph_capacity(config: Config) -> None:
    """The run's check, before the warm-up and before any actor starts: the cluster holds the whole graph (after
    asking the autoscaler, ``run.autoscale_timeout_s``), else the error naming the roles that are short."""
    try:
        check_graph_resources(config)
    except PlacementError as exc:
        raise resource_problems(config, exc) from None


def report_capacity(config: Config) -> bool:
    """``--dry-run``'s check that the cluster can hold the graph, with its per-role table; False when it cannot yet
    but the autoscaler will be asked (``run.autoscale_timeout_s``)."""
    print(resource_table(config))
    try:
        check_graph_resources(config, scale_up=False)
    except PlacementError as exc:
        if not config.run.autoscale_timeout_s:
            raise resource_problems(config, exc) from None
        print(f"{exc}\nthe run will ask the autoscaler for it (run.autoscale_timeout_s)")
        return False
    print("the cluster can hold the graph")
    return True
