"""``jobs/submit.sh`` against a Ray cluster of three nodes on this machine: a run stopped with ``ray job stop`` and
submitted again with ``--auto-resume`` continues from its last checkpoint, finishes, logs to the same W&B run, and
ends exactly where the same job run uninterrupted ends.

Three jobs of one config: an uninterrupted one, one stopped at its first checkpoint (its coordinator paused there),
and that one resubmitted with ``--auto-resume`` (and an evaluation after training). The resumed rounds must draw
what the uninterrupted ones drew (questions and sampler seeds, from the checkpoint's data cursor and RNG state),
sample the same tokens, make the same updates and end with the same weights, to the bit. The rounds are synchronous:
a resumed asynchronous round samples under a fresher policy than it would have uninterrupted, so only a synchronous
run compares bit for bit; that a checkpoint taken with batches drawn ahead records the cursor from before them is
checked in ``tests/coordinator/test_pipeline.py``.

The head (dashboard, Jobs API, the job's driver) offers no CPUs, as the cluster files' heads do; node A declares
``pool_rollout`` (samplers, shard holders), node B ``pool_learn`` (both learners). Each node is a ``ray start``
process with its own ports and temp dir (:mod:`ray_nodes`), under token authentication, and the run folder is one
folder every node sees (they share this machine's disk, as real nodes share a volume). The nodes' environment
holds the CPU and offline settings, as a real cluster's nodes hold theirs; ``jobs/submit.sh`` adds nothing to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from job_fixtures import REPO, SMALL_JOB, tiny_policy_overrides, titled
from ray_nodes import VENV_BIN, Node, head_options, job_client, start_node
from safetensors.torch import load_file

from bridge_ray.checkpoint import Manifest, load_manifest
from bridge_ray.coordinator.phases import POLICY_UPDATE, REWARD, ROLLOUT, read_phases
from bridge_ray.runtime.rendezvous import free_port
from bridge_ray.telemetry import WANDB_ID_FILE

pytestmark = pytest.mark.slow

ROUNDS = 2
POOLS = (
    'roles.sampler.resources={"pool_rollout": 1}',
    'roles.shard_holder.resources={"pool_rollout": 1}',
    'roles.retriever_learner.resources={"pool_learn": 1}',
    'roles.policy_learner.resources={"pool_learn": 1}',
)
# local_cpu's roles: a sampler (0.5 CPU) and two shard holders (0.25 each) on A, the learners (0.5 + 0.25) on B.
WORKERS = {"A": ("--num-cpus=1", '--resources={"pool_rollout": 3}'),
           "B": ("--num-cpus=1", '--resources={"pool_learn": 2}')}
OBJECT_STORE = "--object-store-memory=300000000"  # per node; the tiny policy's weights are 34 MB
# What this CPU-only, offline machine's nodes need in their environment (a GPU cluster's nodes hold their own).
# Ray's memory monitor counts the whole machine's memory, other test processes' included, and kills this cluster's
# workers when it runs short: off here, as a node of its own would not see them.
NODE_ENV = {"DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0"}
JOB_TIMEOUT_S = 480
WORKER_START_ATTEMPTS = 5


@dataclass(frozen=True)
class Cluster:
    dashboard_url: str
    token: str
    nodes: dict[str, Node]
    root: Path  # every node's temp dir is under it

    def get(self, path: str) -> dict:
        """``GET path`` on the dashboard with the token."""
        request = urllib.request.Request(self.dashboard_url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def client(self):
        return job_client(self.dashboard_url, self.token)

    def processes_titled(self, title: str) -> list[psutil.Process]:
        """The cluster's processes whose Ray title contains ``title`` (``ray::Class`` for an actor's worker)."""
        return titled([proc for node in self.nodes.values() for proc in node.processes()], title)

    def alive_nodes(self) -> list[dict]:
        return [n for n in self.get("/api/v0/nodes?limit=100")["data"]["result"]["result"] if n["state"] == "ALIVE"]


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="brmn-", dir="/tmp"))
    token = secrets.token_hex(32)
    (root / "auth_token").write_text(token)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env |= NODE_ENV | {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # the job's `python` is the venv's
                       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(root / "auth_token")}
    gcs_port, dashboard_port = free_port(), free_port()
    nodes = {"head": start_node(root / "head", env, *head_options(gcs_port, dashboard_port), "--num-cpus=0",
                                OBJECT_STORE)}
    cluster = Cluster(f"http://127.0.0.1:{dashboard_port}", token, nodes, root)
    try:
        wait_for_nodes(cluster, 1)  # a worker gives up on a head that does not answer in time
        # `ray start` gives a worker 30 s (fixed in Ray) to see itself registered; on a busy machine it can run
        # out, and the process exits: such a worker is started again, as a cluster's node provider would. One
        # worker at a time, so that two starting nodes do not slow each other past that window.
        for name, options in WORKERS.items():
            for attempt in range(WORKER_START_ATTEMPTS):
                nodes[name] = start_node(root / f"{name.lower()}{attempt}", env, f"--address=127.0.0.1:{gcs_port}",
                                         *options, OBJECT_STORE)
                if not wait_for_nodes(cluster, len(nodes), fail=attempt == WORKER_START_ATTEMPTS - 1):
                    break
                nodes.pop(name).stop()
                wait_for_nodes(cluster, len(nodes))  # until one that registered too late is marked dead as well
        yield cluster
    finally:
        for node in reversed(nodes.values()):  # the workers, then the head
            node.stop()
        left = [p.pid for node in nodes.values() for p in node.processes()]
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"processes of the cluster left running: {left}"


def wait_for_nodes(cluster: Cluster, count: int, timeout_s: float = 180, fail: bool = True) -> list[str]:
    """Until ``count`` nodes are alive; the nodes whose ``ray start`` exited, or (``fail``) a failure showing each
    node's ``ray start`` log."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if len(cluster.alive_nodes()) == count:
                return []
        exited = [name for name, node in cluster.nodes.items() if node.leader.poll() is not None]
        if exited and not fail:
            return exited
        if exited or time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}\n{node.log.read_text()[-3000:]}" for name, node in cluster.nodes.items())
            pytest.fail(f"not {count} nodes within {timeout_s}s (exited: {exited}):\n{logs}")
        time.sleep(1)


