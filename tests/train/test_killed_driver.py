"""The driver of ``python -m bridge_ray train`` SIGKILLed after its first checkpoint: ``train --auto-resume``
continues from the last complete round and ends in the state of an uninterrupted run.

The other faults (a sampler, a policy-learner rank) are in ``test_fault_tolerance.py``, on a graph of that
module's own; this one starts no Ray instance in the test process, so the suite runs the two side by side.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from job_fixtures import REPO, SMALL_JOB, job_config, tiny_policy_overrides

from bridge_ray.checkpoint import load_manifest
from bridge_ray.coordinator.cursor import QuestionCursor
from bridge_ray.coordinator.inputs import train_questions
from bridge_ray.coordinator.phases import REWARD, ROLLOUT, read_phases

pytestmark = pytest.mark.slow


def test_killed_driver_resumes_from_the_last_complete_round(tmp_path, tiny_policy):
    out = tmp_path / "run"
    train = [sys.executable, "-m", "bridge_ray", "train", "--config", str(REPO / "jobs/configs/local_cpu.yaml")]
    overrides = [
        f"run.output_dir={out}", *SMALL_JOB, *tiny_policy_overrides(tiny_policy), "run.rounds=3",
        "run.ray_address=local", "rollout.max_staleness=2",
    ]
    args = [*train, *overrides]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(args, cwd=REPO, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = out / "checkpoints" / "latest"
    try:
        deadline = time.monotonic() + 400
        while not latest.is_file() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert latest.is_file(), f"no checkpoint before the driver exited (rc {driver.poll()})"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
    finally:
        _kill_group(driver.pid)
    killed_at = load_manifest(out / "checkpoints" / latest.read_text().strip()).round
    assert 1 <= killed_at < 3

    resumed = subprocess.run(  # evaluates after training too: the coordinator's evaluation over the samplers
        [*train, "--auto-resume", *overrides, "eval.after_training=true"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "done: 3 rounds, policy v3" in resumed.stdout
    assert "## eval after" in resumed.stdout and "| world | 2 |" in (out / "eval_after.md").read_text()
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["label"], e["round"], e["policy_version"]) for e in evals] == [("after", 3, 3)]
    assert evals[0]["table"] == json.loads((out / "eval_after.json").read_text())
    diagnostics = {"reward", "reward_positive", "zero_variance_groups", "answered", "invalid_action_rate",
                   "truncated", "searches_per_trajectory", "response_tokens", "gold_recall"}
    for reward in (r for r in read_phases(out / "phases.jsonl") if r.phase == REWARD):
        assert diagnostics <= reward.info.keys()
        assert ("warning" in reward.info) == (reward.info["zero_variance_groups"] == 1)
    rounds = [r.round for r in read_phases(out / "phases.jsonl") if r.phase == ROLLOUT]
    assert rounds[-(3 - killed_at):] == list(range(killed_at, 3)), "the resumed run started at the checkpoint"
    # the state an uninterrupted run reaches: 3 rounds, policy v3, the cursor 3 batches into the data (the
    # rounds are asynchronous, two batches in flight: a checkpoint taken with batches drawn ahead must record
    # the cursor from before them)
    config = job_config(out, *tiny_policy_overrides(tiny_policy))
    cursor = QuestionCursor(len(train_questions(config)), config.rollout.questions_per_batch, config.run.seed)
    for _ in range(3):
        cursor.next_batch()
    final = load_manifest(out / "checkpoints" / latest.read_text().strip())
    assert (final.round, final.policy_version, final.data_cursor) == (3, 3, cursor.state_dict())


def _kill_group(pgid: int) -> None:
    """Whatever the killed driver's local Ray left behind (it normally dies with the driver)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
