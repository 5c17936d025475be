import math
import subprocess
import sys

import pytest

from bridge_ray.cli import COMMANDS, main
from bridge_ray.commands.bench import BENCHMARKS
from bridge_ray.config import Config, ConfigError, dump_config, load_config


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_are_the_papers_settings():
    cfg = load_config()
    assert cfg.algorithm.estimator == "bridge"
    assert cfg.algorithm.grpo.rollouts_per_question == 8 and cfg.algorithm.grpo.kl_coef == 1e-4
    assert cfg.algorithm.grpo.loss_agg == "turn-mean"
    assert (cfg.algorithm.grpo.old_logp, cfg.algorithm.grpo.tis_cap) == ("learner", None)
    r = cfg.algorithm.retriever
    assert (r.gamma, r.retrieval_temperature, r.posterior_temperature, r.num_candidates, r.num_shown, r.lr) == (
        0.25, 0.4, 0.5, 40, 3, 1e-5)
    assert (cfg.rollout.questions_per_batch, cfg.rollout.max_turns, cfg.optim.lr, cfg.optim.mini_batch_size) == (
        512, 2, 1e-6, 64)


def test_file_and_overrides(tmp_path):
    path = write(tmp_path, "algorithm:\n  retriever:\n    gamma: 1.0\nrun:\n  rounds: 3\n")
    cfg = load_config(path, ["run.rounds=5", "algorithm.grpo.dual_clip=3.0", "algorithm.grpo.loss_agg=token-mean"])
    assert cfg.algorithm.retriever.gamma == 1.0 and cfg.run.rounds == 5
    assert cfg.algorithm.grpo.dual_clip == 3.0 and cfg.algorithm.grpo.loss_agg == "token-mean"
    grpo = load_config(None, ["algorithm.grpo.old_logp=sampler", "algorithm.grpo.tis_cap=2"]).algorithm.grpo
    assert (grpo.old_logp, grpo.tis_cap) == ("sampler", 2.0)


def test_unknown_key_names_key_file_line_and_suggests(tmp_path):
    path = write(tmp_path, "algorithm:\n  grpo:\n    clip_lo: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "algorithm.grpo.clip_lo" in msg and f"{path}:3" in msg and "clip_low" in msg


def test_wrong_type_names_key_and_line(tmp_path):
    path = write(tmp_path, "run:\n  seed: 1\n  rounds: many\n")
    with pytest.raises(ConfigError, match=r"run\.rounds.*cfg\.yaml:3"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"run\.rounds"):
        load_config(write(tmp_path, "run:\n  rounds: '3'\n"))  # strings are not silently coerced


def test_a_dashboard_left_out_is_one_of_a_local_instance(tmp_path):
    assert load_config(None, ["run.dashboard=false", "run.ray_address=local"]).run.dashboard is False
    path = write(tmp_path, "run:\n  ray_address: ray://head:10001\n  dashboard: false\n")
    with pytest.raises(ConfigError, match=r"run.*dashboard: false applies to a local Ray.*ray://head:10001"):
        load_config(path)


def test_inconsistent_combinations_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="num_shown"):
        load_config(None, ["algorithm.retriever.num_shown=50"])
    with pytest.raises(ConfigError, match="mini_batch_size"):
        load_config(None, ["optim.mini_batch_size=100"])
    with pytest.raises(ConfigError, match="two_state"):
        load_config(None, ["algorithm.estimator=two_state", "algorithm.train_retriever=false"])
    with pytest.raises(ConfigError, match=r"inherit algorithm\.retriever\.kl_coef: 0\.5 and "
                                          r"algorithm\.retriever\.turn_weight: 'evidence'"):
        load_config(None, ["algorithm.estimator=two_state", "algorithm.retriever.kl_coef=0.5",
                           "algorithm.retriever.turn_weight=evidence"])  # η* has neither: L_RAG alone
    assert load_config(None, ["algorithm.estimator=two_state"]).algorithm.retriever.kl_coef == 0
    drop = load_config(None, ["algorithm.estimator=drop", "algorithm.retriever.gamma=0.5"])
    assert drop.algorithm.estimator == "drop"
    for bad, key in (("algorithm.retriever.gamma=.inf", r"retriever\.gamma < inf"),
                     ("algorithm.retriever.update_period=2", r"retriever\.update_period: 1"),
                     ("learner.zero_stage=3", r"learner\.zero_stage <= 2")):
        with pytest.raises(ConfigError, match=key):  # what drop and two_state cannot honour is never ignored
            load_config(None, ["algorithm.estimator=drop", bad])
    with pytest.raises(ConfigError, match="max_action_length"):
        load_config(None, ["rollout.max_action_length=5000"])
    with pytest.raises(ConfigError, match=r"eval\.worlds lists 'default', the run's own world"):
        load_config(None, ["eval.worlds=[default]"])
    assert load_config(None, ["eval.worlds=[gap]"]).eval.worlds == ["gap"]
    with pytest.raises(ConfigError, match=r"algorithm\.grpo\.tis_cap"):
        load_config(None, ["algorithm.grpo.tis_cap=1.0"])
    with pytest.raises(ConfigError, match=r"algorithm\.grpo\.old_logp"):
        load_config(None, ["algorithm.grpo.old_logp=vllm"])
    with pytest.raises(ConfigError, match=r"rollout: .*oversample \(2.0\) > 1 needs dynamic_sampling"):
        load_config(None, ["rollout.oversample=2.0"])
    assert load_config(None, ["rollout.oversample=1.5", "rollout.dynamic_sampling=true",
                              "rollout.questions_per_batch=8", "optim.mini_batch_size=8"]).rollout.questions_drawn == 12
    with pytest.raises(ConfigError, match=r"warmup\.data: .*does not exist"):
        load_config(None, [f"warmup.data={tmp_path / 'missing.jsonl'}"])


