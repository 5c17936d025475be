"""The presets of the paper's settings that no recipe test runs, loaded through the real config loader (bases,
relative paths and validation included) and checked value by value against the paper: the medical training of
Table 2 (Appendix "Medical QA", "Training details") and the k = 10 reading of the open-domain k; on CPU, every
bench learn preset, the paper's retriever loss (bridge_paper), one ablation per departure of the gap config, and a
"not in the paper:" label on every departure of the CPU configs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from bridge_ray.config import Config, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "jobs/configs"
MEDICAL = {"bridge": "qwen2.5-7b-medical-bridge.yaml", "vt-search": "qwen2.5-7b-medical-fixed-retriever.yaml"}

# Every value the medical appendix states, by the key that carries it.
APPENDIX = {
    "policy.model": "Qwen/Qwen2.5-7B",  # "initialized all baselines and BRIDGE from Qwen2.5-7B-Base"
    "algorithm.grpo.rollouts_per_question": 16,  # "16 sampled trajectories per question"
    "algorithm.grpo.clip_low": 0.2,  # "a clipping ratio of 0.2"
    "algorithm.grpo.clip_high": 0.2,
    "algorithm.grpo.kl_coef": 1e-4,
    "algorithm.retriever.gamma": 0.25,
    "algorithm.retriever.retrieval_temperature": 0.4,
    "algorithm.retriever.posterior_temperature": 0.5,
    "algorithm.retriever.num_candidates": 40,  # k
    "algorithm.retriever.num_shown": 3,  # m
    "algorithm.retriever.lr": 1e-5,
    "rollout.questions_per_batch": 512,
    "rollout.temperature": 1.0,
    "rollout.max_prompt_length": 4096,  # "prompt, response, action, and observation lengths as 4,096, 4,096,
    "rollout.max_response_length": 4096,  # 2,048, and 1,024 tokens, respectively"
    "rollout.max_action_length": 2048,
    "rollout.max_observation_length": 1024,
    "optim.lr": 1e-6,
    "optim.mini_batch_size": 64,
    "run.rounds": 100,  # "we train each method for 100 steps"
    "retrieval.encoder.name": "intfloat/e5-base-v2",
    "retrieval.lora.rank": 16,
    "retrieval.lora.alpha": 16.0,
}


def value(config: Config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("method", sorted(MEDICAL))
def test_medical_training_preset_has_every_appendix_value(method):
    config = load_config(CONFIGS / MEDICAL[method])
    assert {key: value(config, key) for key in APPENDIX} == APPENDIX
    assert config.algorithm.train_retriever is (method == "bridge"), "VT-Search keeps the retriever fixed"
    assert config.algorithm.train_policy and config.algorithm.estimator == "bridge" and not config.stages
    assert config.algorithm.grpo.loss_agg == "turn-mean" and config.algorithm.grpo.kl_kind == "k3"
    # "the same training split containing 169,615 examples from NQ and HotpotQA": prepare-data's training file
    assert [Path(p).name for p in config.data.train] == ["nq_hotpotqa_train.parquet"]


def test_medical_eval_preset_names_the_training_runs_checkpoints():
    """The eval preset's command evaluates each training preset's checkpoints, under the same retriever shape."""
    text = (CONFIGS / "qwen2.5-7b-medical-eval.yaml").read_text()
    named = dict(re.findall(r"--checkpoint (\S+)=(\S+)/checkpoints", text))
    trained = {method: load_config(CONFIGS / name) for method, name in MEDICAL.items()}
    assert named == {method: config.run.output_dir for method, config in trained.items()}
    assert len(set(named.values())) == len(MEDICAL), "each method writes its own folder"
    evaluation = load_config(CONFIGS / "qwen2.5-7b-medical-eval.yaml")
    for config in trained.values():
        assert evaluation.retrieval.encoder == config.retrieval.encoder
        assert evaluation.retrieval.lora == config.retrieval.lora
        assert evaluation.algorithm.retriever.num_shown == config.algorithm.retriever.num_shown
        assert evaluation.policy.model == config.policy.model


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_k10_preset_is_its_parent_but_for_k(size):
    """Both readings of the open-domain k run by preset: the parent's k = 40 and this sibling's k = 10."""
    parent = load_config(CONFIGS / f"qwen2.5-{size}-bridge.yaml")
    k10 = load_config(CONFIGS / f"qwen2.5-{size}-bridge-k10.yaml")
    assert (parent.algorithm.retriever.num_candidates, k10.algorithm.retriever.num_candidates) == (40, 10)
    assert k10.run.output_dir != parent.run.output_dir
    differs = {"algorithm": {"retriever": {"num_candidates"}}, "run": {"output_dir"}}
    assert k10.model_dump(exclude=differs) == parent.model_dump(exclude=differs)


# The paper's open-domain setting (Appendix B "Policy training" and "Retriever optimization", Algorithm 1), by the
# key that carries it: where jobs/configs/local_cpu*.yaml leave it, their line says "not in the paper:".
PAPER = {
    "algorithm.estimator": "bridge",
    "algorithm.grpo.rollouts_per_question": 8,  # "8 sampled trajectories per question"
    "algorithm.grpo.clip_low": 0.2,  # "a clipping ratio of 0.2"
    "algorithm.grpo.clip_high": 0.2,
    "algorithm.grpo.kl_coef": 1e-4,  # "a KL coefficient of 10^-4"
    "algorithm.grpo.loss_agg": "turn-mean",  # eq. grpo
    "algorithm.grpo.old_logp": "learner",  # not stated; verl-tool, which the paper builds on, recomputes π_old
    "algorithm.retriever.gamma": 0.25,
    "algorithm.retriever.retrieval_temperature": 0.4,
    "algorithm.retriever.posterior_temperature": 0.5,
    "algorithm.retriever.num_candidates": 40,  # k, the one value stated (docs/reproducing.md)
    "algorithm.retriever.num_shown": 3,
    "algorithm.retriever.candidates": "adapted",  # ρ_η ranks what η_r = η_0 + AB retrieves (Algorithm 1)
    "algorithm.retriever.kl_coef": 0.0,  # the loss is eq. eta_loss alone
    "algorithm.retriever.lr": 1e-5,  # "the retriever learning rate is 10^-5"
    "algorithm.retriever.inner_steps": 1,  # one step of eq. eta_loss per round
    "algorithm.retriever.turns": "all",
    "algorithm.retriever.turn_weight": "uniform",
    "rollout.questions_per_batch": 512,
    "rollout.temperature": 1.0,
    "rollout.max_turns": 2,
    "rollout.max_prompt_length": 4096,
    "rollout.max_response_length": 4096,
    "rollout.max_action_length": 2048,
    "rollout.max_observation_length": 1024,
    "rollout.dynamic_sampling": False,
    "policy.model": "Qwen/Qwen2.5-3B",
    "optim.lr": 1e-6,
    "optim.mini_batch_size": 64,
    "learner.lora.enabled": False,  # the policy is fine-tuned whole
    "warmup.enabled": False,  # RL from the base model
    "retrieval.encoder.name": "intfloat/e5-base-v2",
    "retrieval.lora.rank": 16,
    "retrieval.lora.alpha": 16.0,
    "run.rounds": 250,  # "250 steps"
}
LOCAL_CPU = CONFIGS / "presets/local_cpu"
GAP = CONFIGS / "local_cpu_gap.yaml"
# What each ablate_<name>.yaml switches back in the gap config: the paper's values, but for the retriever's step
# (the paper's summed step over our rounds) and the full fine-tune's lr (variants/local_cpu_policy/full.yaml's).
ABLATED = {
    "trust_region": {"algorithm.retriever.kl_coef"},
    "candidates": {"algorithm.retriever.candidates"},
    "retriever_step": {"algorithm.retriever.lr", "algorithm.retriever.inner_steps"},
    "rollouts": {"algorithm.grpo.rollouts_per_question"},
    "dynamic_sampling": {"rollout.dynamic_sampling"},
    "policy_lora": {"learner.lora.enabled", "optim.lr"},
    "policy_kl": {"algorithm.grpo.kl_coef"},
    "old_logp": {"algorithm.grpo.old_logp"},
}
SCALED = {"algorithm.retriever.lr", "optim.lr"}  # not the paper's value: checked on their own


def flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, item in data.items():
        out |= flat(item, f"{prefix}{key}.") if isinstance(item, dict) and item else {f"{prefix}{key}": item}
    return out


def over_gap(name: str) -> dict:
    """A preset's run as bench learn --config local_cpu_gap.yaml loads it, its folder left out."""
    settings = flat(load_config(LOCAL_CPU / f"{name}.yaml", base=GAP).model_dump())
    settings.pop("run.output_dir")
    return settings


