"""The policy learner's input: padded trajectories plus their advantages, and how it is cut up.

Column ``t`` of every ``[N, T]`` tensor describes token ``input_ids[:, t]``: ``action_mask`` is 1 where the
policy generated that token (observation, prompt and padding tokens are 0), ``old_logp`` is the sampler's
log-probability of it given the tokens before it, ``turn_ids`` numbers the action segment it belongs to.
The policy learner may replace ``old_logp`` by its own log-probs and add truncated importance weights
``is_weights`` for the sampler/learner mismatch before the update (:mod:`bridge_ray.policy_learner.objective`).
The agent loop produces these on token ids; :func:`policy_batch` adds the GRPO ``advantages`` (computed by the
coordinator) and the ``question_index`` (one id per question, shared by its G trajectories) by which mini-batches
are drawn.

The loss normalisation is global: :meth:`PolicyBatch.with_token_weights` computes the per-token
aggregation weights on a whole mini-batch *before* it is split over ranks and micro-batches, so the
sum of the shards' losses is the mini-batch's loss whatever the split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from bridge_ray.agent.types import Trajectory, collate
from bridge_ray.algo.aggregate import aggregation_weights
from bridge_ray.algo.choices import Aggregation
from bridge_ray.algo.grpo import group_index

ROW_FIELDS = ("input_ids", "attention_mask", "action_mask", "old_logp", "turn_ids", "token_weights", "is_weights")


@dataclass(frozen=True)
class PolicyBatch:
    """N padded trajectories; ``token_weights`` is None until :meth:`with_token_weights` sets it."""

    input_ids: torch.Tensor  # [N, T] long
    attention_mask: torch.Tensor  # [N, T] 0/1
    action_mask: torch.Tensor  # [N, T] 0/1, 1 on policy-generated tokens
    old_logp: torch.Tensor  # [N, T] float, log π_old of input_ids[:, t] (the sampler's, or the learner's)
    turn_ids: torch.Tensor  # [N, T] long, action segment of each token
    advantages: torch.Tensor  # [N] float
    question_index: torch.Tensor  # [N] long
    token_weights: torch.Tensor | None = None  # [N, T] float, global aggregation weights
    is_weights: torch.Tensor | None = None  # [N, T] float, truncated importance weights (tis_cap)

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"PolicyBatch.input_ids must be [N, T], got {shape}")
        for name in ROW_FIELDS[1:]:
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"PolicyBatch.{name} has shape {tuple(value.shape)}, expected {shape} like input_ids")
        for name in ("advantages", "question_index"):
            got = tuple(getattr(self, name).shape)
            if got != shape[:1]:
                raise ValueError(f"PolicyBatch.{name} has shape {got}, expected [{shape[0]}]")
        action = self.action_mask.bool()
        if shape[1] and action[:, 0].any():
            raise ValueError("PolicyBatch.action_mask: the first column has no prefix to be predicted from")
        if (action & ~self.attention_mask.bool()).any():
            raise ValueError("PolicyBatch.action_mask marks tokens that attention_mask pads out")
        if not torch.isfinite(torch.where(action, self.old_logp, torch.zeros_like(self.old_logp))).all():
            raise ValueError("PolicyBatch.old_logp is not finite on some action tokens")
        if not torch.isfinite(self.advantages).all():
            raise ValueError("PolicyBatch.advantages has non-finite values")

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_questions(self) -> int:
        return int(torch.unique(self.question_index).numel())

    def select(self, rows: torch.Tensor) -> PolicyBatch:
        """The rows ``rows`` (indices), in that order."""
        rows = rows.long()
        return replace(self, **{f.name: _take(getattr(self, f.name), rows) for f in fields(self)})

    def to(self, device: torch.device) -> PolicyBatch:
        return replace(self, **{f.name: _move(getattr(self, f.name), device) for f in fields(self)})

    def with_token_weights(self, agg: Aggregation) -> PolicyBatch:
        """This batch with the weights of ``agg`` over its action tokens, summing to one per batch."""
        weights = aggregation_weights(self.action_mask, agg, self.turn_ids)
        return replace(self, token_weights=weights)

    def mini_batches(self, questions_per_mini_batch: int, generator: torch.Generator) -> list[PolicyBatch]:
        """Whole question groups, shuffled by ``generator``, ``questions_per_mini_batch`` per mini-batch."""
        if questions_per_mini_batch < 1:
            raise ValueError(f"questions_per_mini_batch must be >= 1, got {questions_per_mini_batch}")
        questions = torch.unique(self.question_index)
        order = questions[torch.randperm(questions.numel(), generator=generator)]
        return [
            self.select(torch.nonzero(torch.isin(self.question_index, chunk)).reshape(-1))
            for chunk in order.split(questions_per_mini_batch)
        ]

    def shard(self, num_shards: int, rows_per_micro_batch: int, by_length: bool = True) -> list[list[PolicyBatch]]:
        """One list of micro-batches (at most ``rows_per_micro_batch`` rows each) per shard, i.e. per rank.

        Every rank must run the same number of forward/backward passes (ZeRO's collectives pair them
        up), so the rows are padded with copies of the shortest row whose token weights are zero: they run the
        collectives and contribute exactly nothing to the loss or the gradient. ``by_length`` cuts the rows,
        longest first, into runs of similar attended length, one per micro-batch, so each micro-batch is padded
        to a length close to its rows'; otherwise the rows go to the ranks in turn, in their order. Either way
        the token weights are the whole batch's, so the split changes no loss and no gradient.
        """
        if num_shards < 1 or rows_per_micro_batch < 1:
            raise ValueError(
                f"need num_shards >= 1 and rows_per_micro_batch >= 1, got {num_shards}, {rows_per_micro_batch}"
            )
        if self.token_weights is None:
            raise ValueError("shard() needs token weights computed on the whole batch: call with_token_weights first")
        if self.num_rows == 0:
            raise ValueError("cannot shard an empty PolicyBatch")
        micro_count = math.ceil(math.ceil(self.num_rows / num_shards) / rows_per_micro_batch)
        padded = micro_count * rows_per_micro_batch * num_shards
        longest_first = torch.sort(self.attention_mask.sum(dim=1), descending=True, stable=True).indices
        order = longest_first if by_length else torch.arange(self.num_rows)
        full = self.select(torch.cat([order, longest_first[-1:].expand(padded - self.num_rows)]))
        filler = torch.arange(padded) >= self.num_rows
        full = replace(full, token_weights=full.token_weights.masked_fill(filler[:, None], 0.0))
        slots = torch.arange(padded)
        if by_length:  # micro-batch j of rank r: the sorted rows (j * num_shards + r) * rows_per_micro_batch + [0, R)
            per_rank = slots.reshape(micro_count, num_shards, rows_per_micro_batch).transpose(0, 1)
        else:  # strided: the filler rows spread evenly over the ranks
            per_rank = slots.reshape(-1, num_shards).T.reshape(num_shards, micro_count, rows_per_micro_batch)
        return [[full.select(rows).trimmed() for rows in rank_rows] for rank_rows in per_rank]

    def trimmed(self) -> PolicyBatch:
        """Drop leading and trailing columns that no row attends (padding shared by the whole batch)."""
        attended = torch.nonzero(self.attention_mask.bool().any(dim=0)).reshape(-1)
        if attended.numel() == 0:
            return self
        first, last = int(attended[0]), int(attended[-1]) + 1
        if first == 0 and last == self.input_ids.shape[1]:
            return self
        return replace(self, **{n: _columns(getattr(self, n), first, last) for n in ROW_FIELDS})


def policy_batch(trajectories: Sequence[Trajectory], advantages: torch.Tensor, pad_token_id: int) -> PolicyBatch:
    """The learner's padded batch: token tensors from the rollouts plus the GRPO advantage of each row."""
    question_index = group_index([t.uid for t in trajectories])
    return PolicyBatch(**collate(trajectories, pad_token_id), advantages=advantages, question_index=question_index)


def _take(value: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if value is None else value.index_select(0, rows)


def _move(value: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if value is None else value.to(device)


def _columns(value: torch.Tensor | None, first: int, last: int) -> torch.Tensor | None:
    return None if value is None else value[:, first:last]
