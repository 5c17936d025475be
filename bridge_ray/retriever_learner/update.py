"""The retriever step of a BRIDGE round: re-score the logged candidates with f_eta, descend eq. eta_loss.

Only the query-side LoRA factors move. The candidate sets, their rollout-time scores (eta_old) and the
answer log-likelihoods are fixed inputs logged by the samplers and the scorer; the document embeddings
g(d) come from the shard holders, so the corpus is never re-encoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bridge_ray.algo.rag import evidence_turn_weights
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.algo.retriever_loss import retrieval_trust_kl, retriever_loss
from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR, RETRIEVER_OPTIMIZER_FILE
from bridge_ray.config import RetrieverObjectiveConfig
from bridge_ray.retrieval.encoder import QueryEncoder


@dataclass
class RetrieverBatch:
    """M logged retrieval turns, candidates padded to K with id -1."""

    queries: list[str]
    doc_ids: torch.Tensor  # [M, K] long
    old_scores: torch.Tensor  # [M, K], s_eta_old at rollout time
    answer_logp: torch.Tensor  # [M, K], log p_theta(y | h_t, d)
    advantages: torch.Tensor  # [M], GRPO advantage of each turn's trajectory

    def __post_init__(self) -> None:
        m = len(self.queries)
        for name in ("doc_ids", "old_scores", "answer_logp"):
            if tuple(getattr(self, name).shape[:1]) != (m,) or getattr(self, name).shape != self.doc_ids.shape:
                raise ValueError(f"RetrieverBatch.{name} must be [{m}, K] like doc_ids {tuple(self.doc_ids.shape)}")
        if tuple(self.advantages.shape) != (m,):
            raise ValueError(f"RetrieverBatch.advantages must be [{m}], got {tuple(self.advantages.shape)}")

    def to(self, device: torch.device) -> RetrieverBatch:
        """The batch on the encoder's device (the learner's GPU when its role holds one)."""
        tensors = ("doc_ids", "old_scores", "answer_logp", "advantages")
        return dataclasses.replace(self, **{name: getattr(self, name).to(device) for name in tensors})

    @property
    def candidate_mask(self) -> torch.Tensor:
        return self.doc_ids >= 0

    def __len__(self) -> int:
        return len(self.queries)

    @classmethod
    def from_turns(
        cls,
        queries: Sequence[str],
        doc_ids: Sequence[Sequence[int]],
        old_scores: Sequence[Sequence[float]],
        answer_logp: Sequence[Sequence[float]],
        advantages: Sequence[float],
    ) -> RetrieverBatch:
        k = max((len(ids) for ids in doc_ids), default=1)

        def pad(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((len(rows), k), value, dtype=dtype)
            for i, row in enumerate(rows):
                out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
            return out

        return cls(
            list(queries),
            pad(doc_ids, -1, torch.long),
            pad(old_scores, 0.0, torch.float32),
            pad(answer_logp, 0.0, torch.float32),
            torch.as_tensor(list(advantages), dtype=torch.float32),
        )


class RetrieverUpdater:
    """Owns the query encoder's LoRA optimizer and the adapter version the samplers must serve."""

    def __init__(
        self,
        encoder: QueryEncoder,
        doc_embeddings: Callable[[torch.Tensor], torch.Tensor],
        objective: RetrieverObjectiveConfig,
        *,
        micro_batch_size: int = 64,
        version: int = 0,
    ):
        self.encoder, self.doc_embeddings, self.objective = encoder, doc_embeddings, objective
        self.micro_batch_size, self.version = micro_batch_size, version
        self.optimizer = torch.optim.AdamW(encoder.trainable_parameters(), lr=objective.lr, weight_decay=0.0)

    def accumulate_gradients(self, batch: RetrieverBatch, doc_embeddings: torch.Tensor) -> dict[str, float]:
        """Backward of the retriever loss over micro-batches of turns, each weighted by its share of the valid turns
        (with ``turn_weight: evidence``, its share of the batch's answer evidence).

        The accumulated gradient therefore equals the full-batch gradient. Returns the loss statistics and
        ``score_mismatch``: the largest gap between the re-computed and the logged scores, ~0 when the
        sampler used the adapter this learner holds, larger when the batch is stale.
        """
        mask = batch.candidate_mask
        valid_turns = mask.any(dim=1)
        total = max(int(valid_turns.sum()), 1)
        evidence = self.objective.turn_weight == "evidence"
        weights = valid_turns.float() / total  # each turn's weight in the whole batch's loss
        if evidence:
            old_log_rho = retrieval_log_probs(batch.old_scores, self.objective.retrieval_temperature, mask)
            weights = evidence_turn_weights(old_log_rho, batch.answer_logp, mask)
        sums: dict[str, float] = {"score_mismatch": 0.0}
        for lo in range(0, len(batch), self.micro_batch_size):
            sl = slice(lo, lo + self.micro_batch_size)
            share = float(weights[sl].sum())
            if share == 0:
                continue
            # the trust region is a uniform mean over the batch's turns whatever the loss's weights
            uniform_share = float(valid_turns[sl].sum()) / total
            queries = self.encoder.encode_queries(batch.queries[sl])
            scores = torch.einsum("md,mkd->mk", queries, doc_embeddings[sl])
            loss, stats = retriever_loss(
                scores,
                batch.old_scores[sl],
                batch.answer_logp[sl],
                batch.advantages[sl],
                gamma=self.objective.gamma,
                retrieval_temperature=self.objective.retrieval_temperature,
                posterior_temperature=self.objective.posterior_temperature,
                clip_eps=self.objective.clip_eps,
                candidate_mask=mask[sl],
                turn_weights=weights[sl] / share if evidence else None,
                kl_coef=self.objective.kl_coef * uniform_share / share,
            )
            (loss * share).backward()
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + float(value) * share
            gap = (scores.detach() - batch.old_scores[sl]).abs()[mask[sl]]
            sums["score_mismatch"] = max(sums["score_mismatch"], float(gap.max()) if gap.numel() else 0.0)
        return {**sums, "turns": float(total)}

    def step(self, batch: RetrieverBatch) -> dict[str, float]:
        """``objective.inner_steps`` optimizer steps on ``1/(1+γ) J_RL^eta + γ/(1+γ) L_RAG``; version += 1.

        The figures are those of the first pass, i.e. at the adapter the batch was scored against (where the
        ratio and the trust region's KL are 1 and 0 by construction; :meth:`ranking_kl` measures the step).
        """
        device = self.encoder.device
        batch = batch.to(device)
        g = self.doc_embeddings(batch.doc_ids.clamp(min=0).cpu()).float().to(device)  # [M, K, D], once per round
        figures: dict[str, float] = {}
        self.encoder.train()
        try:
            for _ in range(self.objective.inner_steps):
                self.optimizer.zero_grad(set_to_none=True)
                stats = self.accumulate_gradients(batch, g)
                self.optimizer.step()
                figures = figures or stats
        finally:
            self.encoder.eval()
        self.version += 1
        return {**figures, "retriever_version": float(self.version)}

    def log_rho(self, batch: RetrieverBatch, doc_embeddings: torch.Tensor) -> torch.Tensor:
        """``log ρ_η(d | h_t)`` [M, K] (eq. retriever_distribution) of the logged candidates under the adapter as it
        is now, on the CPU; queries encoded in micro-batches, without gradients."""
        with torch.no_grad():
            queries = torch.cat([
                self.encoder.encode_queries(batch.queries[lo:lo + self.micro_batch_size]).float().cpu()
                for lo in range(0, len(batch), self.micro_batch_size)
            ]) if len(batch) else torch.zeros(0, doc_embeddings.shape[-1])
        scores = torch.einsum("md,mkd->mk", queries, doc_embeddings.float().cpu())
        return retrieval_log_probs(scores, self.objective.retrieval_temperature, batch.candidate_mask.cpu())

    def ranking_kl(self, batch: RetrieverBatch, log_rho: torch.Tensor) -> float:
        """:func:`retrieval_trust_kl` of ``log_rho`` (:meth:`log_rho` now) against the ranking that logged the batch,
        over all of its turns: after :meth:`step`, how far the step moved the ranking it was taken on (what
        ``kl_coef`` bounds)."""
        mask = batch.candidate_mask.cpu()
        old_log_rho = retrieval_log_probs(batch.old_scores.float().cpu(), self.objective.retrieval_temperature, mask)
        return float(retrieval_trust_kl(log_rho, old_log_rho, mask))

    def save(
        self, directory: str | Path, adapter: str = RETRIEVER_ADAPTER_DIR, optimizer: str = RETRIEVER_OPTIMIZER_FILE
    ) -> None:
        """The adapter in peft format plus the optimizer state (tensors only, loadable with weights_only)."""
        directory = Path(directory)
        self.encoder.save_adapter(directory / adapter)
        torch.save(self.optimizer.state_dict(), directory / optimizer)

    def load_optimizer(self, directory: str | Path, optimizer: str = RETRIEVER_OPTIMIZER_FILE) -> None:
        path = Path(directory) / optimizer
        state = torch.load(path, map_location=self.encoder.device, weights_only=True)
        self.optimizer.load_state_dict(state)
