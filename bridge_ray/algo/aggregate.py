"""Token-loss aggregation: how per-token terms become one scalar.

Every aggregation is expressed as a weight per token, so the policy loss, the KL term, the entropy
bonus and the logged statistics all reduce the same way, and masked tokens carry a weight of exactly
zero (hence exactly zero gradient).
"""

from __future__ import annotations

import torch

from bridge_ray.algo.choices import AGGREGATIONS, Aggregation


def _safe_reciprocal(count: torch.Tensor) -> torch.Tensor:
    """1 / count where count > 0, else 0 (empty rows, turns or batches contribute nothing)."""
    return torch.where(count > 0, 1.0 / count.clamp(min=1), torch.zeros_like(count))


def aggregation_weights(
    mask: torch.Tensor,
    agg: Aggregation = "token-mean",
    turn_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights ``w`` such that ``(values * w).sum()`` is the requested aggregate.

    ``turn-mean`` is the paper's eq. (grpo) reduction ``1/G Σ_i 1/T_i Σ_t 1/L_{i,t} Σ_m``: each action
    segment is averaged over its tokens, each trajectory over its segments, the batch over
    trajectories, so a short turn weighs as much as a long one. ``turn_ids [N, T]`` names the
    action segment of every token (any non-negative integers; values under a zero mask are ignored).
    Rows with no action token are padding: they neither contribute nor count in a denominator.
    """
    m = mask.to(torch.float32)
    if m.dim() != 2:
        raise ValueError(f"mask must be [N, T], got shape {tuple(mask.shape)}")
    row_tokens = m.sum(dim=1)
    n_rows = (row_tokens > 0).sum().to(m.dtype)
    if agg == "token-mean":
        return m * _safe_reciprocal(m.sum())
    if agg == "seq-mean-token-sum":
        return m * _safe_reciprocal(n_rows)
    if agg == "seq-mean-token-mean":
        return m * _safe_reciprocal(row_tokens)[:, None] * _safe_reciprocal(n_rows)
    if agg == "turn-mean":
        if turn_ids is None or turn_ids.shape != mask.shape:
            raise ValueError("agg='turn-mean' needs turn_ids with the same [N, T] shape as the mask")
        ids = torch.where(m > 0, turn_ids.long(), torch.zeros_like(turn_ids, dtype=torch.long))
        if (ids < 0).any():
            raise ValueError("turn_ids of action tokens must be non-negative")
        n_turns = int(ids.max().item()) + 1 if ids.numel() else 1
        turn_tokens = torch.zeros(m.shape[0], n_turns, dtype=m.dtype, device=m.device).scatter_add_(1, ids, m)
        turns_per_row = (turn_tokens > 0).sum(dim=1).to(m.dtype)
        per_token_turn_len = turn_tokens.gather(1, ids)
        per_row = _safe_reciprocal(turns_per_row)[:, None] * _safe_reciprocal(n_rows)
        return m * _safe_reciprocal(per_token_turn_len) * per_row
    raise ValueError(f"unknown aggregation {agg!r}; expected one of {AGGREGATIONS}")


def aggregate(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum that ignores whatever a zero-weight token holds (even inf or nan)."""
    return torch.where(weights > 0, values, torch.zeros_like(values)).mul(weights).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked-in entries of any shape; 0 when the mask is empty."""
    return aggregate(values.reshape(1, -1), aggregation_weights(mask.reshape(1, -1)))
