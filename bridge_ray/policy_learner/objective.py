"""The policy learner's loss on one (micro-)batch: GRPO surrogate + β·KL to the reference − entropy bonus.

All three terms reduce with the batch's global ``token_weights`` (see :mod:`bridge_ray.policy_learner.batch`), so
summing this loss over the shards of a mini-batch gives the loss of the whole mini-batch.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from bridge_ray.algo.aggregate import aggregate
from bridge_ray.algo.grpo import policy_loss, truncated_is_weights
from bridge_ray.algo.kl import entropy_from_logits, kl_penalty
from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.config import GRPOConfig
from bridge_ray.engines.hf import final_hidden_states
from bridge_ray.engines.lm_head import head_log_probs, head_logits, head_runs_in_fp32
from bridge_ray.policy_learner.batch import PolicyBatch


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only, so left padding does not shift them (as in the sampler)."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The HF causal LM inside a DeepSpeed engine and/or a peft wrapper (its LoRA layers stay injected)."""
    from peft import PeftModel  # not at import: the job driver imports this module, without peft

    inner = getattr(model, "module", model)  # a DeepSpeedEngine holds the model as .module
    return inner.get_base_model() if isinstance(inner, PeftModel) else inner


def sequence_log_probs(
    model: torch.nn.Module, batch: PolicyBatch, with_entropy: bool = False, *, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N, T]`` fp32 ``log p(input_ids[:, t] | input_ids[:, :t])`` on action tokens (0 elsewhere), and entropies.

    Laid out like the batch's columns, so it lines up with ``old_logp`` and ``action_mask``. Only the hidden
    states that predict an action token go through the LM head (:func:`head_log_probs`): prompts, observations
    and padding never enter the loss. ``p`` is the rollout's sampling distribution
    ``softmax(logits / temperature)``, the one the sampler's log-probs describe; temperature 0 (greedy)
    keeps the raw logits, as the samplers do.
    """
    n, t = batch.input_ids.shape
    predicts = batch.action_mask[:, 1:].bool()  # hidden state c predicts token c + 1
    logp = torch.zeros(n, t, dtype=torch.float32, device=batch.input_ids.device)
    entropy = torch.zeros_like(logp) if with_entropy else None
    if not predicts.any():
        return logp, entropy
    hidden = final_hidden_states(
        model,
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids(batch.attention_mask),
        use_cache=False,
    )
    labels, head = batch.input_ids[:, 1:][predicts], causal_lm(model)
    zero = torch.zeros(n, 1, dtype=torch.float32, device=logp.device)
    if entropy is None and not head_runs_in_fp32(head, hidden.device.type):
        picked = head_log_probs(head, hidden[:, :-1][predicts], labels, temperature)
    else:  # the entropy needs each row's whole distribution; an fp32 head keeps the one-block computation
        # that fp32 runs' documented figures were measured with (head_log_probs gained only 0.90x there)
        logits = head_logits(head, hidden[:, :-1][predicts], temperature)  # [action tokens, V]
        picked = token_log_probs(logits, labels)
        if entropy is not None:
            per_token = entropy_from_logits(logits)
            entropy = torch.cat([zero, torch.zeros_like(logp[:, 1:]).masked_scatter(predicts, per_token)], dim=1)
    logp = torch.cat([zero, torch.zeros_like(logp[:, 1:]).masked_scatter(predicts, picked)], dim=1)
    return logp, entropy


def action_weights(batch: PolicyBatch, dtype: torch.dtype) -> torch.Tensor:
    """The batch's global token weights on action tokens, 0 elsewhere (filler rows weigh 0 throughout)."""
    if batch.token_weights is None:
        raise ValueError("the policy loss needs the batch's global token_weights (PolicyBatch.with_token_weights)")
    mask = batch.action_mask.bool()
    return torch.where(mask, batch.token_weights.to(dtype), torch.zeros_like(batch.token_weights, dtype=dtype))


def with_learner_old_logp(
    batch: PolicyBatch, learner_logp: torch.Tensor, grpo: GRPOConfig
) -> tuple[PolicyBatch, torch.Tensor]:
    """``batch`` ready for the update, given the learner's log-probs of it before the update's first step.

    ``grpo.old_logp == "learner"`` puts them in the ratio in place of the sampler's, as verl and OpenRLHF
    do: the sampler's kernels and precision make its log-probs differ, so its first ratio would not be 1.
    ``grpo.tis_cap`` adds the truncated importance weights of that mismatch (:func:`truncated_is_weights`).
    Also returns ``old_logp_gap``, this shard's part of the mini-batch's token-weighted mean
    ``|log π_learner − log π_sampler|`` over action tokens (shards sum to the mini-batch figure).
    ``learner_logp`` may be a no-grad pass's or, for the update's first step, that step's own training forward's:
    it is detached here, π_old is a constant of the loss.
    """
    learner_logp = learner_logp.detach()
    sampler_logp = batch.old_logp
    gap = aggregate((learner_logp - sampler_logp).abs(), action_weights(batch, learner_logp.dtype))
    is_weights = None
    if grpo.tis_cap is not None:
        is_weights = truncated_is_weights(learner_logp, sampler_logp, batch.action_mask, grpo.tis_cap)
    old_logp = learner_logp if grpo.old_logp == "learner" else sampler_logp
    return replace(batch, old_logp=old_logp, is_weights=is_weights), gap


def policy_objective(
    logp: torch.Tensor,
    batch: PolicyBatch,
    grpo: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss to minimise and its detached parts (``loss``, ``pg_loss``, ``kl``, ``entropy``, GRPO stats).

    ``ref_logp`` is required when ``grpo.kl_coef > 0`` and ``entropy`` when ``grpo.entropy_coef > 0``;
    both are laid out like ``logp`` and count on action tokens only. The batch's ``is_weights``, when set,
    weight the surrogate's tokens (see :func:`with_learner_old_logp`).
    """
    weights = action_weights(batch, logp.dtype)
    pg_loss, stats = policy_loss(
        logp,
        batch.old_logp,
        batch.advantages,
        batch.action_mask,
        clip_low=grpo.clip_low,
        clip_high=grpo.clip_high,
        dual_clip=grpo.dual_clip,
        token_weights=batch.token_weights,
        is_weights=batch.is_weights,
    )
    loss = pg_loss
    parts = {"pg_loss": pg_loss.detach()}
    if grpo.kl_coef > 0:
        if ref_logp is None:
            raise ValueError(f"algorithm.grpo.kl_coef is {grpo.kl_coef}: the KL term needs reference log-probs")
        kl = aggregate(kl_penalty(logp, ref_logp, grpo.kl_kind), weights)
        loss = loss + grpo.kl_coef * kl
        parts["kl"] = kl.detach()
    if grpo.entropy_coef > 0:
        if entropy is None:
            raise ValueError(f"algorithm.grpo.entropy_coef is {grpo.entropy_coef}: the bonus needs entropies")
        ent = aggregate(entropy, weights)
        loss = loss - grpo.entropy_coef * ent
        parts["entropy"] = ent.detach()
    return loss, {"loss": loss.detach(), **parts, **stats}
