"""The graph's resource check against a real (local, 2-CPU) Ray cluster, as ``train --dry-run`` runs it: the
per-role resource table, and a cluster too small for the graph as an error naming the role that is short (and the
keys that size it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_ray.config import load_config
from bridge_ray.coordinator.capacity import report_capacity
from bridge_ray.errors import InputError

pytestmark = pytest.mark.slow

RAY_CPUS = 2
LOCAL_CPU = str(Path(__file__).resolve().parents[2] / "jobs/configs/local_cpu.yaml")


def config(tmp_path: Path, *overrides: str):
    return load_config(LOCAL_CPU, [f"run.output_dir={tmp_path / 'run'}", *overrides])


def test_dry_run_prints_what_each_role_needs(local_ray, tmp_path, capsys):
    assert report_capacity(config(tmp_path))
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in out.splitlines() if line.strip()}
    assert rows["shard_holder"].split()[:3] == ["2", "CPU", "0.25"], out  # local_cpu's two shards
    assert rows["graph"] == "CPU 1.75", out
    assert rows["cluster"].startswith("CPU 2, GPU 0 (free: CPU 2"), out
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
def test_a_cluster_too_small_names_the_role(local_ray, tmp_path, overrides, culprit):
    with pytest.raises(InputError) as caught:
        report_capacity(config(tmp_path, *overrides))
    assert any(culprit in problem for problem in caught.value.problems), caught.value.problems


def test_a_node_pool_the_cluster_lacks_is_named_with_the_role(local_ray, tmp_path, capsys):
    pool = config(tmp_path, 'roles.sampler.resources={"pool_rollout": 1}')
    with pytest.raises(InputError) as caught:
        report_capacity(pool)
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in capsys.readouterr().out.splitlines() if line}
    assert rows["sampler"].split()[:4] == ["1", "CPU", "0.5,", "pool_rollout"], rows
    assert rows["cluster"].startswith("CPU 2, GPU 0, pool_rollout 0 (free:"), rows
    assert any("role 'sampler'" in p and "missing pool_rollout 1" in p for p in caught.value.problems), caught.value
