"""A run's timings: each step of the job as it ends in ``timings.json``, the rounds split by phase, and the table
``train`` prints from it."""

from __future__ import annotations

import json

import pytest

from bridge_ray.coordinator.phases import PhaseRecorder
from bridge_ray.train.timings import ROUNDS, TIMINGS_FILE, JobTimings, timings_markdown


def test_each_step_is_written_as_it_ends_and_a_failed_step_is_not(tmp_path):
    timings = JobTimings(tmp_path / "run")
    with timings.step("checks and worlds"):
        assert not (tmp_path / "run" / TIMINGS_FILE).exists()  # nothing before the first step ends
    written = json.loads((tmp_path / "run" / TIMINGS_FILE).read_text())
    assert [s["step"] for s in written["steps"]] == ["checks and worlds"]
    with pytest.raises(RuntimeError), timings.step("warm-up"):
        raise RuntimeError("the warm-up failed")
    written = json.loads((tmp_path / "run" / TIMINGS_FILE).read_text())
    assert [s["step"] for s in written["steps"]] == ["checks and worlds"]
    assert written["total"] >= written["steps"][0]["seconds"] >= 0


def test_the_rounds_are_split_by_the_seconds_of_their_phases(tmp_path):
    recorder = PhaseRecorder(lambda: (0, 0))
    for r in range(2):
        for name in ("rollout", "score", "policy_update"):
            with recorder.phase(r, name):
                pass
    seconds = recorder.total_seconds()
    assert list(seconds) == ["rollout", "score", "policy_update"]
    assert seconds["rollout"] == pytest.approx(sum(x.seconds for x in recorder.records if x.phase == "rollout"))
    timings = JobTimings(tmp_path)
    with timings.step(ROUNDS):
        pass
    timings.add_round_phases(seconds)
    [step] = json.loads((tmp_path / TIMINGS_FILE).read_text())["steps"]
    assert step["phases"] == pytest.approx(seconds)


def test_the_table_gives_each_step_its_time_and_share_and_the_rounds_their_phases():
    timings = {"total": 600.0, "steps": [
        {"step": "warm-up", "start": 0.0, "seconds": 300.0},
        {"step": "rounds", "start": 300.0, "seconds": 240.0, "phases": {"rollout": 120.0, "policy_update": 60.0}},
        {"step": "eval_after", "start": 540.0, "seconds": 59.6},
    ]}
    lines = timings_markdown(timings).splitlines()
    assert lines[:2] == ["| step | time | share |", "|---|---:|---:|"]
    assert lines[2:] == [
        "| warm-up | 5:00 | 50% |",
        "| rounds | 4:00 | 40% |",
        "| rounds: rollout | 2:00 | 20% |",
        "| rounds: policy update | 1:00 | 10% |",
        "| rounds: other (checkpoints, logging) | 1:00 | 10% |",
        "| eval_after | 1:00 | 10% |",
        "| **total** | 10:00 | 100% |",
    ]
