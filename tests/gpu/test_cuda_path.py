"""The CUDA path in one process on one GPU, without Ray (``make gpu-check``): sampling through the agent loop,
the shared-prefix scorer, the query encoder and its LoRA update, the policy step with and without DeepSpeed
ZeRO-2 (NCCL, world size 1), and the weight export to a sampler. Each CUDA result is checked against the
CPU fp32 (or naive) computation; bf16 results within bf16 tolerances. Skipped without a CUDA device."""

from __future__ import annotations

import copy
import os
import socket
from dataclasses import dataclass

import pytest
import torch
from cuda_helpers import TopKRetriever, corpus, save_tiny_bert, tiny_gemma, tiny_tokenizer

from bridge_ray.agent.loop import SearchAgent
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.agent.scoring import score_answers
from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.config import GRPOConfig, LearnerConfig, OptimConfig, RetrieverObjectiveConfig
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.engines.hf import HFEngine, shared_prefix_log_likelihoods
from bridge_ray.policy_learner.batch import PolicyBatch, policy_batch
from bridge_ray.policy_learner.objective import policy_objective, sequence_log_probs
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
GRPO = GRPOConfig(kl_coef=0.0, old_logp="sampler")
LR = 1e-3


@dataclass
class Rollout:
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 2
    max_prompt_length: int = 64
    max_response_length: int = 160
    max_action_length: int = 12
    max_observation_length: int = 48


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def policy(tokenizer):
    """The policy in bf16 on the GPU (as the samplers hold it)."""
    return tiny_gemma(len(tokenizer)).to(CUDA, torch.bfloat16)


