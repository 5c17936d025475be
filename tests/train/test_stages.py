"""A two-stage schedule through the real ``train`` command: a retriever-only stage (γ = inf, frozen policy), then a
policy-only stage from its checkpoint (fixed adapter); a re-run skips both.

The random tiny policy almost never writes a search, and the retriever only learns from searches, so this test
builds a tiny policy that always searches: its layers add nothing to the residual stream and its (untied) LM head
maps each token of ``<search> capital </search>`` to the next, starting after the prompt's and an observation's
last token. The entropy bonus gives the policy a gradient although every reward is 0, so the frozen stage would
change the weights if it trained them.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from job_fixtures import LOCAL_CPU, SMALL_JOB, job_config, save_tiny_tokenizer, tiny_gemma3_config

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.coordinator.phases import POLICY_UPDATE, RETRIEVER_UPDATE, ROLLOUT, read_phases
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.retrieval.encoder import QueryEncoder

pytestmark = pytest.mark.slow

STAGES = "stages=[{name: rag, train: retriever, gamma: .inf, rounds: 1}, {name: rl, train: policy, rounds: 1}]"


def save_searching_policy(path: Path, config) -> Path:
    """A 2-layer Gemma 3 (hidden 32, the tiny tokenizer) whose every turn is ``<search> capital </search>``."""
    from transformers import Gemma3ForCausalLM

    from bridge_ray.agent.prompt import PromptTemplate, prompt_token_ids
    from bridge_ray.agent.protocol import ObservationRenderer

    tokenizer = save_tiny_tokenizer(path)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(tiny_gemma3_config(tokenizer, tie_word_embeddings=False))
    renderer = ObservationRenderer(tokenizer, config.rollout.max_observation_length)
    prompt = prompt_token_ids(tokenizer, PromptTemplate.load(config.policy.prompt_template), "Who?",
                              config.rollout.max_turns, config.policy.chat_template)
    action = tokenizer("<search> capital </search>", add_special_tokens=False).input_ids
    turn_starts = {prompt[-1], renderer.close_ids[-1], renderer.corrective_ids[-1]}
    successor = {token: action[0] for token in turn_starts} | dict(pairwise(action[:-1]))
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream is the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        for dim, (token, following) in enumerate(successor.items()):
            model.model.embed_tokens.weight[token] = torch.nn.functional.one_hot(torch.tensor(dim), 32).float()
            model.lm_head.weight[following, dim] = 25.0 / 32**0.5  # a logit of 25 over the other tokens' 0
    model.save_pretrained(path)
    return path


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_causal_lm(str(path)).state_dict()


def _phases(stage: Path) -> set[str]:
    return {r.phase for r in read_phases(stage / "phases.jsonl")}


def _first_draw(stage: Path) -> tuple[list[str], list[int]]:
    """The questions and sampler seeds of a stage's first round."""
    rollout = next(r for r in read_phases(stage / "phases.jsonl") if r.phase == ROLLOUT)
    return rollout.info["question_ids"], rollout.info["sampler_seeds"]


def test_a_retriever_stage_then_a_policy_stage_and_a_rerun_skips_both(local_ray, tmp_path, capsys):
    out = tmp_path / "run"
    policy = save_searching_policy(tmp_path / "searcher", job_config(out))
    args = ["train", "--config", str(LOCAL_CPU), f"run.output_dir={out}", *SMALL_JOB, f"policy.model={policy}",
            "algorithm.grpo.kl_coef=0.0", "algorithm.grpo.entropy_coef=0.01", "telemetry.wandb_mode=disabled",
            "checkpoint.keep=1", STAGES]
    assert main(args) == 0
    rag, rl = json.loads((out / "stages.json").read_text())["stages"]
    assert (rag["name"], rag["train"], rag["gamma"], rl["name"], rl["train"]) == ("rag", "retriever", "inf", "rl",
                                                                                  "policy")
    rag_dir, rl_dir = out / "stages" / "rag", out / "stages" / "rl"
    assert Path(rag["checkpoint"]) == rag_dir / "checkpoints" / "round-00000001"

    # stage 1 trains the adapter on the frozen policy's searches
    assert _phases(rag_dir) >= {RETRIEVER_UPDATE} and POLICY_UPDATE not in _phases(rag_dir)
    update = next(r for r in read_phases(rag_dir / "phases.jsonl") if r.phase == RETRIEVER_UPDATE)
    assert update.info["turns"] > 0
    start, after_rag = _weights(policy), _weights(Path(rag["policy"]))
    assert all(torch.equal(start[k], after_rag[k]) for k in start), "the frozen policy did not move"
    assert rag["adapter"] == str(Path(rag["checkpoint"]) / "retriever_adapter")
    adapter = QueryEncoder.from_config(load_config(None).retrieval, rag["adapter"]).adapter_state_dict()
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k), "a fresh adapter has B = 0"

    # stage 2 starts from stage 1's policy and adapter, trains the policy, keeps the adapter
    served = load_config(rl_dir / "config.yaml")
    assert served.policy.model == rag["policy"] and served.retrieval.encoder.adapter == rag["adapter"]
    assert not served.algorithm.train_retriever and not served.warmup.enabled
    assert served.run.continue_from == rag["checkpoint"]
    (rag_ids, rag_seeds), (rl_ids, rl_seeds) = _first_draw(rag_dir), _first_draw(rl_dir)
    assert not set(rag_ids) & set(rl_ids) and rag_seeds != rl_seeds, "stage 2 draws after stage 1, not again"
    for key, value in QueryEncoder.from_config(served.retrieval).adapter_state_dict().items():
        assert torch.equal(value, adapter[key]), "the samplers' encoder loads stage 1's adapter"
    assert POLICY_UPDATE in _phases(rl_dir) and RETRIEVER_UPDATE not in _phases(rl_dir)
    after_rl = _weights(Path(rl["policy"]))
    assert any(not torch.equal(after_rag[k], after_rl[k]) for k in after_rag), "the policy trained"
    assert rl["adapter"] == rag["adapter"], "the adapter stayed fixed"
    assert not (Path(rl["checkpoint"]) / "retriever_adapter").exists()

    # a re-run finds both stages finished and trains nothing
    lines = {d: len((d / "phases.jsonl").read_text().splitlines()) for d in (rag_dir, rl_dir)}
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "stage rag: finished" in printed and "stage rl: finished" in printed
    assert {d: len((d / "phases.jsonl").read_text().splitlines()) for d in lines} == lines
