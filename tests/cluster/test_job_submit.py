"""`ray job submit` end to end on a Ray head of our own, and the bridge-ray gauges on its Prometheus endpoint.

The head runs in its own session with its own ports, temp dir and auth token (:mod:`ray_nodes`), so other Ray
instances on the machine are neither joined nor stopped (``ray stop`` would stop them all). Token authentication
is on, as Ray 2.60 turns it on by default where a token exists, so the client sends the token as a user's would.
A one-round job with the tiny policy goes through the Jobs API with ``jobs/runtime_env.yaml``; the CPU and
offline settings reach it only through the runtime env's ``env_vars``, so the file is exercised, not bypassed.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from job_fixtures import REPO, SMALL_JOB, tiny_policy_overrides
from ray_nodes import VENV_BIN, head_options, job_client, start_node

from bridge_ray.runtime.rendezvous import free_port

pytestmark = pytest.mark.slow

# Settings the job needs on this CPU-only, offline machine; the head's own environment goes without them.
JOB_ENV = {"DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Gauges the coordinator's telemetry sets every round (bridge_ray.telemetry: "bridge_ray_" + key, non-alnum → _);
# Ray's Prometheus exporter prefixes application metrics with its namespace, "ray_".
EXPECTED_GAUGES = (
    "bridge_ray_reward",
    "bridge_ray_time_rollout",
    "bridge_ray_time_round",
    "bridge_ray_policy_version",
    "bridge_ray_retriever_version",
    "bridge_ray_staleness_policy",
    "bridge_ray_staleness_retriever",
    "bridge_ray_throughput_tokens_per_s",
)
JOB_TIMEOUT_S = 420


@dataclass(frozen=True)
class Head:
    dashboard_url: str
    metrics_url: str
    token: str

    def client(self):
        return job_client(self.dashboard_url, self.token)


@pytest.fixture(scope="module")
def ray_head():
    temp_dir = Path(tempfile.mkdtemp(prefix="brjob-", dir="/tmp"))  # short: Ray's socket paths live under it
    dashboard_port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in JOB_ENV and k != "RAY_ADDRESS"}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is the venv's
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    token = secrets.token_hex(32)
    (temp_dir / "auth_token").write_text(token)
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(temp_dir / "auth_token")}
    env.pop("RAY_AUTH_TOKEN", None)
    # Workers export metrics every second (default 10 s) and a gauge lives 2 intervals after its process exits:
    # a one-round job sets its gauges seconds before it ends.
    env["RAY_metrics_report_interval_ms"] = "1000"
    node = start_node(temp_dir, env, *head_options(free_port(), dashboard_port), "--num-cpus=4",
                      "--object-store-memory=800000000", metrics_port=metrics_port)
    head = Head(f"http://127.0.0.1:{dashboard_port}", f"http://127.0.0.1:{metrics_port}/metrics", token)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                head.client()  # checks the connection and the version, with the token
                break
            except ConnectionError as error:
                if node.leader.poll() is not None or time.monotonic() > deadline:
                    log_tail = node.log.read_text()[-4000:]
                    pytest.fail(f"the Ray head did not come up ({error}):\n{log_tail}")
                time.sleep(1)
        yield head
    finally:
        node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def bridge_gauges(metrics_text: str) -> dict[str, str]:
    """Gauge name (``bridge_ray_...``) → a Prometheus sample line that exports it, whatever the prefix."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^(?:\w+_)?(bridge_ray_\w+)[{ ].*$", metrics_text, re.M)}


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def job_runtime_env() -> dict:
    """jobs/runtime_env.yaml plus the working dir and what this machine needs (CPU, offline, the cache)."""
    runtime_env = yaml.safe_load((REPO / "jobs/runtime_env.yaml").read_text())
    runtime_env["working_dir"] = str(REPO)
    runtime_env["env_vars"] = {**runtime_env["env_vars"], **JOB_ENV}
    if "BRIDGE_RAY_CACHE" in os.environ:
        runtime_env["env_vars"]["BRIDGE_RAY_CACHE"] = os.environ["BRIDGE_RAY_CACHE"]
    return runtime_env


def test_one_round_job_through_the_jobs_api_exports_gauges(ray_head, tiny_policy, tmp_path):
    from ray.job_submission import JobStatus

    out = tmp_path / "run"
    overrides = [
        f"run.output_dir={out}", *SMALL_JOB, *tiny_policy_overrides(tiny_policy),
        "run.rounds=1", "telemetry.ray_metrics=true", "telemetry.wandb_mode=disabled",
    ]
    client = ray_head.client()
    job_id = client.submit_job(
        # --auto-resume on a fresh run directory: starts from scratch (the driver-kill test resumes with it)
        entrypoint="python -m bridge_ray train --config jobs/configs/local_cpu.yaml --auto-resume "
        + shlex.join(overrides),
        runtime_env=job_runtime_env(),
    )
    # Scrape while the job runs: the gauges leave the endpoint soon after the coordinator's process exits.
    seen: dict[str, str] = {}
    started = time.monotonic()
    deadline = started + JOB_TIMEOUT_S
    while not (status := client.get_job_status(job_id)).is_terminal():
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            pytest.fail(f"job {job_id} still {status} after {JOB_TIMEOUT_S}s:\n{client.get_job_logs(job_id)[-6000:]}")
        seen |= bridge_gauges(scrape(ray_head.metrics_url))
        time.sleep(0.5)
    print(f"\njob {job_id}: {status} after {time.monotonic() - started:.0f}s")
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{logs[-6000:]}"

    assert "done: 1 rounds" in logs
    checkpoint = out / "checkpoints" / "round-00000001"
    assert (checkpoint / "manifest.json").is_file() and (checkpoint / "config.yaml").is_file()
    assert (out / "checkpoints" / "latest").read_text().strip() == "round-00000001"
    assert (out / "phases.jsonl").read_text().strip()

    missing = [name for name in EXPECTED_GAUGES if name not in seen]
    assert not missing, f"gauges {missing} never appeared on {ray_head.metrics_url}; seen: {sorted(seen)}"
    assert 'run="run"' in seen["bridge_ray_reward"], "tagged with the run directory's name"
    print("\n".join(seen[name] for name in EXPECTED_GAUGES))


def check_cluster(address: str, token: str) -> subprocess.CompletedProcess:
    """jobs/submit.sh's check of the cluster before it submits, with ``token`` at hand."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    return subprocess.run(["bash", "-c", f"source jobs/submit.sh && check_cluster {shlex.quote(address)}"],
                          cwd=REPO, env=env, capture_output=True, text=True)


def test_submit_script_checks_a_real_head_with_its_token(ray_head):
    """A real dashboard under token authentication answers the check with the token, and refuses a wrong one."""
    assert check_cluster(ray_head.dashboard_url, ray_head.token).returncode == 0
    refused = check_cluster(ray_head.dashboard_url, "not-the-token")
    assert refused.returncode == 1 and refused.stderr.startswith("error: the Ray cluster at"), refused.stderr
    assert "(HTTP 403)" in refused.stderr or "(HTTP 401)" in refused.stderr, refused.stderr
