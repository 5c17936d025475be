import time

import pytest
import ray

from bridge_ray.runtime.placement import PlacementError, bundle, place_role, role_device

pytestmark = pytest.mark.slow

RAY_CPUS = 2  # the cluster the placement figures below are computed for


@ray.remote
def where() -> tuple[str, str]:
    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_placement_group_id()


def test_bundles_drop_zero_amounts():
    assert bundle(0.5) == {"CPU": 0.5} and bundle(1, 2) == {"CPU": 1, "GPU": 2}


def test_fractional_bundles_fit_two_cores_and_ranks_follow_node_order(local_ray):
    placement = place_role("samplers", [bundle(0.25)] * 4, timeout_s=30, timeout_key="t")
    try:
        assert sorted(placement.bundle_indices) == [0, 1, 2, 3]
        assert list(placement.node_ids) == sorted(placement.node_ids)
        tasks = [where.options(num_cpus=0.25, scheduling_strategy=placement.strategy(r)) for r in range(4)]
        found = ray.get([task.remote() for task in tasks])
        assert [node for node, _ in found] == list(placement.node_ids)
        assert {group for _, group in found} == {placement.group.id.hex()}
    finally:
        placement.remove()


def test_demand_beyond_the_cluster_fails_at_once_naming_role_and_shortfall(local_ray):
    start = time.monotonic()
    expected = r"role 'policy_learner' needs 2 bundle\(s\) of \{CPU 1, GPU 1\}.*GPU 0 free: missing .*GPU 2"
    with pytest.raises(PlacementError, match=expected):
        place_role("policy_learner", [bundle(1, 1)] * 2, timeout_s=60, timeout_key="t")
    with pytest.raises(PlacementError, match=r"role 'shards' needs 2 bundle\(s\) of \{CPU 1.5\} \(total CPU 3\)"):
        place_role("shards", [bundle(1.5)] * 2, timeout_s=60, timeout_key="t")
    assert time.monotonic() - start < 5, "must not wait for resources that do not exist"


def test_resources_held_by_another_role_fail_after_a_short_grace(local_ray):
    holder = place_role("holder", [bundle(1.5)], timeout_s=30, timeout_key="t")
    try:
        start = time.monotonic()
        with pytest.raises(PlacementError, match=r"role 'late'.*CPU 0.5 free: missing CPU 0.5"):
            place_role("late", [bundle(1)], timeout_s=1, timeout_key="t")
        assert time.monotonic() - start < 5
    finally:
        holder.remove()


def test_an_unplaceable_group_times_out_with_a_message_and_is_released(local_ray):
    total = ray.cluster_resources()["CPU"]
    with pytest.raises(PlacementError, match=r"role 'spread'.*not ready within t=1s"):
        place_role("spread", [bundle(0.5)] * 2, timeout_s=1, timeout_key="t", strategy="STRICT_SPREAD")  # one node only
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU") != total and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == total, "the timed-out group must not keep its bundles"



@ray.remote(num_gpus=0)
class _Role:
    def device(self) -> str:
        return role_device()


def test_a_role_without_a_gpu_computes_on_the_cpu(local_ray):
    assert ray.get(_Role.remote().device.remote()) == "cpu"
    assert role_device() == "auto", "outside an actor the encoder picks its device itself"


@ray.remote(num_cpus=0)
def _visible_gpus() -> str | None:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_the_jobs_environment_hides_gpus_from_a_worker_that_reserved_none(local_ray):
    """Ray 2.60 leaves ``CUDA_VISIBLE_DEVICES`` alone in a worker without GPUs; the job's runtime environment makes
    Ray set it empty again (so a coordinator never opens a CUDA context on a learner's device)."""
    from bridge_ray.runtime.placement import HIDE_UNRESERVED_GPUS

    assert ray.get(_visible_gpus.options(runtime_env=HIDE_UNRESERVED_GPUS).remote()) == ""


def test_every_ray_the_package_starts_hides_unreserved_gpus(monkeypatch):
    """The hiding :func:`role_device` relies on is set where Ray is started (runtime's ``init_ray``), not by a
    caller above: a job, a bench or a test that starts Ray through it gets it alike."""
    from bridge_ray.runtime.auth import init_ray
    from bridge_ray.runtime.placement import HIDE_UNRESERVED_GPUS

    seen: dict = {}
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    init_ray(None, log_to_driver=False)
    assert seen == {"address": None, "log_to_driver": False, "runtime_env": HIDE_UNRESERVED_GPUS}
    assert HIDE_UNRESERVED_GPUS == {"env_vars": {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}}
