"""The learner under CPU bf16 autocast (fp32 weights): log-probs, GRPO loss and a DeepSpeed rank's update
against fp32.

The tolerances are what bf16 matmuls (8-bit mantissa) cost on the tiny random Gemma 3; log-softmax and the loss
run in fp32 either way, so the log-probs come out fp32 and the gradient keeps its direction.
"""

from __future__ import annotations

import pytest
import torch
from learner_fixtures import make_policy_batch, tiny_gemma3

from bridge_ray.config import GRPOConfig, load_config
from bridge_ray.engines import precision as precision_module
from bridge_ray.engines.precision import BF16_AUTOCAST, FP32
from bridge_ray.fresh_process import in_fresh_process
from bridge_ray.policy_learner.learner import PolicyLearnerRank
from bridge_ray.policy_learner.objective import policy_objective, sequence_log_probs
from bridge_ray.runtime.rendezvous import free_port

GRPO = GRPOConfig(kl_coef=0.1, entropy_coef=0.01, loss_agg="turn-mean")
LOGP_TOLERANCE = 0.02  # per action token, absolute (measured: 0.005)
LOSS_TOLERANCE = 0.005  # absolute, on a loss of ~0.16 (measured: 0.0006)
GRAD_COSINE = 0.999  # between the two gradients (measured: 0.99994)
# Between two Adam first steps, ≈ −lr·sign(g): gradient entries near 0 flip sign with bf16 rounding (measured 0.992).
UPDATE_COSINE = 0.98


def _update(model, reference, batch, precision):
    """Log-probs, entropies, loss and flat gradient of one micro-batch, forwards in ``precision``'s context."""
    model.zero_grad()
    with precision.context("cpu"):
        logp, entropy = sequence_log_probs(model, batch, with_entropy=True)
        with torch.no_grad():
            ref_logp = sequence_log_probs(reference, batch)[0]
    loss, _ = policy_objective(logp, batch, GRPO, ref_logp, entropy)
    loss.backward()  # outside the autocast context, as the learner does
    return logp.detach(), entropy.detach(), loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.fixture(scope="module")
def both():
    reference, model = tiny_gemma3(seed=0), tiny_gemma3(seed=0)
    with torch.no_grad():  # away from the reference, so that the KL term has a gradient
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.train()
    batch = make_policy_batch(reference).with_token_weights(GRPO.loss_agg)
    return batch, {p.name: _update(model, reference, batch, p) for p in (FP32, BF16_AUTOCAST)}


def test_log_probs_are_fp32_and_agree(both):
    batch, runs = both
    (logp32, ent32, *_), (logp16, ent16, *_) = runs["fp32"], runs["bf16-autocast"]
    assert logp16.dtype == ent16.dtype == torch.float32
    action = batch.action_mask.bool()
    gap = (logp16 - logp32)[action].abs().max().item()
    assert 0 < gap < LOGP_TOLERANCE  # not bit-identical: the autocast did run in bf16
    assert (ent16 - ent32)[action].abs().max().item() < LOGP_TOLERANCE
    assert (logp16[~action] == 0).all()


def test_grpo_loss_and_gradient_agree(both):
    _, runs = both
    (*_, loss32, grad32), (*_, loss16, grad16) = runs["fp32"], runs["bf16-autocast"]
    assert abs(float(loss16 - loss32)) < LOSS_TOLERANCE
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0).item() > GRAD_COSINE


