import copy
import math
from dataclasses import replace

import pytest
import torch
from learner_fixtures import make_policy_batch, tiny_gemma3

from bridge_ray.algo.aggregate import aggregate
from bridge_ray.config import GRPOConfig
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import (
    action_weights,
    policy_objective,
    sequence_log_probs,
    with_learner_old_logp,
)

GRPO = GRPOConfig(kl_coef=0.1, entropy_coef=0.01, loss_agg="turn-mean", dual_clip=3.0)


def objective_and_grads(model, reference, batch, grpo=GRPO):
    model.zero_grad()
    logp, entropy = sequence_log_probs(model, batch, with_entropy=True)
    with torch.no_grad():
        ref_logp = sequence_log_probs(reference, batch)[0]
    loss, stats = policy_objective(logp, batch, grpo, ref_logp, entropy)
    loss.backward()
    return stats, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def models():
    reference = tiny_gemma3(seed=0)
    model = tiny_gemma3(seed=0)
    with torch.no_grad():  # move the policy away from the reference so that the KL term has a gradient
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.train(), reference


@pytest.mark.parametrize("agg", ["turn-mean", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize(("ranks", "micro"), [(2, 1), (3, 2)])
def test_shards_sum_to_the_whole_mini_batch(models, agg, ranks, micro):
    """Global normalisation: Σ over ranks and micro-batches of loss and gradient == one pass on the whole."""
    model, reference = models
    grpo = GRPO.model_copy(update={"loss_agg": agg})
    whole = make_policy_batch(reference).with_token_weights(agg)
    stats, grads = objective_and_grads(model, reference, whole, grpo)
    total_loss, total_grads = 0.0, {name: torch.zeros_like(g) for name, g in grads.items()}
    for micro_batches in whole.shard(ranks, micro):
        for m in micro_batches:
            part, part_grads = objective_and_grads(model, reference, m, grpo)
            total_loss += float(part["loss"])
            for name, g in part_grads.items():
                total_grads[name] += g
    assert total_loss == pytest.approx(float(stats["loss"]), rel=1e-5, abs=1e-7)
    for name, g in grads.items():
        assert torch.allclose(total_grads[name], g, atol=1e-6, rtol=1e-4), name
    assert float(stats["kl"]) > 0 and float(stats["entropy"]) > 0


def test_non_action_tokens_get_exactly_zero_gradient(models):
    model, reference = models
    batch = make_policy_batch(reference).with_token_weights("turn-mean")
    with torch.no_grad():
        logp0, entropy0 = sequence_log_probs(model, batch, with_entropy=True)
        ref_logp = sequence_log_probs(reference, batch)[0]
    logp, entropy = logp0.clone().requires_grad_(), entropy0.clone().requires_grad_()
    loss, _ = policy_objective(logp, batch, GRPO, ref_logp, entropy)
    loss.backward()
    action = batch.action_mask.bool()
    for grad in (logp.grad, entropy.grad):
        assert (grad[~action] == 0).all(), "observation, prompt and padding tokens must not be trained on"
        assert (grad[action] != 0).float().mean() > 0.9


def test_masked_values_do_not_change_the_update(models):
    """Garbage in old log-probs of non-action tokens and in padding token ids leaves every gradient unchanged."""
    model, reference = models
    batch = make_policy_batch(reference).with_token_weights("turn-mean")
    _, grads = objective_and_grads(model, reference, batch)
    action, padding = batch.action_mask.bool(), ~batch.attention_mask.bool()
    assert padding.any() and (~action & ~padding).any()
    noisy = PolicyBatch(
        **{
            **batch.__dict__,
            "old_logp": torch.where(action, batch.old_logp, torch.full_like(batch.old_logp, float("nan"))),
            "input_ids": torch.where(padding, torch.randint_like(batch.input_ids, 90), batch.input_ids),
        }
    )
    _, noisy_grads = objective_and_grads(model, reference, noisy)
    for name, g in grads.items():
        assert torch.allclose(noisy_grads[name], g, atol=1e-7), name


def test_terms_that_are_switched_on_need_their_inputs(models):
    model, reference = models
    batch = make_policy_batch(reference)
    logp = sequence_log_probs(model, batch)[0]
    with pytest.raises(ValueError, match="token_weights"):
        policy_objective(logp, batch, GRPO)
    weighted = batch.with_token_weights("turn-mean")
    with pytest.raises(ValueError, match="kl_coef"):
        policy_objective(logp, weighted, GRPO)
    with pytest.raises(ValueError, match="entropy_coef"):
        policy_objective(logp, weighted, GRPO, ref_logp=logp.detach())
    plain = GRPOConfig(kl_coef=0.0, entropy_coef=0.0)
    loss, stats = policy_objective(logp, weighted, plain)
    assert set(stats) >= {"loss", "pg_loss", "clipfrac"} and "kl" not in stats and "entropy" not in stats
    assert float(loss.detach()) == float(stats["pg_loss"])


@pytest.mark.parametrize(("temperature", "softcap"), [(1.0, None), (0.7, None), (0.7, 0.05)])
def test_log_probs_only_on_action_columns_match_the_full_forward(models, temperature, softcap):
    """Projecting only the action columns onto the vocabulary gives the full forward's log-probs there (padded
    rows included), under the rollout's sampling distribution softmax(logits / T) and with the model's final
    logit soft-capping."""
    from bridge_ray.algo.kl import entropy_from_logits
    from bridge_ray.algo.logprob import token_log_probs

    model, reference = models
    batch = make_policy_batch(reference)
    assert not batch.attention_mask.all(), "the batch must hold padding"
    if softcap is not None:
        uncapped = sequence_log_probs(model, batch, temperature=temperature)[0]
        model = copy.deepcopy(model)
        model.config.final_logit_softcapping = softcap
    logp, entropy = sequence_log_probs(model, batch, with_entropy=True, temperature=temperature)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logits = logits[:, :-1] / temperature
    full = torch.nn.functional.pad(token_log_probs(logits, batch.input_ids[:, 1:]), (1, 0))
    full_entropy = torch.nn.functional.pad(entropy_from_logits(logits), (1, 0))
    action = batch.action_mask.bool()
    torch.testing.assert_close(logp[action], full[action], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[action], full_entropy[action], atol=1e-5, rtol=0)
    assert torch.all(logp[~action.any(dim=0).expand_as(action)] == 0) and torch.isfinite(entropy).all()
    if softcap is not None:
        assert (logp - uncapped)[action].abs().max() > 1e-3, "the cap must change the log-probs"


GAP = 0.3


def mismatched_batch(model, reference):
    """Sampler log-probs that miss the learner's by exactly ±GAP (alternating by column) on every action token."""
    batch = make_policy_batch(reference).with_token_weights("turn-mean")
    with torch.no_grad():
        learner_logp = sequence_log_probs(model, batch)[0]
    sign = 1.0 - 2.0 * (torch.arange(batch.input_ids.shape[1]) % 2)
    return replace(batch, old_logp=learner_logp + GAP * sign), sign


def shard_sums(model, batch, grpo, ranks, micro):
    """The learner's per-step figures: each micro-batch prepared with its own no-grad forward, summed over shards."""
    sums = {}
    for micro_batches in batch.shard(ranks, micro):
        for part in micro_batches:
            with torch.no_grad():
                ready, gap = with_learner_old_logp(part, sequence_log_probs(model, part)[0], grpo)
                _, stats = policy_objective(sequence_log_probs(model, ready)[0], ready, grpo)
            for key, value in {**stats, "old_logp_gap": gap}.items():
                sums[key] = sums.get(key, 0.0) + float(value)
    return sums


@pytest.mark.parametrize(("ranks", "micro"), [(1, 6), (2, 1)])
def test_learner_old_logp_makes_the_first_ratio_one_whatever_the_sampler_recorded(models, ranks, micro):
    model, reference = models
    batch, sign = mismatched_batch(model, reference)
    learner = shard_sums(model, batch, GRPOConfig(kl_coef=0.0), ranks, micro)
    assert learner["clipfrac"] == 0 and abs(learner["ratio_mean"] - 1) < 1e-5 and abs(learner["approx_kl"]) < 1e-5
    assert learner["old_logp_gap"] == pytest.approx(GAP, abs=1e-5)

    sampler = shard_sums(model, batch, GRPOConfig(kl_coef=0.0, old_logp="sampler"), ranks, micro)
    expected_ratio = aggregate(torch.exp(-GAP * sign).expand_as(batch.old_logp), action_weights(batch, torch.float32))
    assert sampler["ratio_mean"] == pytest.approx(float(expected_ratio), abs=1e-5) and sampler["clipfrac"] > 0.2
    assert sampler["old_logp_gap"] == pytest.approx(GAP, abs=1e-5)


def test_tis_weights_are_capped_and_weight_each_token_of_the_surrogate(models):
    model, reference = models
    batch, sign = mismatched_batch(model, reference)
    with torch.no_grad():
        learner_logp = sequence_log_probs(model, batch)[0]
    grpo = GRPOConfig(kl_coef=0.0, tis_cap=1.2)
    ready, _ = with_learner_old_logp(batch, learner_logp, grpo)
    action = batch.action_mask.bool()
    # learner - sampler = -GAP * sign: exp(-0.3) = 0.74 where sign > 0, exp(0.3) = 1.35 capped to 1.2 elsewhere
    expected = torch.where(sign > 0, torch.tensor(math.exp(-GAP)), torch.tensor(1.2)).expand_as(learner_logp)
    torch.testing.assert_close(ready.is_weights[action], expected[action])
    assert torch.equal(ready.old_logp, learner_logp) and (ready.is_weights[~action] == 0).all()
    loss, stats = policy_objective(learner_logp, ready, grpo)  # ratio 1: each token's loss is -A, times its weight
    weights = action_weights(batch, torch.float32) * ready.is_weights
    assert float(loss) == pytest.approx(float(-(batch.advantages[:, None] * weights).sum()), abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_the_first_steps_pi_old_from_its_own_training_forward_is_the_separate_eval_forwards(models):
    """Without dropout a training forward computes what the eval-mode π_old pass does: its log-probs, detached,
    give the same π_old, TIS weights, ``old_logp_gap``, loss and gradient as that pass (the first step's
    ``learner.reuse_old_logp``)."""
    model, reference = models
    batch, _ = mismatched_batch(model, reference)
    grpo = GRPOConfig(kl_coef=0.0, tis_cap=1.2)
    model.eval()
    with torch.no_grad():
        separate = sequence_log_probs(model, batch)[0]
    model.train()
    results = []
    for own in (False, True):
        model.zero_grad()
        logp = sequence_log_probs(model, batch)[0]
        ready, gap = with_learner_old_logp(batch, logp if own else separate, grpo)
        loss, stats = policy_objective(logp, ready, grpo)
        loss.backward()
        results.append((ready, gap, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (old, old_gap, old_loss, old_grads), (new, new_gap, new_loss, new_grads) = results
    assert not new.old_logp.requires_grad and float(stats["ratio_mean"]) == pytest.approx(1.0, abs=1e-7)
    torch.testing.assert_close(new.old_logp, separate, atol=1e-6, rtol=0)
    torch.testing.assert_close(new.is_weights, old.is_weights, atol=1e-6, rtol=0)
    assert float(new_gap) == pytest.approx(float(old_gap), abs=1e-6)
    assert float(new_loss) == pytest.approx(float(old_loss), rel=1e-6, abs=1e-8)
    for name, g in old_grads.items():
        torch.testing.assert_close(new_grads[name], g, atol=1e-7, rtol=1e-5, msg=name)


@pytest.mark.parametrize("agg", ["turn-mean", "seq-mean-token-sum"])
def test_length_buckets_change_the_padding_not_the_gradient(models, agg):
    """Micro-batches of similar lengths feed fewer tokens, and their shards sum to the row-order split's loss and
    gradient: the token weights are the whole mini-batch's."""
    model, reference = models
    grpo = GRPO.model_copy(update={"loss_agg": agg})
    mixed = make_policy_batch(reference, questions=4, length=40, shortest=7).with_token_weights(agg)
    figures = {}
    for by_length in (True, False):
        fed, loss, grads = 0, 0.0, {}
        for micro_batches in mixed.shard(2, 2, by_length):
            for m in micro_batches:
                stats, part_grads = objective_and_grads(model, reference, m, grpo)
                fed, loss = fed + m.input_ids.numel(), loss + float(stats["loss"])
                for name, g in part_grads.items():
                    grads[name] = grads.get(name, 0) + g
        figures[by_length] = fed, loss, grads
    (fed, loss, grads), (row_fed, row_loss, row_grads) = figures[True], figures[False]
    assert fed < 0.9 * row_fed, (fed, row_fed)
    assert loss == pytest.approx(row_loss, rel=1e-5, abs=1e-7)
    for name, g in row_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-4, msg=name)
