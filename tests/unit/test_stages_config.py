"""Schedules in the config: ``stages:``, ``algorithm.train_policy``, ``retrieval.encoder.adapter``, a preset's ``base:``
file, every shipped preset, and how a stage's run config and record are derived (no Ray)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bridge_ray.bench.learn import ABLATIONS
from bridge_ray.config import ConfigError, load_config
from bridge_ray.errors import InputError
from bridge_ray.train.stages import StageLog, StageRecord, StartPoint, checkpoint_start, stage_config

PRESETS = Path(__file__).resolve().parents[2] / "jobs" / "configs" / "presets"
SCHEDULES = ("fixed", "bridge", "decoupled_rl", "decoupled_rag", "rag_then_rl", "rl_then_rag")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def adapter_dir(path: Path) -> Path:
    write(path / "adapter_config.json", "{}")
    write(path / "adapter_model.safetensors", "")
    return path


def test_frozen_policy_and_fixed_retriever_together_name_both_keys(tmp_path):
    assert not load_config(None, ["algorithm.train_policy=false"]).algorithm.train_policy
    path = write(tmp_path / "c.yaml", "algorithm:\n  train_retriever: false\n  train_policy: false\n")
    with pytest.raises(ConfigError, match=r"algorithm: train_policy and train_retriever are both false.*"
                                          rf"\[{path}:3, {path}:2\]"):
        load_config(path)


def test_stage_keys_are_validated_with_their_place(tmp_path):
    path = write(tmp_path / "c.yaml", "stages:\n  - {name: a, train: retriever, rounds: 2}\n"
                                      "  - {name: b, train: policy, rounds: 1, gama: 1}\n")
    with pytest.raises(ConfigError, match=rf"stages\.1\.gama: unknown key \(did you mean 'gamma'\?\) \[{path}:3\]"):
        load_config(path)
    bad = {
        "stages=[{name: a, train: policy, gamma: 1, rounds: 1}]": r"stages\.0: gamma is set but train is 'policy'",
        "stages=[{name: a, train: all, rounds: 1}]": r"stages\.0\.train: Input should be 'policy', 'retriever'",
        "stages=[{name: a, train: both, rounds: 0}]": r"stages\.0\.rounds: Input should be greater than or equal to 1",
        "stages=[{name: ../a, train: both, rounds: 1}]": r"stages\.0\.name: String should match pattern",
        "stages=[{name: a, train: both}]": r"stages\.0\.rounds: Field required",
        "stages=[{name: a, train: both, rounds: 1}, {name: a, train: policy, rounds: 1}]": "names must be unique",
        "stages=[{name: a, train: both, rounds: 1, gamma: -1}]": r"stages\.0\.gamma: Input should be greater than",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override])


def test_an_override_addresses_one_stage_by_its_index():
    preset = PRESETS / "local_cpu" / "rag_then_rl.yaml"
    config = load_config(preset, ["stages.1.rounds=5", "stages.2.gamma=.inf", "stages.2.train=both"])
    assert [s.rounds for s in config.stages] == [2, 5, 2] and math.isinf(config.stages[2].gamma)
    with pytest.raises(ConfigError, match=r"override 'stages\.3\.rounds=1': stages has items 0 to 2, not '3'"):
        load_config(preset, ["stages.3.rounds=1"])
    with pytest.raises(ConfigError, match=r"stages has no items, not '0'"):
        load_config(None, ["stages.0.rounds=1"])
    with pytest.raises(ConfigError, match=r"stages\.1\.roundz: unknown key .*\[override 'stages\.1\.roundz=2'\]"):
        load_config(preset, ["stages.1.roundz=2"])
    with pytest.raises(ConfigError, match=r"stages\.1\.gamma: .*greater than or equal to 0.*\[override"):
        load_config(preset, ["stages.1.gamma=-1"])


def test_a_stage_is_checked_with_the_algorithm_it_sets():
    with pytest.raises(ConfigError, match=r"stages\.0 \(rl\): with train 'policy': estimator 'drop' needs "
                                          r"train_retriever: true"):
        load_config(None, ["algorithm.estimator=drop", "stages=[{name: rl, train: policy, rounds: 1}]"])
    config = load_config(None, ["stages=[{name: rag, train: retriever, gamma: .inf, rounds: 3}]"])
    algorithm = config.stages[0].algorithm(config.algorithm)
    assert (algorithm.train_policy, algorithm.train_retriever) == (False, True)
    assert math.isinf(algorithm.retriever.gamma) and config.algorithm.retriever.gamma == 0.25


def test_encoder_adapter_must_be_a_peft_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"retrieval\.encoder\.adapter: .* is not a peft adapter directory"):
        load_config(None, [f"retrieval.encoder.adapter={tmp_path}"])
    path = write(tmp_path / "c.yaml", "retrieval:\n  encoder:\n    adapter: ad\n")
    adapter_dir(tmp_path / "ad")
    assert load_config(path).retrieval.encoder.adapter == str(tmp_path / "ad"), "relative to the file"


def test_base_file_merges_sections_and_errors_name_the_file_that_set_the_key(tmp_path):
    write(tmp_path / "base.yaml", "run:\n  rounds: 3\n  seed: 4\ndata:\n  train: [a.jsonl]\n"
                                  "rollout:\n  max_turns: 0\n")
    preset = write(tmp_path / "presets" / "p.yaml", "base: ../base.yaml\nrun:\n  rounds: 5\n"
                                                    "rollout:\n  max_turns: 3\n")
    config = load_config(preset)
    assert (config.run.rounds, config.run.seed, config.rollout.max_turns) == (5, 4, 3)
    assert config.data.train == [str(tmp_path / "a.jsonl")], "the base's paths are relative to the base"
    write(preset, "base: ../base.yaml\nrun:\n  seed: -1\n  rounds: 0\n")
    with pytest.raises(ConfigError) as error:
        load_config(preset)
    assert f"run.rounds: Input should be greater than or equal to 1 [{preset}:4]" in str(error.value)
    assert f"rollout.max_turns: Input should be greater than or equal to 1 [{tmp_path / 'base.yaml'}:7]" in str(
        error.value)
    write(preset, "base: ../base.yaml\nrollout: {max_turns: 2}\ndata:\n  train: []\n")
    assert load_config(preset).data.train == [], "a list replaces the base's"


def test_bad_base_references_name_the_file_and_line(tmp_path):
    cases = {
        "run:\n  rounds: 2\nbase: missing.yaml\n": r"p\.yaml:3: base config file .*missing\.yaml does not exist",
        "base: [a]\n": r"p\.yaml:1: base must be the path of another config file",
        "base: p.yaml\n": r"p\.yaml:1: base 'p\.yaml' makes a cycle",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(write(tmp_path / "p.yaml", text))
    write(tmp_path / "q.yaml", "base: p.yaml\n")
    with pytest.raises(ConfigError, match=r"q\.yaml:1: base 'p\.yaml' makes a cycle \(.*p\.yaml -> .*q\.yaml -> "):
        load_config(write(tmp_path / "p.yaml", "base: q.yaml\n"))


@pytest.mark.parametrize("setting", ["local_cpu", "qwen2.5-3b"])
def test_every_schedule_preset_loads_and_is_its_schedule(setting):
    files = sorted(p.stem for p in (PRESETS / setting).glob("*.yaml"))
    # the CPU setting also holds the paper-loss arm and one ablation per departure (tests/cluster/test_paper_presets.py)
    extra = ["bridge_paper", *(f"ablate_{name}" for name in ABLATIONS)] if setting == "local_cpu" else []
    assert files == sorted([*SCHEDULES, *extra])
    c = {name: load_config(PRESETS / setting / f"{name}.yaml") for name in SCHEDULES}
    assert not c["fixed"].algorithm.train_retriever and not c["fixed"].stages
    assert c["bridge"].algorithm.train_retriever and 0 < c["bridge"].algorithm.retriever.gamma < math.inf
    assert c["decoupled_rl"].algorithm.retriever.gamma == 0 and c["decoupled_rl"].algorithm.train_retriever
    assert math.isinf(c["decoupled_rag"].algorithm.retriever.gamma) and c["decoupled_rag"].algorithm.train_retriever
    for name, order in (("rag_then_rl", ["policy", "retriever", "policy"]),
                        ("rl_then_rag", ["policy", "policy", "retriever"])):
        stages = c[name].stages
        assert [s.train for s in stages] == order and all(s.start == "previous" for s in stages)
        assert stages[0].rounds == c["fixed"].run.rounds, "stage 0 is the fixed-retriever baseline's run"
        assert [math.isinf(s.gamma) for s in stages if s.train == "retriever"] == [True]
    outputs = {config.run.output_dir for config in c.values()}
    assert len(outputs) == len(SCHEDULES), "each schedule writes its own folder"


def test_stage_config_starts_where_the_previous_stage_ended(tmp_path):
    config = load_config(None, [f"run.output_dir={tmp_path / 'out'}", "warmup.enabled=true", "run.rounds=9",
                                "eval.before_training=true",
                                "stages=[{name: rag, train: retriever, gamma: .inf, rounds: 2}, "
                                "{name: rl, train: policy, rounds: 3}]"])
    first = stage_config(config, 0, None)
    assert first.run.output_dir == str(tmp_path / "out" / "stages" / "rag") and first.run.rounds == 2
    assert first.warmup.enabled and first.eval.before_training and first.stages == []
    assert not first.algorithm.train_policy and math.isinf(first.algorithm.retriever.gamma)
    assert first.run.continue_from is None, "the first stage's question order starts at run.seed"
    adapter = str(adapter_dir(tmp_path / "ckpt" / "retriever_adapter"))
    second = stage_config(config, 1, StartPoint(str(tmp_path / "ckpt" / "policy"), adapter, str(tmp_path / "ckpt")))
    assert (second.policy.model, second.retrieval.encoder.adapter) == (str(tmp_path / "ckpt" / "policy"), adapter)
    assert second.run.continue_from == str(tmp_path / "ckpt"), "it continues the question order of its start"
    assert not second.warmup.enabled and not second.eval.before_training and second.run.rounds == 3
    assert second.algorithm.train_policy and not second.algorithm.train_retriever


def test_stage_log_records_finished_stages_and_refuses_a_changed_definition(tmp_path):
    config = load_config(None, ["stages=[{name: rag, train: retriever, gamma: .inf, rounds: 2}]"])
    checkpoint = tmp_path / "round-00000002"
    adapter_dir(checkpoint / "retriever_adapter")
    (checkpoint / "policy").mkdir()
    assert checkpoint_start(checkpoint) == StartPoint(str(checkpoint / "policy"),
                                                      str(checkpoint / "retriever_adapter"), str(checkpoint))
    log = StageLog(tmp_path)
    assert log.finished(config.stages[0]) is None
    log.add(StageRecord.of(config.stages[0], checkpoint, None), ["rag"])
    saved = json.loads((tmp_path / "stages.json").read_text())["stages"]
    assert saved[0]["gamma"] == "inf" and saved[0]["checkpoint"] == str(checkpoint)
    assert StageLog(tmp_path).finished(config.stages[0]).adapter == str(checkpoint / "retriever_adapter")
    changed = load_config(None, ["stages=[{name: rag, train: retriever, gamma: 1, rounds: 2}]"])
    with pytest.raises(InputError, match=r"stage 'rag' finished as .*'gamma': 'inf'.* --overwrite"):
        StageLog(tmp_path).finished(changed.stages[0])
    (tmp_path / "stages.json").write_text("[]")
    with pytest.raises(InputError, match="not a stages record"):
        StageLog(tmp_path)
