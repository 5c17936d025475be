"""The :class:`Run`'s life: checks that fail before Ray leave the folder as it was and start nothing; the graph a run
started ends with its ``with`` block, however the block ends (on a real graph: ``tests/train/test_training_job.py``,
whose rounds run in a ``Run`` as ``bench learn``'s do)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import ray
from job_fixtures import old_run

from bridge_ray.config import load_config
from bridge_ray.errors import InputError
from bridge_ray.runtime.calls import ActorLost
from bridge_ray.train.run import Run
from bridge_ray.train.run_folder import JobFlags
from bridge_ray.train.timings import TIMINGS_FILE

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_refused_before_ray_leaves_its_folder_as_it_was(tmp_path):
    """``--overwrite`` of another run's folder, with a question file missing: both problems at once, and the old
    run is not removed (it is only once nothing else is wrong); no Ray, no ``timings.json``."""
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    missing = tmp_path / "missing.jsonl"
    config = load_config(LOCAL_CPU, [f"run.output_dir={out}", "data.world_size=small", "warmup.enabled=false",
                                     f"data.eval.nq={missing}"])
    with pytest.raises(InputError) as caught, Run(config, JobFlags(overwrite=True)) as run:
        run.execute()
    assert any(str(missing) in problem for problem in caught.value.problems), caught.value.problems
    assert snapshot(out) == before and not (out / TIMINGS_FILE).exists()
    assert not ray.is_initialized(), "Ray started before the checks passed"
    assert run.coordinator is None


def test_a_new_run_is_refused_another_runs_folder(tmp_path):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    config = load_config(LOCAL_CPU, [f"run.output_dir={out}", "data.world_size=small", "warmup.enabled=false"])
    with pytest.raises(InputError, match="already holds another run's checkpoints of rounds 248-250"):
        Run(config).claim()
    assert snapshot(out) == before and not ray.is_initialized()


class Stop(Exception):
    """Ends a ``with Run(...)`` block from inside."""


class Coordinator:
    """Stands in for a coordinator's handle where only :meth:`Run.shut_down` calls it: it counts the shutdowns and
    raises ``fails`` from them."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.shutdowns, self.fails = 0, fails

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.fails is not None:
            raise self.fails


def test_the_graph_is_shut_down_once_when_the_block_fails():
    coordinator = Coordinator()
    with pytest.raises(Stop), Run(load_config(None, [])) as run:
        run.coordinator = coordinator
        raise Stop
    assert coordinator.shutdowns == 1 and run.coordinator is None
    run.shut_down()
    assert coordinator.shutdowns == 1, "a graph is shut down once"


def test_a_dead_coordinator_does_not_hide_the_error_that_killed_it():
    coordinator = Coordinator(fails=ActorLost("coordinator (shutdown): actor died"))
    with pytest.raises(Stop), Run(load_config(None, [])) as run:
        run.coordinator = coordinator
        raise Stop
    assert coordinator.shutdowns == 1


def test_a_run_without_a_graph_says_so():
    with pytest.raises(RuntimeError, match="no graph is up"):
        Run(load_config(None, [])).train()

