"""Resume is exact, and ``train`` ends cleanly: the real command, twice.

One run trains 2 rounds, with a checkpoint after each. A copy of its folder as a run killed during its second
round would leave it (the checkpoint after one round as the latest, only round 0 in the log) is resumed with
``--resume``. The resumed round must draw what the uninterrupted one drew (its questions and sampling seeds, from
the checkpoint's data cursor and RNG state) and so sample the same trajectories and make the same update. Every
run is its own ``python -m bridge_ray train`` process with its own local Ray instance under a private
``RAY_TMPDIR``, so the stderr of every actor it started can be read afterwards: none may hold a traceback.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from job_fixtures import LOCAL_CPU, REPO, SMALL_JOB, tiny_policy_overrides
from safetensors.torch import load_file

from bridge_ray.checkpoint import LATEST
from bridge_ray.coordinator.phases import POLICY_UPDATE, REWARD, ROLLOUT, read_phases

pytestmark = pytest.mark.slow


@dataclass
class Run:
    out: Path
    ray_dir: Path  # RAY_TMPDIR of the run's Ray instances
    processes: list[subprocess.CompletedProcess]

    def phase(self, round_index: int, name: str) -> dict:
        return next(r.info for r in read_phases(self.out / "phases.jsonl") if (r.round, r.phase) == (round_index, name))


def train(run: Run, tiny_policy: Path, *args: str) -> None:
    flags = [a for a in args if a.startswith("--")]
    overrides = [a for a in args if not a.startswith("--")]
    command = [sys.executable, "-m", "bridge_ray", "train", *flags, "--config", str(LOCAL_CPU),
               f"run.output_dir={run.out}", *SMALL_JOB, *tiny_policy_overrides(tiny_policy),
               "run.ray_address=local", "telemetry.wandb_mode=disabled", *overrides]
    env = {**os.environ, "RAY_TMPDIR": str(run.ray_dir), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run.processes.append(done)


def interrupted_after_round_1(run: Path, copy: Path) -> None:
    """``run``'s folder as it stood when its second round started: the checkpoint after one round the latest, only
    round 0 logged (``phases.jsonl`` counts rounds from 0)."""
    shutil.copytree(run, copy)
    checkpoints = copy / "checkpoints"
    shutil.rmtree(checkpoints / "round-00000002")
    (checkpoints / LATEST).write_text("round-00000001")
    phases = copy / "phases.jsonl"
    phases.write_text("".join(line + "\n" for line in phases.read_text().splitlines() if json.loads(line)["round"] < 1))


@pytest.fixture(scope="module")
def runs(module_dir, tiny_policy):
    root = module_dir
    # Ray's socket paths must stay short: its temporary directory goes under /tmp, not under pytest's.
    uninterrupted, resumed = (Run(root / name, Path(tempfile.mkdtemp(prefix="br-")), []) for name in ("a", "b"))
    try:
        train(uninterrupted, tiny_policy, "run.rounds=2", "checkpoint.every_rounds=1", "checkpoint.keep=2")
        interrupted_after_round_1(uninterrupted.out, resumed.out)
        train(resumed, tiny_policy, "--resume", "run.rounds=2")
        yield uninterrupted, resumed
    finally:
        for run in (uninterrupted, resumed):
            shutil.rmtree(run.ray_dir, ignore_errors=True)


def test_the_resumed_round_draws_the_questions_and_seeds_of_the_uninterrupted_round(runs):
    uninterrupted, resumed = runs
    assert [r.round for r in read_phases(resumed.out / "phases.jsonl") if r.phase == ROLLOUT] == [0, 1]
    for round_index in (0, 1):
        drawn, redrawn = uninterrupted.phase(round_index, ROLLOUT), resumed.phase(round_index, ROLLOUT)
        assert drawn["question_ids"] == redrawn["question_ids"]
        assert drawn["sampler_seeds"] == redrawn["sampler_seeds"]
    first, second = uninterrupted.phase(0, ROLLOUT), uninterrupted.phase(1, ROLLOUT)
    assert first["sampler_seeds"] != second["sampler_seeds"], "every round samples from new seeds"


def test_the_resumed_round_samples_and_updates_like_the_uninterrupted_round(runs):
    uninterrupted, resumed = runs
    digests = [run.phase(1, ROLLOUT)["sample_digest"] for run in runs]
    assert digests[0] == digests[1], "the same tokens sampled in round 1"
    assert uninterrupted.phase(0, ROLLOUT)["sample_digest"] != digests[0]
    for name in (REWARD, POLICY_UPDATE):
        assert uninterrupted.phase(1, name) == resumed.phase(1, name), f"round 1, {name}"
    # The learner restored from the checkpoint (weights, optimizer state, step count) updates like the one that
    # ran on: the same policy after round 2, to the bit.
    weights = [load_file(run.out / "checkpoints/round-00000002/policy/model.safetensors") for run in runs]
    assert weights[0].keys() == weights[1].keys()
    assert all((weights[0][k] == weights[1][k]).all() for k in weights[0])


def test_train_ends_without_a_traceback_or_rays_e_line(runs):
    for run in runs:
        streams = {f"driver {i}": p.stdout + p.stderr for i, p in enumerate(run.processes)}
        streams |= {str(p): p.read_text(errors="replace") for p in run.ray_dir.glob("ray/session_*/logs/worker-*")}
        assert len(streams) > len(run.processes), f"no worker logs under {run.ray_dir}"
        for where, text in streams.items():
            assert "Traceback" not in text and "Exception ignored" not in text, f"{where}:\n{text[-3000:]}"
            # Ray's E line about restartable actors (the samplers) given actor handles: they are given names
            assert "constructor arguments in the object store" not in text, f"{where}:\n{text[-3000:]}"
