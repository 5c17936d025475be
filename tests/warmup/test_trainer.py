"""The warm-up stage: SFT on action tokens only, frozen embeddings, and a content-hashed cache entry."""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path

import pytest
import torch
from job_fixtures import job_config

from bridge_ray.config import Config, ConfigError, load_config
from bridge_ray.data.world import load_split
from bridge_ray.engines import precision
from bridge_ray.engines.models import load_causal_lm
from bridge_ray.warmup.trainer import (
    action_nll,
    build_demonstrations,
    decision_offset,
    decision_weights,
    freeze_embeddings,
    train_on_demonstrations,
    warmed_up_policy,
    warmup_key,
    warmup_precision,
    warmup_sources,
)


def test_action_nll_ignores_observation_and_prompt_tokens():
    logp = torch.tensor([[0.0, -1.0, -5.0, -3.0], [0.0, -2.0, -9.0, -9.0]])
    mask = torch.tensor([[0, 1, 0, 1], [0, 1, 0, 0]])
    assert action_nll(logp, mask).item() == pytest.approx((1 + 3 + 2) / 3)


def test_decision_weights_weigh_each_actions_choice_token():
    """Token ``offset`` of every action segment (after prompt or observation) gets the weight; an action too short
    to reach it gets none; weight 1 is the action mask."""
    mask = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 1, 0], [0, 0, 1, 0, 1, 1, 1, 1, 0, 0]])
    assert decision_weights(mask, 1, 5.0).tolist() == [
        [0, 1, 5, 1, 0, 0, 1, 5, 1, 0], [0, 0, 1, 0, 1, 5, 1, 1, 0, 0]]
    assert decision_weights(mask, 0, 3.0)[1].tolist() == [0, 0, 3, 0, 3, 1, 1, 1, 0, 0]
    assert torch.equal(decision_weights(mask, 1, 1.0), mask.float())
    logp = -torch.arange(20.0).reshape(2, 10)
    weights = decision_weights(mask, 1, 5.0)
    assert action_nll(logp, weights).item() == pytest.approx(-(logp * weights).sum().item() / weights.sum().item())


def test_decision_offset_is_where_the_search_and_answer_tags_part(tiny_policy):
    from bridge_ray.engines.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_policy))
    offset = decision_offset(tokenizer)
    assert offset == 1, "Gemma 3 writes both tags as '<', then 'search' or 'answer', then '>'"
    search, answer = (tokenizer(t, add_special_tokens=False).input_ids for t in ("<search>", "<answer>"))
    assert search[:offset] == answer[:offset] and search[offset] != answer[offset]


def test_the_decision_weight_trains_another_warmup_under_another_key(warmup_job):
    """``warmup.decision_weight`` reaches the loss (another first loss, other weights) and the cache key. The weighted
    warm-up is ``warmup_job``'s own, built by ``first_warmup``."""
    plain, weighted = (warmup_job.model_copy(update={"warmup": warmup_job.warmup.model_copy(
        update={"decision_weight": weight})}) for weight in (1.0, 8.0))  # whatever local_cpu.yaml sets
    assert warmup_key(weighted, "m", {}) != warmup_key(plain, "m", {})
    paths = [warmed_up_policy(job, log=lambda _: None) for job in (plain, weighted)]
    summaries = [json.loads((p / "warmup.json").read_text()) for p in paths]
    assert [s["config"]["decision_weight"] for s in summaries] == [1.0, 8.0]
    assert summaries[0]["first_loss"] != summaries[1]["first_loss"]
    light, heavy = (load_causal_lm(str(p)).state_dict() for p in paths)
    proj = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(light[proj], heavy[proj])


def _warmup_job(run: Path, tiny_policy: Path) -> Config:
    return job_config(run, f"policy.model={tiny_policy}", "warmup.examples=6", "warmup.epochs=3",
                      "warmup.batch_size=3", "warmup.lr=0.01")


@pytest.fixture(scope="module")
def first_warmup(tiny_policy, tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(cache, warm-up, its log): ``warmup_job``'s warm-up, built once for the module into a cache of its own
    (the world and its index are built there too), under the ``OMP_NUM_THREADS=1`` of a Ray task with a
    fractional CPU share. The decision-weight test takes it as its weighted warm-up instead of training it again."""
    root = tmp_path_factory.mktemp("warmup")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BRIDGE_RAY_CACHE", str(root / "cache"))
        patch.setenv("OMP_NUM_THREADS", "1")
        messages: list[str] = []
        path = warmed_up_policy(_warmup_job(root / "run", tiny_policy), log=messages.append)
    return root / "cache", path, messages


@pytest.fixture
def warmup_job(first_warmup, tiny_policy, tmp_path, monkeypatch):
    """The small world with the tiny policy, and the module's cache (which holds its warm-up)."""
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(first_warmup[0]))
    return _warmup_job(tmp_path / "run", tiny_policy)


