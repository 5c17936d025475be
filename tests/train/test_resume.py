"""Resuming a run, end to end: three ``python -m bridge_ray train`` processes, each with a local Ray of its own.

One run trains 2 rounds uninterrupted, with a checkpoint after each. A second, the same config in another folder,
has its driver SIGKILLed as soon as its first checkpoint is complete; ``train --auto-resume`` continues it from
there and evaluates after training. The resumed rounds must draw what the uninterrupted ones drew (questions and
sampler seeds, from the checkpoint's data cursor and RNG state), sample the same tokens, make the same updates and
end with the same weights, to the bit. Exact resume and the killed driver share these runs: three graph starts,
where a module for each made four. The rounds are synchronous: a resumed asynchronous round samples under a fresher
policy than it would have uninterrupted, so only a synchronous run compares bit for bit with an uninterrupted one;
that a checkpoint taken with batches drawn ahead records the cursor from before them is checked in
``tests/coordinator/test_pipeline.py``. Each run's Ray lives under a private ``RAY_TMPDIR``, so the stderr of every
actor it started can be read afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from job_fixtures import LOCAL_CPU, REPO, SMALL_JOB, tiny_policy_overrides
from safetensors.torch import load_file

from bridge_ray.checkpoint import LATEST, Manifest, find_checkpoint
from bridge_ray.coordinator.phases import POLICY_UPDATE, REWARD, ROLLOUT, read_phases

pytestmark = pytest.mark.slow

ROUNDS = 2
RUN = (f"run.rounds={ROUNDS}", "rollout.max_staleness=0", "checkpoint.every_rounds=1", f"checkpoint.keep={ROUNDS}")


def _ray_dir() -> Path:
    """Ray's socket paths must stay short: its temporary directory goes under /tmp, not under pytest's."""
    return Path(tempfile.mkdtemp(prefix="br-"))


@dataclass
class TrainRun:
    """One ``train`` process on the run folder ``out``; its Ray instance under ``ray_dir`` (its RAY_TMPDIR)."""

    out: Path
    ray_dir: Path = field(default_factory=_ray_dir)
    driver: subprocess.CompletedProcess | None = None  # what it printed, once it ran to the end

    def command(self, tiny_policy: Path, *args: str) -> list[str]:
        flags = [a for a in args if a.startswith("--")]
        overrides = [a for a in args if not a.startswith("--")]
        return [sys.executable, "-m", "bridge_ray", "train", *flags, "--config", str(LOCAL_CPU),
                f"run.output_dir={self.out}", *SMALL_JOB, *tiny_policy_overrides(tiny_policy), *RUN,
                "run.ray_address=local", "run.dashboard=false", "telemetry.wandb_mode=disabled", *overrides]

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_TMPDIR": str(self.ray_dir), "RAY_USAGE_STATS_ENABLED": "0"}

    def train(self, tiny_policy: Path, *args: str) -> None:
        done = subprocess.run(self.command(tiny_policy, *args), cwd=REPO, env=self.env(), capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        self.driver = done

    def phases(self, name: str) -> dict[int, dict]:
        """The last record of phase ``name`` in each round: a round the killed driver left unfinished is logged
        again by the resumed run."""
        return {r.round: r.info for r in read_phases(self.out / "phases.jsonl") if r.phase == name}

    def manifest(self) -> Manifest:
        return find_checkpoint(self.out / "checkpoints")[1]


@dataclass
class Runs:
    uninterrupted: TrainRun
    resumed: TrainRun  # the killed run's folder, continued
    killed_at: int  # the round of the checkpoint it continued from


def train_until_killed(run: TrainRun, tiny_policy: Path) -> int:
    """Start ``run``, SIGKILL its driver as soon as its first checkpoint is complete; the round of that
    checkpoint."""
    driver = subprocess.Popen(run.command(tiny_policy), cwd=REPO, env=run.env(), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = run.out / "checkpoints" / LATEST  # written last, by a rename
    try:
        deadline = time.monotonic() + 600
        while not latest.is_file() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert latest.is_file(), f"no checkpoint before the driver exited (rc {driver.poll()})"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
    finally:
        _kill_group(driver.pid)
    return run.manifest().round


def _kill_group(pgid: int) -> None:
    """Whatever the killed driver's local Ray left behind (it normally dies with the driver)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture(scope="module")
def runs(module_dir, tiny_policy):
    uninterrupted, killed = TrainRun(module_dir / "uninterrupted"), TrainRun(module_dir / "killed")
    resumed = TrainRun(killed.out)
    try:
        uninterrupted.train(tiny_policy)
        killed_at = train_until_killed(killed, tiny_policy)
        # evaluates after training too: the coordinator's evaluation over the samplers
        resumed.train(tiny_policy, "--auto-resume", "eval.after_training=true")
        yield Runs(uninterrupted, resumed, killed_at)
    finally:
        for run in (uninterrupted, killed, resumed):
            shutil.rmtree(run.ray_dir, ignore_errors=True)


def test_the_killed_run_resumes_from_its_checkpoint_and_finishes(runs):
    assert 1 <= runs.killed_at < ROUNDS
    rounds = [r.round for r in read_phases(runs.resumed.out / "phases.jsonl") if r.phase == ROLLOUT]
    resumed_rounds = list(range(runs.killed_at, ROUNDS))
    assert rounds[-len(resumed_rounds):] == resumed_rounds, "the resumed run started at the checkpoint"
    assert f"done: {ROUNDS} rounds, policy v{ROUNDS}" in runs.resumed.driver.stdout


def test_every_round_samples_from_new_seeds(runs):
    rollouts = runs.uninterrupted.phases(ROLLOUT)
    assert sorted(rollouts) == list(range(ROUNDS))
    for key in ("sampler_seeds", "sample_digest"):
        drawn = [json.dumps(rollouts[r][key]) for r in range(ROUNDS)]
        assert len(set(drawn)) == ROUNDS, f"{key}: {drawn}"


def test_the_resumed_rounds_draw_sample_and_update_like_the_uninterrupted_ones(runs):
    uninterrupted, resumed = runs.uninterrupted, runs.resumed
    for round_index in range(runs.killed_at, ROUNDS):
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
    assert "## eval after" in runs.resumed.driver.stdout and "| world | 2 |" in (out / "eval_after.md").read_text()
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


def test_train_ends_without_a_traceback_or_rays_e_line(runs):
    """Not the killed run's processes: they were SIGKILLed."""
    for run in (runs.uninterrupted, runs.resumed):
        assert "dashboard: none (Ray started without it)" in run.driver.stdout, "run.dashboard=false"
        streams = {"driver": run.driver.stdout + run.driver.stderr}
        streams |= {str(p): p.read_text(errors="replace") for p in run.ray_dir.glob("ray/session_*/logs/worker-*")}
        assert len(streams) > 1, f"no worker logs under {run.ray_dir}"
        for where, text in streams.items():
            assert "Traceback" not in text and "Exception ignored" not in text, f"{where}:\n{text[-3000:]}"
            # Ray's E line about restartable actors (the samplers) given actor handles: they are given names
            assert "constructor arguments in the object store" not in text, f"{where}:\n{text[-3000:]}"
