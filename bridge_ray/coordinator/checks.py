"""The coordinator's checks of a round's rollouts, on their summaries only (:mod:`bridge_ray.sampler.summary`).

Every question came back with exactly G samples (none lost, none counted twice after a sampler was revived),
every sample was drawn within ``rollout.max_staleness`` versions of the learners, and the rollout phase records
a digest of the sampled tokens, by which a resumed run is compared with an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from bridge_ray.data.qa import QuestionRecord
from bridge_ray.sampler.summary import RolloutSummary


class StaleSampleError(RuntimeError):
    """A sample was generated with weights older than the staleness bound allows."""


def check_staleness(
    summaries: Sequence[RolloutSummary], policy_version: int, retriever_version: int, max_staleness: int = 0
) -> tuple[int, int]:
    """Every sample's policy version, and every search's retriever version, within ``max_staleness`` of now.

    Returns the largest (policy, retriever) lags, the round's staleness figures.
    """

    def lag(uid: str, action: str, model: str, used: int, now: int) -> int:
        if not 0 <= now - used <= max_staleness:
            raise StaleSampleError(
                f"{uid}: {action} with {model} v{used}, learner is at v{now} (rollout.max_staleness={max_staleness})"
            )
        return now - used

    policy_lag = retriever_lag = 0
    for s in summaries:
        policy_lag = max(policy_lag, lag(s.uid, "generated", "policy", s.policy_version, policy_version))
        for used in s.retriever_versions:
            retriever_lag = max(retriever_lag, lag(s.uid, "searched", "retriever", used, retriever_version))
    return policy_lag, retriever_lag


def check_complete_groups(
    summaries: Sequence[RolloutSummary], questions: Sequence[QuestionRecord], group_size: int
) -> None:
    """Exactly samples 0..G-1 of every question and nothing else: no trajectory lost or counted twice."""
    expected = {(q.uid, g) for q in questions for g in range(group_size)}
    seen = [(s.uid, s.sample_index) for s in summaries]
    if len(seen) != len(set(seen)) or set(seen) != expected:
        duplicated = sorted({key for key in seen if seen.count(key) > 1})
        raise RuntimeError(
            f"rollout returned {len(seen)} trajectories for {len(questions)} questions x {group_size}: "
            f"missing {sorted(expected - set(seen))[:5]}, duplicated {duplicated[:5]}, "
            f"unexpected {sorted(set(seen) - expected)[:5]}"
        )


def sample_digest(summaries: Sequence[RolloutSummary]) -> str:
    """A fingerprint of a round's sampled tokens: two runs sampled a round alike exactly when their rollout phase
    records carry the same digest (a resumed run and an uninterrupted one, say)."""
    digest = hashlib.sha256()
    for s in sorted(summaries, key=lambda s: (s.uid, s.sample_index)):
        digest.update(json.dumps([s.uid, s.sample_index, s.token_digest]).encode())
    return digest.hexdigest()[:16]


def rollout_record(summaries: Sequence[RolloutSummary]) -> dict[str, Any]:
    """What the rollout phase records of its samples: their count, digest and the versions they were drawn with."""
    return {
        "trajectories": len(summaries),
        "sample_digest": sample_digest(summaries),
        "policy_versions": sorted({s.policy_version for s in summaries}),
        "retriever_versions": sorted({v for s in summaries for v in s.retriever_versions}),
    }
