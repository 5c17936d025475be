"""ActorGroup: actors named by role and index in a namespace per group, found again by name, and no Ray ``E``
line about restartable actors' arguments when a group is given another group's names instead of its handles;
the coordinator named likewise; a shutdown that returns only once the actors' processes have exited; a call whose
actor died sent again and reported, with its refs named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest
import ray
from ray import cloudpickle
from ray._private.state import actors

from bridge_ray.config import load_config
from bridge_ray.coordinator.handle import start_coordinator
from bridge_ray.runtime.actor_group import ActorGroup, NamedActors, Restart, RoleSpec, wait_for_exit
from bridge_ray.runtime.calls import ActorLost, StateLost, restarted_actor

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

    def pid(self) -> int:
        return os.getpid()

    def busy(self) -> None:
        """A call that never ends by itself, as a learner rank inside ``train_on``."""
        while True:
            time.sleep(0.01)


class Reader:
    """Reads the holders it is given, by name or by handle."""

    def __init__(self, holders: NamedActors | list):
        self.holders = holders.handles() if isinstance(holders, NamedActors) else holders

    def total(self) -> int:
        return sum(ray.get([h.get.remote() for h in self.holders]))


class Pair(NamedTuple):
    value: int
    primed: bool


class Mortal:
    """Dies in the first call of :meth:`split` of its first life (a file marks that a life died)."""

    def __init__(self, marker: str):
        self.marker, self.primed = Path(marker), False

    def prime(self) -> None:
        self.primed = True

    def split(self, value: int) -> Pair:
        if not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return Pair(value=value, primed=self.primed)


class MortalTwice(Mortal):
    """Like :class:`Mortal`, and its second life dies while it is primed."""

    def prime(self) -> None:
        if not self.marker.with_suffix(".prime").exists():
            self.marker.with_suffix(".prime").touch()
            os._exit(1)
        self.primed = True


class Forgetful:
    """Refuses its calls once Ray has restarted it, until primed (as a sampler does)."""

    def __init__(self):
        self.unprimed = restarted_actor()

    def prime(self) -> None:
        self.unprimed = False

    def pid(self) -> int:
        if self.unprimed:
            raise StateLost("restarted, not primed")
        return os.getpid()


def start(role: str, actor_class: type, count: int, restart: Restart = Restart.RETRY, max_restarts: int = 1,
          **kwargs) -> ActorGroup:
    return ActorGroup.start(role, actor_class, RoleSpec(count, 0.125, max_restarts=max_restarts), restart,
                            label=role, call_timeout_s=60, startup_timeout_s=60, **kwargs)


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
        assert by_name.collect(by_name.call_all(Reader.total), "total").values == [3]
        time.sleep(1)  # Ray's log lines reach the captured stderr asynchronously
        assert RESTART_WARNING not in capfd.readouterr().err
        # the control: the same actor given the handles themselves draws the warning this test guards against
        by_handle = start("sampler", Reader, 1, Restart.RESEND, args=(holders.handles,))
        assert by_handle.collect(by_handle.call_all(Reader.total), "total").values == [3]
        time.sleep(1)
        assert RESTART_WARNING in capfd.readouterr().err
    finally:
        for group in (holders, locals().get("by_name"), locals().get("by_handle")):
            if group is not None:
                group.shutdown()


def test_call_split_deals_pieces_round_robin_in_order(local_ray):
    group = start("sampler", Holder, 2, per_actor=lambda i: {"value": i})
    try:
        calls = group.call_split(Holder.take, list(range(10)), pieces_per_actor=2)
        assert group.collect(calls, "take").values == [(0, [0, 1]), (1, [2, 3, 4]), (0, [5, 6]), (1, [7, 8, 9])]
        assert group.collect(group.call_split(Holder.take, [7]), "take").values == [(1, [7])]  # empty parts not sent
    finally:
        group.shutdown()


def test_a_role_that_reserves_nothing_is_not_placed_and_a_retry_beside_a_dead_one_is_not_refused(local_ray):
    spec = RoleSpec(1, cpus=0.0)
    first = ActorGroup.start("coordinator", Holder, spec, Restart.NONE, label="coordinator", args=(1,),
                             call_timeout_s=60, startup_timeout_s=60)
    ray.kill(first[0], no_restart=True)  # a failed run's coordinator, dead or dying, still holding its name
    second = ActorGroup.start("coordinator", Holder, spec, Restart.NONE, label="coordinator", args=(2,),
                              call_timeout_s=60, startup_timeout_s=60)  # another run, or the retry: no name clash
    try:
        assert first.placement is None and second.placement is None
        assert second.collect(second.call_all(Holder.get), "get").values == [2]
        assert [actors(actor_id=g[0]._actor_id.hex())["Name"] for g in (first, second)] == ["coordinator-0"] * 2
    finally:
        second.shutdown()


def test_the_coordinator_actor_is_named_coordinator_and_its_death_names_the_call(local_ray, tmp_path):
    (tmp_path / "a-file").write_text("x")  # run.output_dir below a file: the constructor fails at once
    config = load_config(None, [f"run.output_dir={tmp_path / 'a-file' / 'run'}"])
    handles = [start_coordinator(config) for _ in range(2)]  # two runs, or a run and its retry, on one cluster
    try:
        assert {actors(actor_id=h.group[0]._actor_id.hex())["Name"] for h in handles} == {"coordinator-0"}
        with pytest.raises(ActorLost, match=r"coordinator \(state\): actor died"):
            handles[0].state()
    finally:
        for handle in handles:
            handle.group.shutdown()


def test_shutdown_returns_once_the_processes_have_exited(local_ray):
    group = start("policy_learner", Holder, 2, Restart.NONE)
    pids = group.collect(group.call_all(Holder.pid), "pid").values
    group.call_all(Holder.busy)  # each actor is inside a call, as learner ranks inside train_on during a recovery
    group.shutdown()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_waiting_for_exit_is_bounded_and_names_the_survivors():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        stubborn.stdout.readline()  # SIGTERM is ignored from here on
        stubborn.terminate()
        assert wait_for_exit([stubborn.pid], timeout_s=0.5) == [stubborn.pid]
        os.kill(stubborn.pid, signal.SIGKILL)
        assert wait_for_exit([stubborn.pid], timeout_s=10) == [], "a zombie (not yet collected) has exited"
    finally:
        stubborn.kill()
        stubborn.wait()


def test_collect_sends_a_dead_call_again_and_reports_the_fresh_call(local_ray, tmp_path):
    group = start("sampler", Mortal, 1, Restart.RESEND, args=(str(tmp_path / "died"),))
    group.prime = lambda index: [group.call(index, Mortal.prime)]
    try:
        sent = group.call(0, Mortal.split, 7, returns=Pair)
        collected = group.collect([sent], "split")
        assert collected.values == [7] and collected.resent == {0} and group.revived == [0]
        [fresh] = collected.calls
        assert fresh.refs != sent.refs and (fresh.method, fresh.args) == (Mortal.split, (7,))
        assert ray.get(fresh.out.primed) is True  # the revived actor was primed before the call came again
    finally:
        group.shutdown()


def test_a_death_while_the_revived_actor_is_primed_is_one_more_restart(local_ray, tmp_path):
    group = start("sampler", MortalTwice, 1, Restart.RESEND, max_restarts=2, args=(str(tmp_path / "died"),))
    group.prime = lambda index: [group.call(index, MortalTwice.prime)]
    try:
        collected = group.collect([group.call(0, MortalTwice.split, 7, returns=Pair)], "split")
        assert collected.values == [7] and group.revived == [0]
        assert ray.get(collected.calls[0].out.primed) is True
    finally:
        group.shutdown()


def test_an_actor_restarted_between_calls_is_primed_before_its_next_call_is_answered(local_ray):
    """No call of it failed, so only the actor knows it lost its state: its StateLost is handled as a death."""
    group = start("sampler", Forgetful, 1, Restart.RESEND)
    group.prime = lambda index: [group.call(index, Forgetful.prime)]
    try:
        [first] = group.collect([group.call(0, Forgetful.pid)], "pid").values
        ray.kill(group.handles[0], no_restart=False)  # dies idle; Ray restarts it
        # ray.kill only asks: until the old process has gone, the old actor may still answer (or refuse as restarted)
        assert wait_for_exit([first], timeout_s=60) == []
        deadline = time.monotonic() + 60
        while True:  # until the restarted actor has run its constructor and takes calls
            try:
                ray.get(group.handles[0].__ray_ready__.remote(), timeout=5)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):  # restarting: on a busy machine
                # its constructor can take longer than one wait
                assert time.monotonic() < deadline
                time.sleep(0.2)
        sent = group.call(0, Forgetful.pid)
        collected = group.collect([sent], "pid")
        with pytest.raises(StateLost):
            ray.get(sent.result)
        assert collected.values[0] != first and collected.resent == {0} and group.revived == [0]
    finally:
        group.shutdown()