@dataclass(frozen=True)
class Submission:
    id: str
    stop: list[str]  # the stop command jobs/submit.sh prints


def submit(cluster: Cluster, *args: str) -> Submission:
    """``jobs/submit.sh --no-wait jobs/configs/local_cpu.yaml ARGS`` with the cluster's address and token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_ADDRESS": cluster.dashboard_url, "RAY_AUTH_TOKEN": cluster.token,
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"}
    done = subprocess.run(["bash", "jobs/submit.sh", "--no-wait", "jobs/configs/local_cpu.yaml", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    submission_id = re.search(r"^submission id: (\S+)$", done.stdout, re.M)
    stop = re.search(r"^  stop: +(ray job stop .*)$", done.stdout, re.M)
    assert submission_id and stop, done.stdout
    return Submission(submission_id.group(1), shlex.split(stop.group(1)))


def wait_terminal(cluster: Cluster, job: Submission):
    client = cluster.client()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (status := client.get_job_status(job.id)).is_terminal():
        if time.monotonic() > deadline:
            client.stop_job(job.id)
            pytest.fail(f"job {job.id} still {status} after {JOB_TIMEOUT_S}s:\n{client.get_job_logs(job.id)[-6000:]}")
        time.sleep(1)
    return status


@dataclass
class Run:
    """A run folder and the jobs that wrote it."""

    out: Path
    jobs: list[Submission] = field(default_factory=list)

    def train(self, tiny_policy: Path, *args: str) -> list[str]:
        return [f"run.output_dir={self.out}", *SMALL_JOB, *tiny_policy_overrides(tiny_policy), *POOLS,
                f"run.rounds={ROUNDS}", "telemetry.wandb_mode=offline", *args]

    def phases(self, name: str) -> dict[int, dict]:
        """The last record of phase ``name`` in each round: a round the stopped job left unfinished is logged
        again by the resumed one."""
        return {r.round: r.info for r in read_phases(self.out / "phases.jsonl") if r.phase == name}

    def manifest(self) -> Manifest:
        return load_manifest(self.out / "checkpoints" / (self.out / "checkpoints" / "latest").read_text().strip())


@dataclass(frozen=True)
class Runs:
    uninterrupted: Run
    resumed: Run  # the stopped job's folder, continued by a second job
    stopped_at: int  # the round of the checkpoint it continued from
    wandb_id: str  # the W&B run id the stopped job kept in its folder
    logs: dict[str, str]  # each job's driver log, by submission id


@pytest.fixture(scope="module")
def runs(cluster, tiny_policy, module_dir) -> Runs:
    from ray.job_submission import JobStatus

    client, logs = cluster.client(), {}
    uninterrupted, resumed = Run(module_dir / "uninterrupted"), Run(module_dir / "stopped")
    uninterrupted.jobs.append(submit(cluster, *uninterrupted.train(tiny_policy)))
    status = wait_terminal(cluster, uninterrupted.jobs[0])
    logs[uninterrupted.jobs[0].id] = client.get_job_logs(uninterrupted.jobs[0].id)
    assert status == JobStatus.SUCCEEDED, logs[uninterrupted.jobs[0].id][-6000:]

    started = time.monotonic()
    first = submit(cluster, *resumed.train(tiny_policy))
    resumed.jobs.append(first)
    latest = resumed.out / "checkpoints" / "latest"  # written last, by a rename
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not latest.is_file():
        status = client.get_job_status(first.id)
        if status.is_terminal() or time.monotonic() > deadline:
            client.stop_job(first.id)
            pytest.fail(f"no checkpoint while job {first.id} ran ({status}):\n{client.get_job_logs(first.id)[-6000:]}")
        time.sleep(0.2)
    # A round of the tiny policy can take less time than the stop takes to act (a fast machine finished the last
    # round before it did): the coordinator is paused between that checkpoint and its next round, so the stop
    # lands there on any machine. Ray force-kills the paused actor with its job's driver.
    coordinators = cluster.processes_titled("ray::Coordinator")
    assert coordinators, "the job's coordinator is running"
    for proc in coordinators:
        proc.suspend()
    stop_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token}
    stopped = subprocess.run(first.stop, env=stop_env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert wait_terminal(cluster, first) == JobStatus.STOPPED
    for proc in coordinators:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()
    stopped_at = resumed.manifest().round
    wandb_id = (resumed.out / WANDB_ID_FILE).read_text().strip()
    print(f"\njob {first.id} stopped after {time.monotonic() - started:.0f}s at round {stopped_at}")

    # evaluates after training too: the coordinator's evaluation over the samplers
    second = submit(cluster, *resumed.train(tiny_policy, "eval.after_training=true"), "--auto-resume")
    resumed.jobs.append(second)
    status = wait_terminal(cluster, second)
    logs[second.id] = client.get_job_logs(second.id)
    assert status == JobStatus.SUCCEEDED, logs[second.id][-6000:]
    return Runs(uninterrupted, resumed, stopped_at, wandb_id, logs)


def test_a_stopped_run_resubmitted_with_auto_resume_continues_from_its_checkpoint(runs, cluster):
    out, logs = runs.resumed.out, runs.logs[runs.resumed.jobs[1].id]
    assert runs.stopped_at == 1, "stopped at its first checkpoint, paused there"
    assert f"resuming from {out / 'checkpoints' / f'round-{runs.stopped_at:08d}'}" in logs, logs[-6000:]
    first_round = re.search(rf"\[round (\d+)/{ROUNDS}", logs)
    assert first_round and int(first_round.group(1)) == runs.stopped_at, "the resumed run started at the checkpoint"
    assert f"done: {ROUNDS} rounds, policy v{ROUNDS}" in logs
    rollouts = [r.round for r in read_phases(out / "phases.jsonl") if r.phase == ROLLOUT]
    assert rollouts[-(ROUNDS - runs.stopped_at):] == list(range(runs.stopped_at, ROUNDS))

    # one W&B run: the kept id, and both submissions' offline runs under it
    assert (out / WANDB_ID_FILE).read_text().strip() == runs.wandb_id
    wandb_runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and all(name.endswith(f"-{runs.wandb_id}") for name in wandb_runs), wandb_runs

    # the roles ran on the workers of their pools, the driver on the head
    node_of = {n["node_id"]: name for n in cluster.alive_nodes()
               for name, key in (("head", "node:__internal_head__"), ("A", "pool_rollout"), ("B", "pool_learn"))
               if key in n["resources_total"]}
    actors = cluster.get("/api/v0/actors?limit=1000&detail=true")["data"]["result"]["result"]
    placed = {(a["name"], node_of.get(a["node_id"])) for a in actors if a.get("name")}
    assert {("sampler-0", "A"), ("shard-holder-0", "A"), ("shard-holder-1", "A"), ("policy-learner-0", "B"),
            ("retriever-learner-0", "B")} <= placed, placed


def test_every_round_samples_from_new_seeds(runs):
    rollouts = runs.uninterrupted.phases(ROLLOUT)
    assert sorted(rollouts) == list(range(ROUNDS))
    for key in ("sampler_seeds", "sample_digest"):
        drawn = [json.dumps(rollouts[r][key]) for r in range(ROUNDS)]
        assert len(set(drawn)) == ROUNDS, f"{key}: {drawn}"


def test_the_resumed_rounds_draw_sample_and_update_like_the_uninterrupted_ones(runs):
    uninterrupted, resumed = runs.uninterrupted, runs.resumed
    for round_index in range(runs.stopped_at, ROUNDS):
        drawn, redrawn = uninterrupted.phases(ROLLOUT)[round_index], resumed.phases(ROLLOUT)[round_index]
        for key in ("question_ids", "sampler_seeds", "sample_digest"):  # the digest: the same tokens sampled
            assert drawn[key] == redrawn[key], f"round {round_index}, {key}"
        for name in (REWARD, POLICY_UPDATE):
            assert uninterrupted.phases(name)[round_index] == resumed.phases(name)[round_index], \
                f"round {round_index}, {name}"


def test_the_resumed_run_ends_in_the_uninterrupted_runs_state(runs):
    # The learner restored from the checkpoint (weights, optimizer state, step count) updates like the one that
    # ran on: the same policy after the last round, to the bit.
    weights = [load_file(run.out / f"checkpoints/round-{ROUNDS:08d}/policy/model.safetensors")
               for run in (runs.uninterrupted, runs.resumed)]
    assert weights[0].keys() == weights[1].keys()
    assert all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    final, expected = runs.resumed.manifest(), runs.uninterrupted.manifest()
    assert (final.round, final.policy_version) == (ROUNDS, ROUNDS)
    assert (final.round, final.policy_version, final.data_cursor) == \
        (expected.round, expected.policy_version, expected.data_cursor)


def test_the_resumed_run_evaluates_after_training(runs):
    out = runs.resumed.out
    assert "## eval after" in runs.logs[runs.resumed.jobs[1].id]
    assert "| world | 2 |" in (out / "eval_after.md").read_text()
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["label"], e["round"], e["policy_version"]) for e in evals] == [("after", ROUNDS, ROUNDS)]
    assert evals[0]["table"] == json.loads((out / "eval_after.json").read_text())


def test_every_reward_phase_logs_its_diagnostics(runs):
    diagnostics = {"reward", "reward_positive", "zero_variance_groups", "answered", "invalid_action_rate",
                   "truncated", "searches_per_trajectory", "response_tokens", "gold_recall"}
    for run in (runs.uninterrupted, runs.resumed):
        rewards = [r.info for r in read_phases(run.out / "phases.jsonl") if r.phase == REWARD]
        assert rewards, run.out
        for reward in rewards:
            assert diagnostics <= reward.keys()
            assert ("warning" in reward) == (reward["zero_variance_groups"] == 1)


def test_the_jobs_that_ran_to_the_end_logged_no_traceback_nor_rays_e_line(runs, cluster):
    """Their drivers' logs, and the logs of the workers that ran their actors on every node; not the stopped
    job's, whose driver and actors were killed."""
    client = cluster.client()
    for job in (runs.uninterrupted.jobs[0], runs.resumed.jobs[1]):
        ray_job = client.get_job_info(job.id).job_id
        streams = {f"driver of {job.id}": runs.logs[job.id]}
        streams |= {str(p): p.read_text(errors="replace")
                    for p in cluster.root.glob(f"*/session_*/logs/worker-*-{ray_job}-*")}
        assert len(streams) > 1, f"no worker logs of job {ray_job} under {cluster.root}"
        for where, text in streams.items():
            assert "Traceback" not in text and "Exception ignored" not in text, f"{where}:\n{text[-3000:]}"
            # Ray's E line about restartable actors (the samplers) given actor handles: they are given names
            assert "constructor arguments in the object store" not in text, f"{where}:\n{text[-3000:]}"
