"""A local Ray instance per job-test module, sized for the whole graph (other engineers' clusters are left alone)."""

import pytest
import ray


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=800_000_000, log_to_driver=False)
    yield
    ray.shutdown()
