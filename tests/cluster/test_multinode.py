"""The whole graph on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): node pools pin the
roles, the refs of a round cross between nodes, a graph larger than the cluster waits for the node it lacks, and
``cluster-check`` reports where the roles landed and the bytes each phase moved.

The head holds no role's resources; node A declares ``pool_rollout`` (samplers, shard holders), node B
``pool_learn`` (both learners), as two KubeRay worker groups would. The module starts without node B: a run
past ``run.autoscale_timeout_s`` fails naming the learners, then a run waits, node B joins, and two real
rounds of the tiny policy run; ``cluster-check`` then runs one round of the protocol policy, which searches. Last,
node B is lost in the middle of a round's policy update and a replacement joins: the run rolls back, redoes the
round and ends where the run that waited, the same config uninterrupted, ended.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from job_fixtures import LOCAL_CPU, REPO, SMALL_JOB, processes_titled, tiny_policy_overrides
from ray._private.state import actors
from ray.cluster_utils import Cluster
from safetensors.torch import load_file

from bridge_ray.checkpoint import POLICY_DIR, RETRIEVER_ADAPTER_DIR
from bridge_ray.cli import main
from bridge_ray.coordinator.phases import POLICY_UPDATE, RECOVER, RETRIEVER_UPDATE, ROLLOUT, SYNC, read_phases

pytestmark = pytest.mark.slow

POOLS = (
    'roles.sampler.resources={"pool_rollout": 1}',
    'roles.shard_holder.resources={"pool_rollout": 1}',
    'roles.retriever_learner.resources={"pool_learn": 1}',
    'roles.policy_learner.resources={"pool_learn": 1}',
)
# local_cpu's roles: a sampler (0.5 CPU) and two shard holders (0.25 each) on A, the learners (0.5 + 0.25) on B.
NODE_A = {"num_cpus": 1, "resources": {"pool_rollout": 3}}
NODE_B = {"num_cpus": 1, "resources": {"pool_learn": 2}}
OBJECT_STORE = 300_000_000  # per node; the tiny policy's weights are 34 MB
# How long after the GCS marks node B dead its replacement joins: past the rollback's teardown of the dead learners
# (at most 10 s waiting for their placement groups' bundles), so that the rebuild finds no node that can hold them
# and waits for one, as it does for an autoscaler (run.autoscale_timeout_s).
NODE_REPLACED_AFTER_S = 15.0
JOB_TIMEOUT_S = 900  # two rounds take about a minute on an idle 2-core machine; the suite's other modules share it
# The run that waits for node B and the run that loses it: the same rounds and checkpoints, so that the first is the
# uninterrupted reference the second must end equal to.
RUN = ("run.rounds=2", "checkpoint.every_rounds=1", "checkpoint.keep=2", "run.autoscale_timeout_s=300")


@pytest.fixture(scope="module")
def uninterrupted() -> dict[str, Path]:
    """The output folder of the run that waited for node B, once it has ended (the lost node's reference)."""
    return {}


@pytest.fixture(scope="module")
def cluster():
    """Head and node A; node B is added by the test that waits for it."""
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as mp:  # the nodes' workers import this checkout
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        mp.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
        # Ray's memory monitor counts the whole machine's memory: other test processes on it would get this
        # module's learner killed (OutOfMemoryError at 90% used, none of it ours)
        mp.setenv("RAY_memory_monitor_refresh_ms", "0")
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "object_store_memory": OBJECT_STORE})
        nodes = {"A": cluster.add_node(**NODE_A, object_store_memory=OBJECT_STORE)}
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, nodes
        ray.shutdown()
        cluster.shutdown()


def node_ids(cluster_nodes: dict) -> dict[str, str]:
    return {name: node.node_id for name, node in cluster_nodes.items()}