@pytest.fixture(scope="module")
def encoder_spec(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def rollouts(tokenizer, policy, encoder_spec):
    """16 questions x G=4 through the real agent loop: HF engine on CUDA, top-k retriever on CUDA. About one
    action in twenty of the random policy is a complete search."""
    retriever = TopKRetriever(QueryEncoder(encoder_spec, rank=4, device="cuda"), corpus())
    engine = HFEngine(policy, tokenizer, batch_size=16, seed=0)
    agent = SearchAgent(engine, retriever, tokenizer, Rollout(), PromptTemplate("where was {question}"))
    questions = [QuestionRecord(f"q/{i}", "ada rowntree born", ["paris"], "q") for i in range(16)]
    return engine, retriever, agent, agent.rollout(questions, group_size=4)


def test_agent_loop_samples_on_cuda_with_logprobs_a_forward_reproduces(tokenizer, policy, rollouts):
    engine, retriever, _, trajectories = rollouts
    assert len(trajectories) == 64 and retriever.calls > 0
    assert sum(len(t.retrieval_turns) for t in trajectories) > 0
    for t in trajectories:
        assert len(t.token_ids) == len(t.logprobs) == len(t.action_mask) and t.response_length <= 160
    batch = policy_batch(trajectories, torch.zeros(len(trajectories)), engine.pad_id)
    with torch.no_grad():
        forward = sequence_log_probs(policy, batch.to(CUDA))[0].cpu()
        reference = sequence_log_probs(copy.deepcopy(policy).float().cpu(), batch)[0]
    action = batch.action_mask.bool()
    sampled = batch.old_logp[action]
    assert sampled.max() <= 0 and torch.isfinite(sampled).all()
    # The KV-cached bf16 decode and the bf16 teacher-forced forward differ by kernel rounding only (logits of
    # unit spread, bf16's 8-bit mantissa); a wrong position or cache row gives errors of order 1.
    gap, gap_fp32 = (sampled - forward[action]).abs(), (sampled - reference[action]).abs()
    print(f"sampled vs bf16 forward: max {gap.max():.4f} mean {gap.mean():.5f}; vs CPU fp32: max "
          f"{gap_fp32.max():.4f} mean {gap_fp32.mean():.5f} over {int(action.sum())} action tokens")
    assert gap.mean() < 0.02 and gap.max() < 0.15
    assert gap_fp32.mean() < 0.03 and gap_fp32.max() < 0.2


def naive_log_likelihoods(model, group: PrefixGroup) -> torch.Tensor:
    """One plain forward per continuation: the definition the shared-prefix scorer must equal."""
    out = []
    for continuation, scored in zip(group.continuations, group.num_scored, strict=True):
        ids = torch.tensor([[*group.prefix, *continuation]], device=next(model.parameters()).device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, :-1]
        out.append(token_log_probs(logits, ids[:, 1:])[0, -scored:].sum())
    return torch.stack(out).float().cpu()


def test_shared_prefix_scorer_on_cuda_equals_a_naive_forward(tokenizer, policy, rollouts):
    engine, retriever, agent, trajectories = rollouts
    scores, groups = score_answers(engine, trajectories, tokenizer, agent.renderer, retriever.passages)
    assert groups and max(len(g.prefix) for g in groups) > 8  # past the sliding window
    fp32 = copy.deepcopy(policy).float()
    flat = [s.cpu() for per in scores for s in per]
    for group, got in zip(groups[:6], flat, strict=False):
        # bf16: summed over the answer's tokens; fp32: the same algorithm on the same GPU, exact up to rounding
        torch.testing.assert_close(got, naive_log_likelihoods(policy, group), atol=0.1, rtol=0.02)
        with torch.no_grad():
            cached = shared_prefix_log_likelihoods(fp32, group, batch_size=3, pad_token_id=engine.pad_id).cpu()
        torch.testing.assert_close(cached, naive_log_likelihoods(fp32, group), atol=2e-4, rtol=0)


def retriever_batch(turns: int = 6, k: int = 4, corpus_size: int = 24) -> RetrieverBatch:
    g = torch.Generator().manual_seed(0)
    return RetrieverBatch(
        queries=[" ".join(["ada", "born", "paris", "river"][: 1 + i % 4]) for i in range(turns)],
        doc_ids=torch.stack([torch.randperm(corpus_size, generator=g)[:k] for _ in range(turns)]),
        old_scores=torch.zeros(turns, k),
        answer_logp=-torch.rand(turns, k, generator=g) * 5,
        advantages=torch.randn(turns, generator=g),
    )


def test_query_encoder_and_its_lora_update_on_cuda_equal_the_cpu(encoder_spec):
    doc_embeddings = torch.nn.functional.normalize(torch.randn(24, 64, generator=torch.Generator().manual_seed(1)),
                                                   dim=-1)
    objective = RetrieverObjectiveConfig(lr=1e-2, inner_steps=2)
    results = []
    for device in ("cpu", "cuda"):
        encoder = QueryEncoder(encoder_spec, rank=4, device=device)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():  # the same non-zero adapter on both devices
            for p in encoder.trainable_parameters():
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        before = torch.from_numpy(encoder.embed_queries(["ada born", "who was ada rowntree"]))
        batch = retriever_batch()
        with torch.no_grad():
            batch.old_scores = torch.einsum("md,mkd->mk", encoder.encode_queries(batch.queries).cpu(),
                                            doc_embeddings[batch.doc_ids])
        updater = RetrieverUpdater(encoder, lambda ids: doc_embeddings[ids], objective, micro_batch_size=4)
        results.append((before, updater.step(batch), encoder.adapter_state_dict(), encoder.device))
    (before_cpu, stats_cpu, adapter_cpu, _), (before_gpu, stats_gpu, adapter_gpu, device) = results
    assert device.type == "cuda"
    torch.testing.assert_close(before_gpu, before_cpu, atol=1e-5, rtol=0)
    assert stats_gpu["score_mismatch"] < 1e-5
    assert stats_gpu == pytest.approx(stats_cpu, abs=1e-5)
    assert adapter_gpu.keys() == adapter_cpu.keys()
    moved = max(float((adapter_gpu[k] - adapter_cpu[k]).abs().max()) for k in adapter_cpu)
    assert moved < 1e-4


# --- the policy learner's step -------------------------------------------------------------------------------

VOCAB = 96


def learner_batch(model: torch.nn.Module, rows: int = 8, length: int = 40) -> PolicyBatch:
    """Two action turns around an observation, ragged right padding, sampler log-probs near the model's."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (rows, length), generator=g)
    ends = torch.randint(length - 10, length + 1, (rows,), generator=g)
    attention = (torch.arange(length)[None, :] < ends[:, None]).long()
    action = torch.zeros(rows, length, dtype=torch.long)
    action[:, 6:16] = 1
    action[:, 22:] = 1
    action *= attention
    turn_ids = torch.where(action.bool(), (torch.arange(length) >= 22).long().expand(rows, -1), -1)
    zeros = torch.zeros(rows, length)
    probe = PolicyBatch(input_ids, attention, action, zeros, turn_ids, zeros[:, 0], zeros[:, 0].long())
    with torch.no_grad():
        logp = sequence_log_probs(model, probe)[0]
    return PolicyBatch(
        input_ids=input_ids, attention_mask=attention, action_mask=action,
        old_logp=logp + 0.1 * torch.randn(rows, length, generator=g) * action, turn_ids=turn_ids,
        advantages=torch.randn(rows, generator=g), question_index=torch.arange(rows) // 2,
    ).with_token_weights(GRPO.loss_agg)


def loss_of(model: torch.nn.Module, batch: PolicyBatch) -> torch.Tensor:
    logp, _ = sequence_log_probs(model, batch)
    return policy_objective(logp, batch, GRPO)[0]


def plain_step(model: torch.nn.Module, batch: PolicyBatch) -> tuple[float, float]:
    """Loss, one AdamW step (clipped at 1), loss again: the learner's step without DeepSpeed."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    loss = loss_of(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    with torch.no_grad():
        return float(loss), float(loss_of(model, batch))


@pytest.fixture(scope="module")
def cpu_step():
    model = tiny_gemma(VOCAB, seed=3)
    batch = learner_batch(model)
    return batch, plain_step(model, batch)


def test_policy_step_on_cuda_without_deepspeed_equals_the_cpu_step(cpu_step):
    batch, (before, after) = cpu_step
    assert after < before  # the step descends
    fp32 = plain_step(tiny_gemma(VOCAB, seed=3).to(CUDA), batch.to(CUDA))
    assert fp32 == pytest.approx((before, after), abs=1e-4)
    bf16 = plain_step(tiny_gemma(VOCAB, seed=3).to(CUDA, torch.bfloat16), batch.to(CUDA))
    print(f"policy step losses: CPU fp32 {before:.5f} -> {after:.5f}; CUDA fp32 {fp32[0]:.5f} -> {fp32[1]:.5f}; "
          f"CUDA bf16 {bf16[0]:.5f} -> {bf16[1]:.5f}")
    assert bf16 == pytest.approx((before, after), abs=2e-2)


@pytest.fixture(scope="module")
def deepspeed_group():
    """DeepSpeed on the CUDA accelerator and a one-rank NCCL process group, as a learner rank forms it."""
    os.environ["DS_ACCELERATOR"] = "cuda"  # read once, at DeepSpeed's first import
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cuda":
        pytest.skip("DeepSpeed was imported earlier in this process with another accelerator")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="nccl", auto_mpi_discovery=False)
    assert torch.distributed.get_backend() == "nccl"
    yield deepspeed
    torch.distributed.destroy_process_group()