def test_training_lowers_the_loss_and_leaves_frozen_embeddings(warmup_job, tiny_policy, monkeypatch):
    from bridge_ray.engines.models import load_tokenizer

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: progress comes as log lines

    demos = build_demonstrations(warmup_job, load_tokenizer(str(tiny_policy)))
    assert len(demos) == 6 and all(d.finished and d.retrieval_turns == [] for d in demos)
    model = load_causal_lm(str(tiny_policy))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    body = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    freeze_embeddings(model)
    lines: list[str] = []
    losses = train_on_demonstrations(model, demos, 0, epochs=3, lr=0.01, batch_size=3, seed=0, log=lines.append)
    assert len(losses) == 6 and losses[-1] < losses[0]
    steps = [line for line in lines if line.startswith("warm-up: ")]
    assert [line.split(" (")[0] for line in steps] == [f"warm-up: {i}/6 steps" for i in range(1, 7)]
    assert f"loss {sum(losses[-1:]):.4g}," in steps[-1], "the mean loss of the last tenth of the steps (one here)"
    assert sum(line.startswith("warm-up epoch") for line in lines) == 3
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, body)


def test_warmed_up_policy_is_built_once_and_reused(warmup_job, first_warmup):
    _, path, messages = first_warmup  # built under OMP_NUM_THREADS=1
    summary = json.loads((path / "warmup.json").read_text())
    assert summary["demonstrations"] == 6 and summary["steps"] == 6
    assert summary["threads"] == warmup_job.learner_threads() == 2, "the SFT trains on the learner's threads"
    assert summary["cpu_kernels"] == torch.backends.cpu.get_cpu_capability(), "fp32 weights depend on it"
    assert any("warm-up epoch 3/3" in m for m in messages)
    assert (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()
    load_causal_lm(str(path))  # an ordinary HF directory

    messages = []
    assert warmed_up_policy(warmup_job, log=messages.append) == path
    assert not any("epoch" in m for m in messages)  # cached: no training the second time
    other = warmup_job.model_copy(update={"warmup": warmup_job.warmup.model_copy(update={"lr": 0.02})})
    assert warmed_up_policy(other, log=messages.append) != path


def test_lora_warmup_merges_the_adapter_into_plain_weights(warmup_job, tiny_policy):
    job = warmup_job.model_copy(update={"warmup": warmup_job.warmup.model_copy(update={"lora": True})})
    path = warmed_up_policy(job, log=lambda _: None)
    base, warm = load_causal_lm(str(tiny_policy)), load_causal_lm(str(path))
    assert not any("lora" in name for name in warm.state_dict())  # merged: an ordinary HF checkpoint
    proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base.state_dict()[proj], warm.state_dict()[proj]), "the merged adapter moved q_proj"
    norm = "model.layers.0.input_layernorm.weight"  # no adapter there: only LoRA factors trained
    assert torch.equal(base.state_dict()[norm], warm.state_dict()[norm])


def test_the_warmup_key_holds_the_precision(monkeypatch):
    """A bf16 warm-up is never taken for an fp32 one; auto keys as what it resolves to on this machine."""
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)  # as on a CPU with avx512_bf16, wherever this runs
    configs = {dtype: load_config(None, [f"learner.dtype={dtype}"]) for dtype in ("fp32", "bf16-autocast", "auto")}
    keys = {dtype: warmup_key(config, "some/model", {}) for dtype, config in configs.items()}
    assert keys["fp32"] != keys["bf16-autocast"] == keys["auto"]
    assert warmup_precision(configs["fp32"]).name == "fp32"
    assert warmup_precision(configs["auto"]).name == "bf16-autocast"  # fp32 weights on GPU and bf16 CPU alike


