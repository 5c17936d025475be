"""Exact top-k selection and the merge of per-shard hits (pure numpy).

The order is canonical: score descending, then global id ascending. Every shard returns its top k in
that order with every tie at the k-th score resolved the same way, so the top k of the union of the
shards' lists is exactly the top k of one index over the whole corpus, ties included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAD_ID = -1


@dataclass(frozen=True)
class Hits:
    """Search results of a batch of B queries; rows padded with id -1 / score -inf when short of k."""

    scores: np.ndarray  # [B, k] float32
    ids: np.ndarray  # [B, k] int64, global row ids

    def row(self, i: int) -> tuple[list[int], list[float]]:
        """The real (non-padding) ids and scores of query ``i``."""
        valid = self.ids[i] != PAD_ID
        return self.ids[i][valid].tolist(), self.scores[i][valid].tolist()


def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the best ``k`` scores and their ids by (score desc, id asc); padding sorts last."""
    valid = ids != PAD_ID
    scores = np.where(valid, scores, -np.inf).astype(np.float32)
    id_key = np.where(valid, ids, np.iinfo(np.int64).max)
    order = np.lexsort((id_key, -scores), axis=-1)[:, :k]
    picked_scores = np.take_along_axis(scores, order, axis=1)
    picked_ids = np.where(np.take_along_axis(valid, order, axis=1), np.take_along_axis(ids, order, axis=1), PAD_ID)
    return picked_scores, picked_ids.astype(np.int64)


def merge_hits(parts: Sequence[Hits], k: int) -> Hits:
    """The exact top k over several shards' hits of the same queries."""
    scores = np.concatenate([p.scores for p in parts], axis=1)
    ids = np.concatenate([p.ids for p in parts], axis=1)
    return Hits(*top_k(scores, ids, k))