def train_args(out: Path, tiny_policy: Path, *overrides: str) -> list[str]:
    return ["train", "--config", str(LOCAL_CPU), f"run.output_dir={out}", *SMALL_JOB,
            *tiny_policy_overrides(tiny_policy), *POOLS, *overrides]


def new_actors(before: set[str]) -> dict[str, dict]:
    """The actors started since ``before`` (ids), by name (``sampler-0``, ``policy-learner-0``, ``coordinator``)."""
    return {a["Name"]: a for actor_id, a in actors().items() if actor_id not in before and a.get("Name")}


def test_past_the_autoscale_timeout_the_run_names_the_roles_and_what_they_miss(cluster, tiny_policy, tmp_path,
                                                                               capsys):
    out = tmp_path / "run"
    rc = main(train_args(out, tiny_policy, "run.autoscale_timeout_s=2"))
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(errors) == 2, captured.err  # the two learners, each on one line
    for role, line in zip(("policy_learner", "retriever_learner"), errors, strict=True):
        assert f"role {role!r}" in line and "missing pool_learn 1" in line, line
        assert "still missing after run.autoscale_timeout_s=2s" in line, line
    assert "waiting up to 2s (run.autoscale_timeout_s) for nodes: role 'policy_learner'" in captured.out
    assert not out.exists(), "nothing left behind"
    assert not [name for name in os.listdir(tmp_path) if name != "run"]


def test_the_run_waits_for_the_learner_node_then_trains_across_nodes(cluster, tiny_policy, module_dir, capsys,
                                                                     uninterrupted):
    head, nodes = cluster
    # in the module's folder, not the test's (removed when it passes): the lost node's test compares with it
    out, result, before = module_dir / "waited", {}, set(actors())
    args = train_args(out, tiny_policy, *RUN)
    driver = threading.Thread(target=lambda: result.setdefault("rc", main(args)))
    driver.start()
    printed, deadline = "", time.monotonic() + 120
    while "waiting up to 300s" not in printed and driver.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        printed += capsys.readouterr().out
    assert "waiting up to 300s (run.autoscale_timeout_s) for nodes: role 'policy_learner'" in printed, printed
    assert "role 'retriever_learner'" in printed and "missing pool_learn 1" in printed, printed
    time.sleep(1.0)
    assert driver.is_alive(), "the run waits for the node instead of failing"
    nodes["B"] = head.add_node(**NODE_B, object_store_memory=OBJECT_STORE)
    driver.join(JOB_TIMEOUT_S)
    printed += capsys.readouterr().out
    assert result.get("rc") == 0, printed[-3000:]
    assert "done: 2 rounds, policy v2" in printed
    uninterrupted["run"] = out

    ids, started = node_ids(nodes), new_actors(before)
    where = {name: actor["Address"]["NodeID"] for name, actor in started.items()}
    assert where["sampler-0"] == ids["A"] and where["shard-holder-0"] == where["shard-holder-1"] == ids["A"]
    assert where["policy-learner-0"] == where["retriever-learner-0"] == ids["B"]
    # the round's refs crossed: trajectories from A to the policy learner on B, weights from B to the sampler on A
    records = read_phases(out / "phases.jsonl")
    assert {(r.round, r.phase) for r in records} >= {(0, POLICY_UPDATE), (0, SYNC), (1, POLICY_UPDATE), (1, SYNC)}
    assert [r.policy_version for r in records if r.phase == SYNC] == [1, 2], "the samplers on A got each version"
    assert (out / "checkpoints" / "latest").is_file()


