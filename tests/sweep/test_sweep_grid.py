"""What a sweep runs: each run's config from its preset file, staged presets scaled, runs shared by presets found,
each seed's warm-up."""

from pathlib import Path

import pytest

from bridge_ray.config import load_config
from bridge_ray.sweep.grid import Sweep, scaled_stages
from bridge_ray.sweep.runs import run_key
from bridge_ray.train.stages import stage_config

PRESET_DIR = Path("jobs/configs/presets/local_cpu")


def test_staged_presets_scale_from_the_first_stage():
    preset = load_config(PRESET_DIR / "rag_then_rl.yaml")
    first = preset.stages[0].rounds
    staged = scaled_stages(preset, 3 * first)
    assert [s.rounds for s in staged.stages] == [3 * s.rounds for s in preset.stages]
    assert [s.train for s in staged.stages] == ["policy", "retriever", "policy"]
    fixed = load_config(PRESET_DIR / "fixed.yaml")
    assert scaled_stages(fixed, 7) is fixed


def test_runs_that_differ_only_in_their_folders_are_trained_once():
    """RAG-then-RL's and RL-then-RAG's baseline stage is the fixed preset's run: one run, three curves (Fig. 2a)."""
    def preset(name: str, *overrides: str):
        return load_config(f"{PRESET_DIR}/{name}.yaml", [f"run.output_dir=runs/{name}", "run.rounds=2", *overrides])

    fixed = run_key(preset("fixed"))
    assert run_key(stage_config(preset("rag_then_rl"), 0, None)) == fixed
    assert run_key(stage_config(preset("rl_then_rag"), 0, None)) == fixed
    assert run_key(stage_config(preset("rag_then_rl"), 1, None)) != fixed
    assert run_key(preset("fixed", "run.seed=1")) != fixed
    assert run_key(preset("bridge")) != fixed


def _sweep(tmp_path: Path, **settings) -> Sweep:
    return Sweep(config="jobs/configs/local_cpu_gap.yaml", presets={"fixed": PRESET_DIR / "fixed.yaml"},
                 seeds=[0, 1, 2], rounds=8, eval_every=4, eval_questions=50, out=tmp_path,
                 overrides=["data.world=gap"], **settings)


@pytest.mark.parametrize("per_seed", [False, True])
def test_each_seed_starts_from_its_own_warmup_only_when_asked(tmp_path, per_seed):
    """warmup_per_seed: the spread over seeds then includes the warm-up's (demonstrations drawn and ordered by
    warmup.seed); without it every seed shares the config's warm-up, as the README's comparisons do."""
    configs = _sweep(tmp_path, warmup_per_seed=per_seed).warmup_configs()
    seeds = {seed: config.warmup.seed for seed, config in configs.items()}
    assert seeds == ({0: 0, 1: 1, 2: 2} if per_seed else {0: 0, 1: 0, 2: 0})
    assert all(config.data.world == "gap" for config in configs.values())


def test_a_run_trains_its_preset_over_the_base_with_the_sweeps_own_settings(tmp_path):
    sweep = _sweep(tmp_path, split="dev", ood_seed=3)
    config = sweep.run_config(PRESET_DIR / "fixed.yaml", 2, tmp_path / "runs" / "fixed-seed2", "warm")
    assert (config.policy.model, config.run.seed, config.run.rounds, config.checkpoint.every_rounds) == (
        "warm", 2, 8, 4)
    assert not (config.warmup.enabled or config.eval.before_training or config.eval.after_training)
    assert config.data.world == "gap" and config.run.output_dir == str(tmp_path / "runs" / "fixed-seed2")
    sets = sweep.eval_sets()
    assert list(sets) == ["gap", "ood"] and sets["ood"].data.world_seed == 3
    assert {c.eval.max_questions for c in sets.values()} == {50}
    assert sweep.tag == "bench-eval-dev-q50-ood3.json"
    assert _sweep(tmp_path).tag == "bench-eval-q50-ood1.json", "test's tag as before: archived sweeps resume"