def changed(name: str) -> dict:
    bridge = over_gap("bridge")
    return {key: item for key, item in over_gap(name).items() if item != bridge[key]}


def test_every_local_cpu_preset_passes_the_checks_bench_learn_runs_first(tmp_path):
    """Every preset file loads on its own base and over the gap config, and passes train's checks there."""
    from bridge_ray.bench.learn import add_arguments, preset_files, sweep_of

    names = sorted(path.stem for path in LOCAL_CPU.glob("*.yaml"))
    for name in names:
        load_config(LOCAL_CPU / f"{name}.yaml")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", str(GAP), "--preset-dir", str(LOCAL_CPU), "--presets", ",".join(names),
                              "--rounds", "8", "--out", str(tmp_path / "out")])
    sweep_of(args, preset_files(args)).check_runs()


def test_bench_learn_help_names_every_preset_file():
    from bridge_ray.bench.learn import ABLATIONS, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = next(action.help for action in parser._actions if action.dest == "presets")
    names = {path.stem for path in LOCAL_CPU.glob("*.yaml")}
    assert {name for name in names if name.startswith("ablate_")} == {f"ablate_{name}" for name in ABLATIONS}
    assert set(ABLATIONS) == set(ABLATED)
    assert all(re.search(rf"\b{name.removeprefix('ablate_')}\b", help_text) for name in names)


