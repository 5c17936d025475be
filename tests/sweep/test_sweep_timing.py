"""Timed rounds (bench round, bench speed): they count to the bench's own end in the ``[round r/N ETA]`` line, and
every variant starts from the config's warmed-up policy."""

from bridge_ray.config import load_config
from bridge_ray.sweep.timing import starting_policy, timed_rounds, timing_overrides


def test_each_round_is_told_the_rounds_the_bench_runs_not_run_rounds():
    totals: list[int] = []

    def run_round(total: int) -> dict[str, float]:
        totals.append(total)
        return {"time/rollout": float(len(totals)), "time/sync": 1.0}

    means, reported = timed_rounds(run_round, rounds=2, untimed=1)
    assert totals == [3, 3, 3], "N = 1 untimed + 2 timed rounds"
    assert "run.rounds=1000000" in timing_overrides("out"), "the sentinel that keeps the last round unsaved"
    assert [r["time/rollout"] for r in reported] == [2.0, 3.0], "only the timed rounds are reported"
    assert (means["rollout"], means["sync"], means["policy_update"]) == (2.5, 1.0, 0.0)


def test_every_variant_starts_from_the_configs_warmed_up_policy(monkeypatch, tmp_path):
    warmed = []
    monkeypatch.setattr("bridge_ray.warmup.trainer.warmed_up_policy", lambda c: warmed.append(c) or tmp_path / "warm")
    config = load_config("jobs/configs/local_cpu.yaml", [])
    assert starting_policy(config) == ["warmup.enabled=false", f"policy.model={tmp_path / 'warm'}"]
    assert warmed == [config], "the warm-up of the config as given, once"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cold = load_config("jobs/configs/local_cpu.yaml", ["warmup.enabled=false", f"policy.model={tmp_path / 'model'}"])
    assert starting_policy(cold)[-1] == f"policy.model={tmp_path / 'model'}" and len(warmed) == 1
