"""One fixed batch of rollouts and the paper's objectives on it, for the probes that differentiate or perturb them.

``bench estimators`` (θ-gradients, Fig. 4a–b) and ``bench landscape`` (loss surfaces, Fig. 3) evaluate the same
pieces on one batch drawn through the production sampler and scorer: the GRPO surrogate of the policy's tokens,
the answer likelihoods ``log p_θ(y | h_t, d)`` of every retrieval turn's logged candidates, and the retriever's
``log ρ_η(d | h_t)`` over those candidates.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bridge_ray.agent.scoring import answer_groups
from bridge_ray.algo.grpo import group_advantages
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.config import Config, derive
from bridge_ray.coordinator.inputs import index_shards, train_questions
from bridge_ray.engines.models import pad_token_id
from bridge_ray.policy_learner.batch import PolicyBatch, policy_batch
from bridge_ray.policy_learner.objective import policy_objective, sequence_log_probs
from bridge_ray.retriever_learner.learner import retriever_batch
from bridge_ray.sampler.sampler import Sampler
from bridge_ray.warmup.trainer import warmed_up_policy


class RolloutBatch:
    """One batch of rollouts of the policy, its answer scores, advantages and the scorer's prefix groups: the
    train questions ``first`` to ``first + questions``, ``algorithm.grpo.rollouts_per_question`` rollouts each."""

    def __init__(self, config: Config, questions: int, policy: str | None, adapter_dir: Path | None = None,
                 first: int = 0) -> None:
        if policy is None:
            policy = str(warmed_up_policy(config)) if config.warmup.enabled else config.policy.model
        self.policy = policy
        self.config = derive(config, {"policy.model": policy}, source="the rollout batch's policy")
        self.shards = index_shards(config)
        adapter = str(adapter_dir) if adapter_dir is not None else None
        sampler = Sampler(self.config, self.shards, seed=config.run.seed, adapter_dir=adapter)
        self.questions = train_questions(config)[first : first + questions]
        grpo = config.algorithm.grpo
        self.trajectories = sampler.rollout(self.questions, grpo.rollouts_per_question, config.run.seed).trajectories
        self.answer_logp = sampler.score(self.trajectories).answer_logp
        rewards = torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32)
        self.reward_mean = float(rewards.mean())
        self.advantages = group_advantages(
            rewards, [t.uid for t in self.trajectories], grpo.adv_eps, grpo.scale_adv_by_std
        )
        # the retriever update's rows and the scorer's groups: every retrieval turn, in the same order
        self.retriever_batch = retriever_batch(self.trajectories, self.answer_logp, self.advantages)
        self.groups = [g for _, _, g in answer_groups(
            self.trajectories, sampler.tokenizer, sampler.agent.renderer, sampler.client.passages
        )]
        self.pad_token_id = pad_token_id(sampler.tokenizer)
        # g(d) of every logged candidate [M, K, D] (padding reads row 0; the candidate mask leaves it out)
        self.doc_vectors = self.shards.doc_embeddings(self.retriever_batch.doc_ids.clamp(min=0)).float()

    def policy_rows(self) -> list[PolicyBatch]:
        """The GRPO batch one trajectory at a time (vocabulary-wide logits are large), trimmed of padding; each row
        carries the whole batch's token weights, so the rows' losses add up to the batch's."""
        batch = policy_batch(self.trajectories, self.advantages, self.pad_token_id)
        batch = batch.with_token_weights(self.config.algorithm.grpo.loss_agg)
        return [batch.select(torch.tensor([row])).trimmed() for row in range(batch.num_rows)]

    def log_rho(self, encoder) -> torch.Tensor:
        """``log ρ_η(d | h_t)`` [M, K] of the logged candidates under the query encoder's current η (no grad)."""
        update = self.retriever_batch
        with torch.no_grad():
            scores = torch.einsum("md,mkd->mk", encoder.encode_queries(update.queries), self.doc_vectors)
        temperature = self.config.algorithm.retriever.retrieval_temperature
        return retrieval_log_probs(scores, temperature, update.candidate_mask)

    def unusable(self) -> str | None:
        """Why the batch cannot compare the θ-gradient estimators, or None. Without a search there is no ``L_RAG``
        to differentiate; where every group's rewards agree the advantages and so the RL gradient are 0, BRIDGE's
        estimate is 0 and its cosine 0 whatever the retriever states (the paper's batches of 512 questions never
        are)."""
        if not self.groups:
            return "the rollouts made no search"
        if not bool(self.advantages.abs().gt(0).any()):
            return "every group's rewards agree (zero advantages, zero RL gradient)"
        return None


def rl_surrogate(model: torch.nn.Module, row: PolicyBatch, config: Config) -> torch.Tensor:
    """The GRPO surrogate loss of one row of :meth:`RolloutBatch.policy_rows` (no KL, no entropy: the RL term)."""
    grpo = derive(config.algorithm.grpo, {"kl_coef": 0.0, "entropy_coef": 0.0}, source="the RL surrogate")
    logp, _ = sequence_log_probs(model, row, temperature=config.rollout.temperature)
    return policy_objective(logp, row, grpo)[0]
