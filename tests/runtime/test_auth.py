"""Joining a token-authenticated Ray head without ``RAY_AUTH_MODE=token``: one ``error:`` line naming the fix, exit
2, no traceback and none of ``ray.init``'s 20 s of retries; with the mode set the same head is joined.

The head is a real one (``ray start --head`` under ``RAY_AUTH_MODE=token``) on free ports in a temporary folder of
its own, and is stopped by the pids of its own processes only (never ``ray stop``, which ends every Ray instance
on the machine).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bridge_ray.runtime.auth import refused

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **extra}


@pytest.fixture(scope="module")
def token_head():
    """(address, token) of a one-node head that asks every client for its token."""
    temp = f"/tmp/br-auth-{secrets.token_hex(3)}"  # Ray's socket paths must stay short
    token, port = secrets.token_hex(16), _free_port()
    start = [RAY, "start", "--head", f"--port={port}", f"--ray-client-server-port={_free_port()}", "--num-cpus=0",
             "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"]
    subprocess.run(start, env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token), check=True, capture_output=True,
                   timeout=120)
    try:
        yield f"127.0.0.1:{port}", token
    finally:
        _stop(temp)


def _stop(temp: str) -> None:
    """End the processes of the head started in ``temp`` (their command lines name it), by pid."""
    mine = [p for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])]
    for process in mine:
        process.terminate()
    _, alive = psutil.wait_procs(mine, timeout=10)
    for process in alive:
        process.kill()


def test_a_head_asking_for_a_token_is_one_error_before_ray_init(token_head, tmp_path):
    address, token = token_head
    train = [sys.executable, "-m", "bridge_ray", "train", "--dry-run", f"run.output_dir={tmp_path / 'run'}",
             f"run.ray_address={address}"]
    done = subprocess.run(train, cwd=REPO, env=_env(RAY_AUTH_TOKEN=token), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "RAY_AUTH_MODE=token" in errors[0] and "ray get-auth-token" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert "Failed to get cluster ID" not in done.stderr, "refused before ray.init's retries"


def test_with_the_mode_set_the_same_head_is_joined(token_head):
    address, token = token_head
    join = f"from bridge_ray.runtime.auth import init_ray; init_ray({address!r}, log_to_driver=False); print('joined')"
    done = subprocess.run([sys.executable, "-c", join], cwd=REPO, env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "joined" in done.stdout, done.stderr


def test_a_refusal_met_by_ray_init_is_recognised_in_its_chain():
    """What ``ray.init`` raises after its retries (Ray 2.60, a driver without the token): a ConnectionError caused
    by a RuntimeError that quotes the AuthenticationError's traceback."""
    last = ("Traceback (most recent call last):\n  File \"python/ray/includes/common.pxi\", line 119, in "
            "ray._raylet.check_status\nray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: "
            "Authentication token is missing or incorrect.")
    try:
        try:
            raise RuntimeError(f"Failed to connect to GCS. Last connection error: {last}")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as exc:
        assert refused(exc)
    assert not refused(ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"))
