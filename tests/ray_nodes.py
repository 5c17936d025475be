"""Ray nodes of our own on this machine, started with ``ray start --block`` and stopped without ``ray stop``.

Each node is a ``ray start`` process in a session of its own, with its own ports and temp dir, so other Ray
instances on the machine (other test processes' clusters) are neither joined nor stopped: ``ray stop`` has no
filter and would stop them all. A node is stopped by ending its session's processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from bridge_ray.runtime.rendezvous import free_port

VENV_BIN = Path(sys.executable).parent


@dataclass
class Node:
    """One ``ray start --block`` process and the log its output goes to."""

    leader: subprocess.Popen
    log: Path

    def processes(self) -> list[psutil.Process]:
        """The node's processes: the leader's descendants and anything left in its session."""
        procs = {}
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.leader.pid)
            procs = {p.pid: p for p in (root, *root.children(recursive=True))}
        for p in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(p.pid) == self.leader.pid:
                    procs.setdefault(p.pid, p)
        return list(procs.values())

    def stop(self) -> None:
        procs = self.processes()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)


def node_ports(metrics_port: int) -> list[str]:
    """Fresh ports for what every node listens on (Ray's defaults would clash between nodes on one host)."""
    return [
        f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
        f"--metrics-export-port={metrics_port}", f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
    ]


def start_node(temp_dir: Path, env: dict[str, str], *options: str, metrics_port: int | None = None) -> Node:
    """``ray start --block OPTIONS`` on 127.0.0.1 with its own ports (its Prometheus endpoint on ``metrics_port``
    when given), temp dir ``temp_dir`` (Ray's socket paths live under it and must stay under 107 characters: keep
    it short) and ``env``; the venv's ``ray``."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    command = [str(VENV_BIN / "ray"), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
               f"--temp-dir={temp_dir}", *node_ports(metrics_port or free_port()), *options]
    log = temp_dir / "ray-start.log"
    with open(log, "wb") as out:  # the child holds its own copy
        leader = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Node(leader, log)


def head_options(gcs_port: int, dashboard_port: int) -> list[str]:
    """What only a head takes: its GCS and client ports, and the dashboard (with the Jobs API) on 127.0.0.1."""
    return ["--head", f"--port={gcs_port}", f"--ray-client-server-port={free_port()}",
            "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]


def job_client(dashboard_url: str, token: str):
    """A Jobs API client of ``dashboard_url`` sending ``token``. Ray's client takes ``RAY_ADDRESS`` over the address it
    is given, and the suite sets ``RAY_ADDRESS=local`` (tests/conftest.py): unset while the client is made."""
    from ray.job_submission import JobSubmissionClient  # the dashboard's SDK, only for the modules that submit

    saved = os.environ.pop("RAY_ADDRESS", None)
    try:
        return JobSubmissionClient(dashboard_url, headers={"Authorization": f"Bearer {token}"})
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
