"""The presets of the paper's settings that no recipe test runs, loaded through the real config loader (bases,
relative paths and validation included) and checked value by value against the paper: the medical training of
Table 2 (Appendix "Medical QA", "Training details") and the k = 10 reading of the open-domain k."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
