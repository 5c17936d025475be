"""ActorGroup: actors named by role and index in a namespace per group, found again by name, and no Ray ``E``
line about restartable actors' arguments when a group is given another group's names instead of its handles."""

from __future__ import annotations

import sys
import time

import pytest
import ray
from ray import cloudpickle

from bridge_ray.runtime.actor_group import ActorGroup, NamedActors, Restart, RoleSpec

pytestmark = pytest.mark.slow

RAY_CPUS = 2
RESTART_WARNING = "has constructor arguments in the object store and max_restarts > 0"
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module


class Holder:
    def __init__(self, value: int = 0):
        self.value = value

    def get(self) -> int:
        return self.value

    def take(self, part: list[int]) -> tuple[int, list[int]]:
        return self.value, part


class Reader:
    """Reads the holders it is given, by name or by handle."""

    def __init__(self, holders: NamedActors | list):
        self.holders = holders.handles() if isinstance(holders, NamedActors) else holders

    def total(self) -> int:
        return sum(ray.get([h.get.remote() for h in self.holders]))


def start(role: str, actor_class: type, count: int, restart: Restart = Restart.RETRY, **kwargs) -> ActorGroup:
    return ActorGroup.start(role, actor_class, RoleSpec(count, 0.125, max_restarts=1), restart, label=role,
                            call_timeout_s=60, startup_timeout_s=60, **kwargs)


def test_actors_are_named_by_role_and_index_and_two_graphs_do_not_clash(local_ray):
    groups = [start("shard_holder", Holder, 2, per_actor=lambda i, k=k: {"value": 10 * k + i}) for k in range(2)]
    try:
        first, second = (group.named() for group in groups)
        assert first.names == second.names == ("shard-holder-0", "shard-holder-1")
        assert first.namespace != second.namespace and first.namespace.startswith("bridge-ray-shard-holder-")
        for group, named in zip(groups, (first, second), strict=True):
            assert [h._actor_id for h in named.handles()] == [h._actor_id for h in group.handles]
        assert ray.get([h.get.remote() for h in second.handles()]) == [10, 11]
    finally:
        for group in groups:
            group.shutdown()


def test_restartable_actors_given_names_start_without_rays_warning(local_ray, capfd):
    holders = start("shard_holder", Holder, 2, per_actor=lambda i: {"value": i + 1})
    try:
        capfd.readouterr()
        by_name = start("sampler", Reader, 1, Restart.RESEND, args=(holders.named(),))
        assert by_name.collect(by_name.call_all("total"), "total") == [3]
        time.sleep(1)  # Ray's log lines reach the captured stderr asynchronously
        assert RESTART_WARNING not in capfd.readouterr().err
        # the control: the same actor given the handles themselves draws the warning this test guards against
        by_handle = start("sampler", Reader, 1, Restart.RESEND, args=(holders.handles,))
        assert by_handle.collect(by_handle.call_all("total"), "total") == [3]
        time.sleep(1)
        assert RESTART_WARNING in capfd.readouterr().err
    finally:
        for group in (holders, locals().get("by_name"), locals().get("by_handle")):
            if group is not None:
                group.shutdown()


def test_call_split_deals_pieces_round_robin_in_order(local_ray):
    group = start("sampler", Holder, 2, per_actor=lambda i: {"value": i})
    try:
        calls = group.call_split("take", list(range(10)), pieces_per_actor=2)
        assert group.collect(calls, "take") == [(0, [0, 1]), (1, [2, 3, 4]), (0, [5, 6]), (1, [7, 8, 9])]
        assert group.collect(group.call_split("take", [7]), "take") == [(1, [7])]  # empty parts are not sent
    finally:
        group.shutdown()
