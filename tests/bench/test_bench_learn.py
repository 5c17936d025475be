"""bench learn's command line: the flags become the sweep (:mod:`bridge_ray.sweep`) it runs."""

import argparse

import pytest

from bridge_ray.bench.learn import add_arguments, base_config, preset_files, sweep_of
from bridge_ray.errors import InputError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*argv, "--out", "x"])
    args.config = base_config(args)
    return args


@pytest.mark.parametrize(("argv", "config"), [
    ([], "jobs/configs/local_cpu.yaml"),
    (["--world", "gap"], "jobs/configs/local_cpu_gap.yaml"),
    (["--world", "gap", "--config", "mine.yaml"], "mine.yaml"),
])
def test_the_world_picks_its_own_settings_unless_a_config_is_given(argv, config):
    assert _args(*argv).config == config


def test_the_flags_become_the_sweep():
    args = _args("--world", "gap", "--presets", "fixed,bridge", "--seeds", "0,1", "--split", "dev",
                 "--warmup-per-seed", "run.rounds=3")
    sweep = sweep_of(args, preset_files(args))
    assert list(sweep.presets) == ["fixed", "bridge"] and sweep.presets["bridge"].name == "bridge.yaml"
    assert (sweep.seeds, sweep.split, sweep.warmup_per_seed, sweep.baseline) == ([0, 1], "dev", True, "fixed")
    assert sweep.overrides == ["run.rounds=3", "data.world=gap"]
    assert sweep.config == "jobs/configs/local_cpu_gap.yaml" and str(sweep.out) == "x"
    assert sweep.command.startswith("python -m bridge_ray bench learn")


def test_a_preset_without_a_file_or_a_baseline_outside_the_presets_is_refused():
    with pytest.raises(InputError, match="--presets: no file for nope"):
        preset_files(_args("--presets", "fixed,nope"))
    with pytest.raises(InputError, match="--baseline bridge: not one of --presets"):
        preset_files(_args("--presets", "fixed", "--baseline", "bridge"))
