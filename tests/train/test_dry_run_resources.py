"""``train --dry-run`` reports what the graph needs even when its inputs fail: the per-role table against this
machine (no Ray started) and each role the machine cannot hold, among the other errors, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.coordinator import capacity

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "jobs/configs/qwen2.5-3b-bridge.yaml"
LAPTOP = {"CPU": 2.0, "GPU": 0.0}


def _no_ray(*args, **kwargs):
    raise AssertionError("a dry run of failing inputs starts no Ray")


@pytest.fixture
def laptop(monkeypatch, tmp_path):
    """A 2-CPU machine without GPUs, no Ray address, no W&B key, Ray never started."""
    monkeypatch.setattr(capacity, "local_machine", lambda: dict(LAPTOP))
    monkeypatch.setattr("ray.init", _no_ray)
    for name in ("RAY_ADDRESS", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def table(out: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in out.splitlines() if len(cells := re.split(r"\s{2,}", line.strip())) > 1}


def test_dry_run_of_the_3b_preset_without_data_reports_the_gpus_it_lacks(laptop, tmp_path, capsys):
    assert main(["train", "--dry-run", "--config", str(PRESET), f"run.output_dir={tmp_path / 'run'}"]) == 2
    out, err = capsys.readouterr()
    rows = table(out)
    assert rows["policy_learner"] == ["4", "CPU 4, GPU 1", "CPU 16, GPU 4"], out
    assert rows["sampler"] == ["3", "CPU 4, GPU 1", "CPU 12, GPU 3"], out
    assert rows["retriever_learner"] == ["1", "CPU 2, GPU 0.5", "CPU 2, GPU 0.5"], out
    assert rows["shard_holder"] == ["8", "CPU 1", "CPU 8"], "the index is missing: retrieval.index.num_shards"
    assert rows["graph"] == ["CPU 38, GPU 7.5"], out
    assert rows["machine"][0].startswith("CPU 2, GPU 0 (no Ray started"), out
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in err and len(errors) == len(err.splitlines()), err
    assert any("retrieval.index.dir" in line and "does not exist" in line for line in errors), err
    assert sum("is not a file" in line for line in errors) == 8, "the training file and seven eval sets"
    gpus = [line for line in errors if "this machine has CPU 2, GPU 0" in line]
    assert {re.search(r"role '(\w+)'", line).group(1) for line in gpus} == {
        "shard_holder", "sampler", "policy_learner", "retriever_learner"}, err
    assert any("needs CPU 16, GPU 4" in line and "missing CPU 14, GPU 4" in line for line in gpus), err


def test_a_machine_that_holds_each_role_but_not_all_at_once():
    config = load_config(PRESET)
    problems = capacity.machine_problems(capacity.planned(config), {"CPU": 20.0, "GPU": 4.0})
    assert len(problems) == 1 and problems[0].startswith("the graph needs CPU 38, GPU 7.5 at once"), problems
    assert "missing CPU 18, GPU 3.5" in problems[0]
    assert capacity.machine_problems(config, {"CPU": 38.0, "GPU": 8.0}) == []


def test_the_machine_is_counted_as_a_local_ray_would():
    machine = capacity.local_machine()
    assert set(machine) == {"CPU", "GPU"} and machine["CPU"] >= 1 and machine["GPU"] >= 0
