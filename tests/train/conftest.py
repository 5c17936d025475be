"""A local Ray instance per job-test module, sized for the whole graph (other engineers' clusters are left alone).

The object store holds the 270M policy's weights (1.1 GB) on their way to the sampler without spilling to disk,
which Ray refuses on a disk over 95% full.
"""

import pytest
import ray


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=2_500_000_000, log_to_driver=False)
    yield
    ray.shutdown()