def _one_round(dtype: str, model_dir: str, batch) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """One rank (DeepSpeed ZeRO-2, no Ray) at ``learner.dtype=dtype``: a full fine-tune with the KL reference and
    π_old from the learner; its step metrics and updated weights. Run in a fresh process: a process holds one
    DeepSpeed process group."""
    precision_module.cpu_has_bf16 = lambda: True  # as on a CPU with avx512_bf16, wherever this runs
    config = load_config(None, [
        f"learner.dtype={dtype}", "learner.micro_batch_size=2", "rollout.questions_per_batch=3",
        "optim.mini_batch_size=3", "optim.lr=0.001", "algorithm.grpo.kl_coef=0.1",
        "algorithm.grpo.old_logp=learner", "roles.policy_learner.gpus=0",
    ])
    rank = PolicyLearnerRank(config, model_dir, rank=0, world_size=1)
    try:
        rank.setup(("127.0.0.1", free_port()))
        assert rank.precision.name == dtype and not rank.bf16
        assert {p.dtype for p in rank.engine.module.parameters()} == {torch.float32}
        assert {p.dtype for p in rank.reference.module.parameters()} == {torch.float32}
        return rank.train_on(batch), rank.weights().tensors
    finally:
        rank.shutdown()


@pytest.mark.slow
def test_a_rank_under_bf16_autocast_keeps_fp32_weights_and_updates_like_fp32(tiny_model_dir):
    batch = make_policy_batch(tiny_gemma3(), questions=3, rollouts=2)
    base = {name: p.detach().clone() for name, p in tiny_gemma3().named_parameters()}
    steps, moved = {}, {}
    for dtype in ("fp32", "bf16-autocast"):
        steps[dtype], weights = in_fresh_process(_one_round, dtype, str(tiny_model_dir), batch)
        moved[dtype] = torch.cat([(weights[name] - base[name]).flatten() for name in sorted(base)])
    [fp32], [bf16] = steps["fp32"], steps["bf16-autocast"]
    assert all(torch.isfinite(torch.tensor(list(bf16.values()))))
    assert abs(bf16["loss"] - fp32["loss"]) < LOSS_TOLERANCE and abs(bf16["kl"] - fp32["kl"]) < LOSS_TOLERANCE
    assert bf16["ratio_mean"] == pytest.approx(fp32["ratio_mean"], abs=1e-3)  # π_old from the same precision
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05)
    assert moved["fp32"].abs().max() > 0
    assert torch.nn.functional.cosine_similarity(moved["bf16-autocast"], moved["fp32"], dim=0).item() > UPDATE_COSINE


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_frozen_head_keeps_the_one_block_computation_in_fp32_and_fuses_its_gradient_under_autocast(
    monkeypatch, temperature
):
    """A LoRA policy's frozen head: in fp32 the log-probs and every gradient are bit for bit the one-block
    autograd computation (the entropy path's), the one fp32 runs' figures were measured with; under bf16 autocast
    they go through ``engines.lm_head.head_log_probs`` (normaliser slices of 2 rows here) and agree to bf16."""
    from bridge_ray.engines import lm_head
    from bridge_ray.policy_learner import objective

    monkeypatch.setattr(lm_head, "LOGSUMEXP_ELEMENTS", 2 * lm_head._vocab(tiny_gemma3().lm_head.weight))
    fused_calls = []
    monkeypatch.setattr(objective, "head_log_probs", lambda *a: fused_calls.append(1) or lm_head.head_log_probs(*a))
    model = tiny_gemma3(seed=0).train()
    model.get_output_embeddings().weight.requires_grad_(False)  # tied: the embedding is frozen with it
    batch = make_policy_batch(model).with_token_weights(GRPO.loss_agg)

    def logp_and_grads(precision, with_entropy):
        model.zero_grad()
        with precision.context("cpu"):
            logp = sequence_log_probs(model, batch, with_entropy, temperature=temperature)[0]
        (logp * batch.token_weights).sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    for precision in (FP32, BF16_AUTOCAST):
        (logp, grads), (whole, whole_grads) = logp_and_grads(precision, False), logp_and_grads(precision, True)
        if precision is FP32:
            assert not fused_calls
            assert torch.equal(logp, whole) and all(map(torch.equal, grads, whole_grads))
        else:
            assert len(fused_calls) == 1
            torch.testing.assert_close(logp, whole, rtol=0, atol=1e-5)
            flat, whole_flat = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in whole_grads])
            assert torch.nn.functional.cosine_similarity(flat, whole_flat, dim=0).item() > 0.9999