def test_cluster_check_reports_the_roles_nodes_and_the_bytes_between_them(cluster, protocol_policy, tmp_path,
                                                                          capsys):
    head, nodes = cluster
    if "B" not in nodes:  # run alone (-k), without the test that waits for it
        nodes["B"] = head.add_node(**NODE_B, object_store_memory=OBJECT_STORE)
    report_file = tmp_path / "check.json"
    scratch_before = set(Path(tempfile.gettempdir()).glob("bridge-ray-cluster-check-*"))
    rc = main(["cluster-check", "--config", str(LOCAL_CPU), "--out", str(report_file), f"run.output_dir={tmp_path}",
               *SMALL_JOB, f"policy.model={protocol_policy}", "algorithm.grpo.kl_coef=0.0",
               "learner.lora.enabled=true", "algorithm.grpo.rollouts_per_question=4", *POOLS])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, printed[-3000:] + captured.err[-3000:]
    print(printed)  # the docs quote it (pytest -s)
    report, ids = json.loads(report_file.read_text()), node_ids(nodes)
    assert report["healthy"] and "cluster-check: healthy" in printed
    placed = {role: {a["node_id"] for a in r["actors"]} for role, r in report["roles"].items()}
    assert placed == {"shard_holder": {ids["A"]}, "sampler": {ids["A"]}, "policy_learner": {ids["B"]},
                      "retriever_learner": {ids["B"]}}
    assert report["roles"]["sampler"]["bundle"] == {"CPU": 0.5, "pool_rollout": 1.0}
    moved = report["bytes_between_nodes"]
    # the samplers search and score beside the shard holders: nothing of theirs crosses
    assert moved["rollout"] == moved["score"] == 0
    routes = {(c["phase"], c["source"], c["target"]) for c in report["crossings"]}
    assert report["retriever_turns"] > 0, "the protocol policy searches"
    assert {("retriever_update", ids["A"], ids["B"]), ("retriever_update", ids["B"], ids["A"])} <= routes, \
        "the trajectories and answer scores to the retriever learner on B, its adapter back to the sampler on A"
    # the policy learner on B reads the trajectories that the retriever update already brought there
    assert moved["policy_update"] == 0 and moved["retriever_update"] > 0
    assert ("sync", ids["B"], ids["A"]) in routes and moved["sync"] > 0, "the policy's LoRA to the sampler on A"
    assert all(c["bytes"] > 0 for c in report["crossings"])
    assert "  retriever_update" in printed and f"{ids['B'][:8]} -> {ids['A'][:8]}" in printed
    assert set(Path(tempfile.gettempdir()).glob("bridge-ray-cluster-check-*")) == scratch_before, "scratch removed"


def add_learner_node(head: Cluster, nodes: dict) -> None:
    """Node B, as the autoscaler adds it for the learners' pool."""
    nodes["B"] = head.add_node(**NODE_B, object_store_memory=OBJECT_STORE)


def rounds_logged(out: Path, phase: str) -> list[int]:
    path = out / "phases.jsonl"
    return [r.round for r in read_phases(path) if r.phase == phase] if path.is_file() else []