def test_override_errors_name_the_override(tmp_path):
    with pytest.raises(ConfigError, match=r"override 'algorithm\.grpo\.nope=1'"):
        load_config(None, ["algorithm.grpo.nope=1"])
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load_config(None, ["run.rounds"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["run.rounds=3", "run.rounds.x=1"])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3: invalid YAML"):
        load_config(write(tmp_path, "run:\n  rounds: 1\n\tseed: 2\n", "bad.yaml"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_dump_round_trips_including_infinite_gamma(tmp_path):
    cfg = load_config(None, ["algorithm.retriever.gamma=.inf", "run.seed=7"])
    again = load_config(write(tmp_path, dump_config(cfg)))
    assert again == cfg and math.isinf(again.algorithm.retriever.gamma)
    assert Config() == load_config()


def test_a_dump_beside_a_prebuilt_index_keeps_only_the_build_keys_it_set(tmp_path):
    """Build-only keys beside ``retrieval.index.dir`` are checked against its manifest: a dump must not turn their
    defaults into settings."""
    cfg = load_config(None, [f"retrieval.index.dir={tmp_path}", "retrieval.index.num_shards=8"])
    dumped = dump_config(cfg)
    assert "num_shards: 8" in dumped and "index_type" not in dumped and "hnsw_m" not in dumped
    again = load_config(write(tmp_path, dumped))
    assert again == cfg and again.retrieval.index.build_keys_set() == {"num_shards": 8}
    assert "index_type: flat" in dump_config(load_config()), "a bundled world's index is built from them"


def test_cli_config_command(tmp_path, capsys):
    assert main(["config", "run.rounds=2"]) == 0
    assert "rounds: 2" in capsys.readouterr().out
    assert main(["config", "run.roundz=2"]) == 2
    assert "run.roundz" in capsys.readouterr().err


def test_module_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "bridge_ray", "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("command", [*COMMANDS, *(f"bench {name}" for name in BENCHMARKS)])
def test_every_command_has_help(command, capsys):
    """argparse %-formats each sub-command's help: a bare % (``bench paired``'s "95% interval") broke ``--help``."""
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out


def test_every_shipped_config_validates():
    from pathlib import Path

    configs = sorted(Path(__file__).resolve().parents[2].joinpath("jobs", "configs").glob("*.yaml"))
    assert configs, "jobs/configs holds the presets"
    for path in configs:
        load_config(path)


def test_train_resume_flags_leave_overrides_alone():
    from bridge_ray.cli import build_parser

    args = build_parser().parse_args(["train", "--config", "x.yaml", "--resume", "run.rounds=3"])
    assert args.resume and not args.auto_resume and args.overrides == ["run.rounds=3"]
    args = build_parser().parse_args(["train", "--config", "x.yaml", "--auto-resume", "run.rounds=3"])
    assert args.auto_resume and args.overrides == ["run.rounds=3"]


def test_a_preset_loads_on_top_of_another_base_in_place_of_its_own(tmp_path):
    """``bench learn --config F``: each schedule preset on top of F, not of the file its ``base:`` names."""
    write(tmp_path, "run:\n  rounds: 7\n  seed: 3\n", "default.yaml")
    write(tmp_path, "base: default.yaml\nrun:\n  rounds: 9\n", "gap.yaml")
    preset = write(tmp_path, "base: default.yaml\nalgorithm:\n  train_retriever: false\n", "fixed.yaml")
    assert load_config(preset).run.rounds == 7
    rebased = load_config(preset, base=tmp_path / "gap.yaml")
    assert (rebased.run.rounds, rebased.run.seed, rebased.algorithm.train_retriever) == (9, 3, False)
    bad = write(tmp_path, "base: default.yaml\nrun:\n  roundz: 1\n", "bad.yaml")
    with pytest.raises(ConfigError, match=r"bad.yaml:3"):
        load_config(bad, base=tmp_path / "gap.yaml")
    with pytest.raises(ConfigError, match="makes a cycle"):
        load_config(preset, base=preset)
