"""Fault injection on the real actor graph: real processes are SIGKILLed mid-round and the run recovers.

- a sampler killed while it generates: Ray restarts it, the pool re-sends its share, the round completes
  with every trajectory exactly once;
- a policy-learner rank killed while it trains: the coordinator rebuilds the learner group from the last
  checkpoint and redoes the round;
- a sampler killed between rounds: Ray restarts it before any call fails, and it refuses its next call until
  it has been sent the run's current adapter and policy.

A stopped driver and its resumed run are in ``tests/cluster/test_submit_multinode.py``, a module of its own so
that the suite runs it beside these. Actor processes are found among this test process's descendants by the title Ray
gives them (``ray::Sampler.rollout`` while a rollout runs), so other Ray instances on the machine are never
touched.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import ray
from job_fixtures import (
    ProcessTree,
    job_config,
    kill_when_running,
    processes_titled,
    tiny_policy_overrides,
)

from bridge_ray.checkpoint import load_manifest
from bridge_ray.coordinator.handle import start_coordinator
from bridge_ray.coordinator.phases import RECOVER, RETRIEVER_UPDATE, ROLLOUT, check_bilevel_order, read_phases
from bridge_ray.runtime.calls import ActorLost, get_within

pytestmark = pytest.mark.slow


@ray.remote(num_cpus=0)
class Sleeper:
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()


def test_waits_name_the_actor_on_timeout_and_on_death(local_ray):
    sleeper = Sleeper.remote()
    with pytest.raises(TimeoutError, match="sleeper 7"):
        get_within(sleeper.sleep.remote(30), 0.5, "sleeper 7")
    ray.kill(sleeper)
    with pytest.raises(ActorLost, match="sleeper 7"):
        get_within([sleeper.sleep.remote(0)], 30, "sleeper 7")


@pytest.fixture(scope="module")
def coordinator(local_ray, module_dir, tiny_policy):
    config = job_config(
        module_dir, *tiny_policy_overrides(tiny_policy),
        "run.rounds=3", "rollout.max_action_length=64", "run.call_timeout_s=300",
    )
    coordinator = start_coordinator(config)
    coordinator.ready()  # the graph is up
    yield config, coordinator
    coordinator.shutdown()


def test_sampler_killed_mid_rollout_is_restarted_and_no_trajectory_is_lost(coordinator):
    config, coordinator = coordinator
    with ThreadPoolExecutor(1) as pool:
        round_done = pool.submit(coordinator.run_round)
        killed = kill_when_running("Sampler.rollout")
        figures = round_done.result()
    assert figures["faults/samplers_revived"] == 1, f"sampler pid {killed} was killed during its rollout"
    rollout = [r for r in read_phases(Path(config.run.output_dir) / "phases.jsonl") if r.phase == ROLLOUT][-1]
    # the coordinator checked every (question, sample) came back exactly once; the counts say the same
    assert rollout.info["trajectories"] == rollout.info["questions"] * config.algorithm.grpo.rollouts_per_question
    assert coordinator.state()["policy_version"] == 1


def test_policy_rank_killed_mid_update_rolls_back_to_the_last_checkpoint(coordinator):
    config, coordinator = coordinator
    start = coordinator.state()
    assert start["round"] == 1  # round 0 completed and was checkpointed by the previous test
    # A tiny policy's update is over in less time than a poll for its process title takes: the rank is paused, so
    # round 1's update waits on it, and killed once the round has reached that update.
    ranks = processes_titled("ray::PolicyLearnerRank")
    for rank in ranks:
        rank.suspend()
    phases_file = Path(config.run.output_dir) / "phases.jsonl"
    with ThreadPoolExecutor(1) as pool:
        run_done = pool.submit(coordinator.run, 2)  # round 1; the next test runs one more after the recovery
        deadline = time.monotonic() + 300
        while (1, RETRIEVER_UPDATE) not in {(r.round, r.phase) for r in read_phases(phases_file)}:
            assert not run_done.done() and time.monotonic() < deadline, "round 1 never reached its updates"
            time.sleep(0.2)
        for rank in ranks:
            rank.kill()
        assert run_done.result() == 2
    state = coordinator.state()
    assert (state["round"], state["policy_version"]) == (2, 2)
    records = read_phases(Path(config.run.output_dir) / "phases.jsonl")
    recoveries = [r for r in records if r.phase == RECOVER]
    assert len(recoveries) == 1 and recoveries[0].info["restored_round"] == 1
    assert "policy learner ranks (train)" in recoveries[0].info["failure"]
    check_bilevel_order(records)
    rollouts = [r.round for r in records if r.phase == ROLLOUT]
    assert rollouts == [0, 1, 1], "round 1 ran, failed in its policy update, and was redone once"
    latest = Path(config.run.output_dir) / "checkpoints"
    assert load_manifest(latest / (latest / "latest").read_text().strip()).round == 2


def test_sampler_killed_between_rounds_is_restored_before_it_samples(coordinator):
    """Killed while idle (as Ray's memory monitor kills), the sampler is back from its constructor, serving the
    run's starting policy, before any call of it fails: its next rollout must not sample from that."""
    _, coordinator = coordinator
    version = coordinator.state()["policy_version"]
    killed = kill_when_running("ray::Sampler")
    deadline, tree = time.monotonic() + 180, ProcessTree()
    while not [p for p in processes_titled("ray::Sampler", tree) if p.pid != killed and _idle(p, "ray::Sampler")]:
        assert time.monotonic() < deadline, "Ray did not restart the sampler"
        time.sleep(0.2)
    figures = coordinator.run_round()
    assert figures["faults/samplers_revived"] == 1, "its rollout found it unrestored and was sent again"
    assert figures["staleness/policy"] == 0 == figures["staleness/retriever"]
    assert coordinator.state()["policy_version"] == version + 1


def _idle(proc, title: str) -> bool:
    """Whether ``proc`` is an actor's worker waiting for calls (titled ``title`` alone: constructed)."""
    try:
        return " ".join(proc.cmdline()).strip() == title
    except psutil.Error:
        return False