def checkpoint_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the policy and the retriever adapter that ``checkpoint`` holds, by file and name."""
    files = sorted([*(checkpoint / POLICY_DIR).glob("*.safetensors"),
                    *(checkpoint / RETRIEVER_ADAPTER_DIR).glob("*.safetensors")])
    return {f"{f.relative_to(checkpoint)}:{name}": t for f in files for name, t in load_file(f).items()}


def test_a_learner_node_lost_mid_update_is_replaced_and_the_run_ends_as_if_it_had_not_been(cluster, tiny_policy,
                                                                                          tmp_path, capsys,
                                                                                          uninterrupted):
    """Node B dies (raylet and every process on it) during round 1's policy update, and a node with its resources
    joins: the learners' deaths roll the run back to the checkpoint after round 0, the learners restart on the new
    node, round 1 is redone from the same questions and seeds, and the final policy and adapter equal an
    uninterrupted run's to the bit."""
    head, nodes = cluster
    if "B" not in nodes:  # run alone (-k)
        add_learner_node(head, nodes)
    out, result, before = tmp_path / "lost", {}, set(actors())
    driver = threading.Thread(target=lambda: result.setdefault("rc", main(train_args(out, tiny_policy, *RUN))))
    driver.start()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    # A tiny policy's update is over in less time than a poll for its process title takes: the learner ranks are
    # paused from round 0's checkpoint on, so round 1's update waits on them until node B is lost.
    latest = out / "checkpoints" / "latest"  # written last, by a rename
    while not (latest.is_file() and latest.read_text().strip() == "round-00000001"):
        assert driver.is_alive() and time.monotonic() < deadline, capsys.readouterr().out[-3000:]
        time.sleep(0.05)
    ranks = processes_titled("ray::PolicyLearnerRank")
    for rank in ranks:
        rank.suspend()
    while 1 not in rounds_logged(out, RETRIEVER_UPDATE):  # then round 1 calls the paused ranks' update
        assert driver.is_alive() and time.monotonic() < deadline, capsys.readouterr().out[-3000:]
        time.sleep(0.2)
    lost = nodes.pop("B")
    head.remove_node(lost, allow_graceful=False)
    for rank in ranks:  # a paused process cannot see its raylet die: it dies with the node's other processes
        rank.kill()
    while any(n["NodeID"] == lost.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "the GCS never marked node B dead"
        time.sleep(0.2)
    time.sleep(NODE_REPLACED_AFTER_S)  # the rollback now waits for a node that can hold the learners
    add_learner_node(head, nodes)
    driver.join(JOB_TIMEOUT_S)
    printed = capsys.readouterr().out
    assert result.get("rc") == 0, printed[-3000:]
    assert "done: 2 rounds, policy v2" in printed, printed[-3000:]

    records = read_phases(out / "phases.jsonl")
    [recovery] = [r for r in records if r.phase == RECOVER]
    assert recovery.round == 1 and recovery.info["restored_round"] == 1, recovery
    assert "policy learner ranks (train): actor died" in recovery.info["failure"], recovery
    assert [r.round for r in records if r.phase == ROLLOUT] == [0, 1, 1], "round 1 lost its learners, redone once"
    assert [r.round for r in records if r.phase == POLICY_UPDATE] == [0, 1], "the lost update never logged"
    first, redone = [r.info for r in records if (r.round, r.phase) == (1, ROLLOUT)]
    for key in ("question_ids", "sampler_seeds", "sample_digest"):
        assert first[key] == redone[key], key
    group = 2  # SMALL_JOB: algorithm.grpo.rollouts_per_question
    assert all(r.info["trajectories"] == r.info["questions"] * group == 2 * group
               for r in records if r.phase == ROLLOUT), "every trajectory of every round, the redone one's too"

    learners = [(a["Name"], a["State"], a["Address"]["NodeID"]) for actor_id, a in actors().items()
                if actor_id not in before and a.get("Name") in ("policy-learner-0", "retriever-learner-0")]
    assert sorted(learners) == sorted([
        ("policy-learner-0", "DEAD", lost.node_id), ("retriever-learner-0", "DEAD", lost.node_id),
        ("policy-learner-0", "DEAD", nodes["B"].node_id), ("retriever-learner-0", "DEAD", nodes["B"].node_id),
    ]), "each learner died with node B, restarted on its replacement and ended with the run"
    [coordinator] = [a for i, a in actors().items() if i not in before and a.get("Name") == "coordinator-0"]
    assert coordinator["Address"]["NodeID"] == head.head_node.node_id, "on the driver's node, which no loss takes"

    reference = uninterrupted.get("run")
    if reference is None:  # run alone (-k), without the run that waited for node B
        reference = tmp_path / "uninterrupted"
        assert main(train_args(reference, tiny_policy, *RUN)) == 0
    final = [checkpoint_tensors(run / "checkpoints" / "round-00000002") for run in (out, reference)]
    assert final[0].keys() == final[1].keys() and any(RETRIEVER_ADAPTER_DIR in k for k in final[0])
    assert [k for k in final[0] if not torch.equal(final[0][k], final[1][k])] == []