@pytest.mark.parametrize("decision", [(0, 1.0), (1, 4.0)], ids=["plain", "weighted"])
def test_a_step_fed_in_runs_of_similar_length_has_the_gradient_of_one_padded_forward(decision):
    """The warm-up feeds each step's demonstrations in least-padding runs: the step's loss and (clipped)
    gradient are those of one forward over all of them, with plain or decision weights."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from bridge_ray.engines.buckets import least_padding_runs
    from bridge_ray.policy_learner.objective import sequence_log_probs
    from bridge_ray.warmup.trainer import demonstration_batch

    lengths = [40, 6, 38, 7]
    demos = random_demonstrations(lengths)
    assert len(least_padding_runs(lengths, 4)) == 2, "two forwards: the short pair and the long pair"
    model = tiny_gemma()
    whole = demonstration_batch(demos, 0)
    model.train()
    expected = action_nll(sequence_log_probs(model, whole)[0], decision_weights(whole.action_mask, *decision))
    expected.backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
    want = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got = {}
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, *_: got.update({n: p.grad.clone() for n, p in model.named_parameters()}))
    try:
        [loss] = train_on_demonstrations(model, demos, 0, epochs=1, lr=1e-3, batch_size=4, seed=0, decision=decision,
                                         log=lambda _: None)
    finally:
        handle.remove()
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-7, rtol=1e-5, msg=name)


def test_phrasings_ask_each_demonstrations_question_in_a_drawn_wording(warmup_job):
    from bridge_ray.coordinator.inputs import configured_world, reworded, train_questions

    job = warmup_job.model_copy(update={"warmup": warmup_job.warmup.model_copy(update={"phrasings": ["alternate"]})})
    records = train_questions(job)
    asked = reworded(job, records, random.Random(0))
    assert [(a.uid, a.golden_answers, a.metadata) for a in asked] == [
        (r.uid, r.golden_answers, r.metadata) for r in records
    ], "the same questions"
    alternate = job.model_copy(update={"data": job.data.model_copy(update={"world_phrasing": "alternate"})})
    texts = {q["id"]: q["question"] for q in load_split(configured_world(alternate), "train")}
    changed = [a for a, r in zip(asked, records, strict=True) if a.question != r.question]
    assert 0 < len(changed) < len(records), "drawn from both wordings"
    assert all(a.question == texts[a.question_id] for a in changed)
    assert reworded(job, records, random.Random(0)) == asked, "drawn by the seed"
    assert "train:alternate" in warmup_sources(job) and "train:alternate" not in warmup_sources(warmup_job)
    assert warmup_key(job, "some/model", {}) != warmup_key(warmup_job, "some/model", {})


def test_detours_reach_the_demonstrations_and_the_key(warmup_job, tiny_policy):
    """``warmup.detours`` puts a masked search before some one-hop demonstrations of the same records."""
    from bridge_ray.engines.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_policy))
    plain, detoured = (warmup_job.model_copy(update={"warmup": warmup_job.warmup.model_copy(
        update={"examples": 40, "detours": share})}) for share in (0.0, 1.0))
    before, after = (build_demonstrations(job, tokenizer) for job in (plain, detoured))
    assert [d.uid for d in before] == [d.uid for d in after], "the same records"
    changed = [(b, a) for b, a in zip(before, after, strict=True) if a.token_ids != b.token_ids]
    assert changed, "some one-hop record of the small world has a two-hop record into its gold passage"
    for b, a in changed:
        assert a.num_actions == b.num_actions == 2 and sum(a.action_mask) == sum(b.action_mask)
        masked = tokenizer.decode(a.token_ids[a.prompt_length:a.action_mask.index(1, a.prompt_length)])
        assert masked.startswith("<search>") and "<information>" in masked
    assert warmup_key(detoured, "m", {}) != warmup_key(plain, "m", {})


def test_phrasings_refuse_question_files_they_cannot_reword(tmp_path):
    questions = tmp_path / "train.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "Who?", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(ConfigError, match=r"warmup\.phrasings rewords the bundled world's train split; data\.train"):
        load_config(None, ["warmup.phrasings=[alternate]", f"data.train=[{questions}]"])


def test_detours_refuse_a_demonstration_file(tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"question": "Who?", "turns": [{"action": "<answer> x </answer>"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"warmup\.detours adds searches .*; warmup\.data replaces them"):
        load_config(None, ["warmup.detours=0.5", f"warmup.data={demos}"])
    with pytest.raises(ConfigError, match=r"warmup\.detours"):
        load_config(None, ["warmup.detours=1.5"])


def test_bf16_working_copies_train_bitwise_as_plain_autocast(monkeypatch):
    """The warm-up's bf16 working weights (cast once a step) give autocast's own losses and weights, bit for bit,
    over steps of several runs; the model ends with its fp32 masters, the tied embedding untouched."""
    from bridge_ray.warmup import trainer

    demos = random_demonstrations([40, 6, 38, 7, 30, 5, 41, 9])

    seen: list[torch.dtype] = []

    def trained(copies: bool) -> tuple[list[float], dict[str, torch.Tensor], torch.nn.Module]:
        model = tiny_gemma()
        freeze_embeddings(model)
        model.model.layers[0].mlp.up_proj.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
        if not copies:
            monkeypatch.setattr(trainer, "matmul_working_copies", lambda m, p: contextlib.nullcontext(lambda: None))
        losses = train_on_demonstrations(model, demos, 0, epochs=2, lr=1e-2, batch_size=4, seed=0,
                                         precision=precision.BF16_AUTOCAST, log=lambda _: None)
        monkeypatch.undo()
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, model

    plain_losses, plain, _ = trained(copies=False)
    assert set(seen) == {torch.float32}
    seen.clear()
    losses, weights, model = trained(copies=True)
    assert seen == [torch.bfloat16] * 8, "two runs of similar length per step, each forward with the bf16 copy"
    assert len(losses) == 4 and losses == plain_losses
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the fp32 masters are back in the model"
    assert model.lm_head.weight is model.get_input_embeddings().weight
    for name, weight in plain.items():
        assert torch.equal(weights[name], weight), name


def random_demonstrations(lengths: list[int]) -> list:
    """Demonstrations of random tokens of these lengths, every token after the first two an action token."""
    from bridge_ray.agent.types import Trajectory

    g = torch.Generator().manual_seed(0)
    return [
        Trajectory(uid=str(i), question="q", golden_answers=["a"], sample_index=0, prompt_length=2,
                   token_ids=torch.randint(1, 96, (n,), generator=g).tolist(), action_mask=[0, 0] + [1] * (n - 2),
                   logprobs=[0.0] * n, turn_ids=[-1, -1] + [0] * (n - 2), policy_version=0)
        for i, n in enumerate(lengths)
    ]


def tiny_gemma() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128, sliding_window=16))