@pytest.mark.parametrize("name", sorted(ABLATED))
def test_each_ablation_switches_one_departure_of_the_gap_config_back(name):
    """bridge − ablate_<name> is what that one departure changes: the preset differs from bridge over the gap
    config in its keys alone, each a departure there, each set back to the paper's value."""
    gap = flat(load_config(GAP).model_dump())
    diff = changed(f"ablate_{name}")
    assert set(diff) == ABLATED[name]
    assert all(gap[key] != PAPER[key] for key in diff), "each switched key departs in the gap config"
    assert {key: item for key, item in diff.items() if key not in SCALED} == {
        key: PAPER[key] for key in diff if key not in SCALED}
    if name == "policy_lora":
        assert diff["optim.lr"] == load_config(CONFIGS / "variants/local_cpu_policy/full.yaml").optim.lr


def test_bridge_paper_is_bridge_with_the_paper_retriever_loss():
    """No trust region, the adapted query's candidates, one step a round, and the paper's summed step (lr × steps ×
    rounds) over the gap config's rounds; every other key as bridge's."""
    diff = changed("bridge_paper")
    step = {"algorithm.retriever.kl_coef", "algorithm.retriever.candidates", "algorithm.retriever.inner_steps"}
    assert set(diff) == step | {"algorithm.retriever.lr"}
    assert {key: diff[key] for key in step} == {key: PAPER[key] for key in step}
    summed = PAPER["algorithm.retriever.lr"] * PAPER["algorithm.retriever.inner_steps"] * PAPER["run.rounds"]
    assert diff["algorithm.retriever.lr"] * diff["algorithm.retriever.inner_steps"] * load_config(GAP).run.rounds == (
        pytest.approx(summed))
    assert changed("ablate_retriever_step")["algorithm.retriever.lr"] == diff["algorithm.retriever.lr"]


def test_bench_learn_pairs_bridge_with_the_paper_loss_arm_and_both_with_fixed():
    from bridge_ray.sweep.paired import paired_rows

    def tables(ems: list[int]) -> dict:
        return {"gap": {"questions": {"gap": {"uid": ["a", "b", "c"], "em": ems, "recall": [1.0, 0.0, 1.0]}}}}

    last = {(preset, seed): tables(ems) for seed in (0, 1)
            for preset, ems in [("fixed", [0, 0, 1]), ("bridge", [1, 0, 1]), ("bridge_paper", [0, 1, 1])]}
    pairs = {(row["preset"], row["baseline"], row["seed"]) for row in paired_rows(last, ["gap"])}
    assert pairs == {(*pair, seed) for pair in [("bridge", "fixed"), ("bridge_paper", "fixed"),
                                                ("bridge", "bridge_paper")] for seed in (0, 1, "all")}


def key_lines(path: Path) -> dict[str, int]:
    """Each scalar key the YAML file sets -> its line (0-based)."""
    def walk(node, prefix: str) -> dict[str, int]:
        lines = {}
        for key, item in node.value:
            name = f"{prefix}{key.value}"
            lines |= walk(item, f"{name}.") if isinstance(item, yaml.MappingNode) else {name: key.start_mark.line}
        return lines

    return walk(yaml.compose(path.read_text()), "")


@pytest.mark.parametrize("name", ["local_cpu.yaml", "local_cpu_gap.yaml"])
def test_every_departure_of_the_cpu_configs_is_labelled(name):
    """A key of PAPER that the file sets to another value says "not in the paper:" on its line; every departure of
    the resolved config is set (and so labelled) in the file or the file it builds on."""
    path = CONFIGS / name
    settings = flat(load_config(path).model_dump())
    labelled = set()
    for file in {path, CONFIGS / "local_cpu.yaml"}:
        lines, lines_text = key_lines(file), file.read_text().splitlines()
        for key, line in lines.items():
            if key in PAPER and yaml.safe_load(lines_text[line].split(":", 1)[1].split("#")[0]) != PAPER[key]:
                comment = lines_text[line].split("#", 1)[1].strip() if "#" in lines_text[line] else ""
                assert comment.startswith("not in the paper:"), f"{file.name}:{line + 1}: {key}"
                labelled.add(key)
    assert {key for key in PAPER if settings[key] != PAPER[key]} <= labelled
