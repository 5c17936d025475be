"""The coordinator as a Ray actor: CPU only, outside every GPU bundle, driving the graph by refs."""

from __future__ import annotations

from typing import Any

import ray

from bridge_ray.config import Config
from bridge_ray.runtime.actor_group import start_single
from bridge_ray.train.coordinator import Coordinator

ROLE = "coordinator"
# num_cpus=0: the coordinator only waits on the other actors; it must never hold a bundle they need.
CoordinatorActor = ray.remote(num_cpus=0)(Coordinator)


def start_coordinator(config: Config, **kwargs: Any) -> ray.actor.ActorHandle:
    """The coordinator actor of one graph, named ``coordinator`` on the dashboard, in a namespace of its own:
    two runs on one cluster, or a retry beside a failed run's dead coordinator, never claim a taken name."""
    return start_single(CoordinatorActor, ROLE, config, **kwargs)
