"""The coordinator as a Ray actor: CPU only, outside every GPU bundle, driving the graph by refs."""

from __future__ import annotations

import ray

from bridge_ray.train.coordinator import Coordinator

# num_cpus=0: the coordinator only waits on the other actors; it must never hold a bundle they need.
CoordinatorActor = ray.remote(num_cpus=0)(Coordinator)
