"""Autoscaling from zero: a graph beyond the cluster waits for nodes instead of failing (run.autoscale_timeout_s).

A multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) stands in for the cloud: a GPU
worker node joins while the check waits, as an autoscaled 8-GPU node would.
"""

import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from bridge_ray.runtime.placement import PlacementError, bundle, release_scale_up, require_capacity

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_a_demand_beyond_the_cluster_waits_for_the_node_that_joins(cluster):
    outcome = {}

    def check() -> None:
        start = time.monotonic()
        try:
            require_capacity("policy_learner", [bundle(1, 1)] * 2, scale_up_s=120)
            outcome["waited"] = time.monotonic() - start
        except PlacementError as exc:
            outcome["error"] = exc

    checker = threading.Thread(target=check)
    checker.start()
    time.sleep(2.0)
    assert checker.is_alive(), f"the check did not wait for the node: {outcome}"
    cluster.add_node(num_cpus=2, num_gpus=2)  # the "autoscaled" GPU node
    checker.join(120)
    assert "error" not in outcome and outcome["waited"] >= 2.0
    release_scale_up()


def test_the_wait_for_the_autoscaler_ends_with_the_shortfall(cluster):
    with pytest.raises(PlacementError, match=r"missing GPU 8.*waiting for the autoscaler"):
        require_capacity("policy_learner", [bundle(1, 8)], scale_up_s=1.0)