def zero2_engine(deepspeed, model: torch.nn.Module, rows: int):
    """The learner's engine (its config builder): ZeRO-2, bf16 weights with fp32 master copies in the optimizer."""
    from bridge_ray.policy_learner import deepspeed_engine as dse

    config = dse.engine_config(LearnerConfig(zero_stage=2, micro_batch_size=rows), OptimConfig(lr=LR, grad_clip=1.0),
                               world_size=1, bf16=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model.to(torch.bfloat16), optimizer=optimizer, config=config)
    return engine


def zero2_step(engine, batch: PolicyBatch) -> tuple[float, float]:
    engine.train()
    batch = batch.to(engine.device)
    loss = loss_of(engine, batch)
    engine.backward(loss)
    engine.step()
    with torch.no_grad():
        return float(loss), float(loss_of(engine, batch))


def scorer_group() -> PrefixGroup:
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(3, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    return PrefixGroup(ids(20), [ids(6), ids(9), ids(4)], [3, 4, 2])


def test_policy_step_through_deepspeed_zero2_nccl_equals_the_cpu_step_and_exports(deepspeed_group, cpu_step):
    batch, (before, after) = cpu_step
    engine = zero2_engine(deepspeed_group, tiny_gemma(VOCAB, seed=3), batch.num_rows)
    got = zero2_step(engine, batch)
    print(f"ZeRO-2 bf16 step losses {got[0]:.5f} -> {got[1]:.5f} (CPU fp32 {before:.5f} -> {after:.5f})")
    assert got == pytest.approx((before, after), abs=2e-2)

    from bridge_ray.policy_learner import deepspeed_engine as dse

    weights = dse.export_weights(engine.module, zero3=False, keep=True, merge_lora=False)
    sampler = HFEngine(tiny_gemma(VOCAB, seed=9).to(CUDA, torch.bfloat16), tiny_tokenizer())
    sampler.update_weights(weights, version=1)
    group = scorer_group()
    engine.eval()
    with torch.no_grad():
        learner_scores = shared_prefix_log_likelihoods(engine.module, group)
    served = sampler.continuation_log_probs([group])[0]
    assert sampler.weight_version == 1
    torch.testing.assert_close(served, learner_scores, atol=1e-3, rtol=0)


def test_lora_step_through_deepspeed_exports_an_adapter_and_merged_weights(deepspeed_group, cpu_step, tmp_path):
    from peft import LoraConfig, get_peft_model

    from bridge_ray.policy_learner import deepspeed_engine as dse

    batch, _ = cpu_step
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(tiny_gemma(VOCAB, seed=3), LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                                 task_type="CAUSAL_LM"))
    engine = zero2_engine(deepspeed_group, model, batch.num_rows)
    before, after = zero2_step(engine, batch)
    assert after < before
    group = scorer_group()
    engine.eval()
    with torch.no_grad():
        learner_scores = shared_prefix_log_likelihoods(engine.module, group)

    adapter = dse.export_adapter(engine.module, zero3=False, keep=True)
    assert adapter and all("lora_" in name for name in adapter)
    dse.save_adapter(engine.module, adapter, tmp_path / "adapter")
    with_adapter = HFEngine(tiny_gemma(VOCAB, seed=3).to(CUDA, torch.bfloat16), tiny_tokenizer())
    with_adapter.load_adapter(str(tmp_path / "adapter"), version=2)
    torch.testing.assert_close(with_adapter.continuation_log_probs([group])[0], learner_scores, atol=2e-3, rtol=0)

    merged = dse.export_weights(engine.module, zero3=False, keep=True, merge_lora=True)
    full = HFEngine(tiny_gemma(VOCAB, seed=9).to(CUDA, torch.bfloat16), tiny_tokenizer())
    full.update_weights(merged, version=2)
    # merging rounds W + BA to bf16 once: about one bf16 ulp (0.4%) on the summed log-likelihoods
    torch.testing.assert_close(full.continuation_log_probs([group])[0], learner_scores, atol=0, rtol=1e-2)
