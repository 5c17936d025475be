"""``train --dry-run`` against a real (local, 2-CPU) Ray cluster: the per-role resource table, and a cluster too
small for the graph as an ``error:`` naming the role that is short (and the keys that size it), not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_ray.cli import main

pytestmark = pytest.mark.slow

RAY_CPUS = 2
LOCAL_CPU = str(Path(__file__).resolve().parents[2] / "jobs/configs/local_cpu.yaml")


def dry_run(tmp_path: Path, *overrides: str) -> list[str]:
    return ["train", "--dry-run", "--config", LOCAL_CPU, f"run.output_dir={tmp_path / 'run'}", *overrides]


def test_dry_run_prints_what_each_role_needs(local_ray, tmp_path, capsys):
    assert main(dry_run(tmp_path)) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines() if line.strip()}
    assert rows["shard_holder"].split()[:3] == ["2", "CPU", "0.25"], out  # local_cpu's two shards
    assert rows["graph"] == "CPU 1.75", out
    assert rows["cluster"].startswith("CPU 2 "), out
    assert "the cluster can hold the graph" in out


@pytest.mark.parametrize(
    ("overrides", "culprit"),
    [
        (["roles.sampler.gpus=1"], "role 'sampler'"),
        (["roles.policy_learner.cpus=3"], "lower roles.policy_learner.count or roles.policy_learner.cpus/gpus"),
        (["roles.sampler.count=3"], "the cluster cannot hold the whole graph at once"),
    ],
    ids=["a GPU on a CPU cluster", "a bundle beyond every node", "roles that fit alone but not together"],
)
def test_a_cluster_too_small_names_the_role(local_ray, tmp_path, capsys, overrides, culprit):
    assert main(dry_run(tmp_path, *overrides)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and culprit in err, err
    assert "Traceback" not in err
