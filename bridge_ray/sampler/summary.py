"""What the coordinator sees of a trajectory: a few numbers, while the trajectory itself stays in the object store.

A sampler's rollout call has two returns: the :class:`RolloutSummary` of every trajectory of its share, which
the coordinator fetches to check the round, compute the GRPO advantages and report it, and the trajectories,
which travel by ref to the retriever learner and the policy ranks (README, "How the pieces fit"). A summary
holds exactly what those checks, the advantages, the dynamic sampling and the round's diagnostics read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from bridge_ray.agent.outcomes import gold_recall
from bridge_ray.agent.types import Trajectory
from bridge_ray.data.qa import QuestionRecord


@dataclass(frozen=True)
class RolloutSummary:
    uid: str
    sample_index: int
    reward: float
    policy_version: int  # the weights that generated it
    retriever_versions: tuple[int, ...]  # the adapter of each of its searches
    response_tokens: int
    action_tokens: int  # tokens the policy generated (the learner's tokens)
    num_actions: int
    invalid_actions: int
    finished: bool  # ended with a complete <answer>
    truncated: bool  # ran out of response budget
    gold_recall: float | None  # share of the question's gold passages shown (None without gold ids)
    token_digest: str  # sha256 of the token ids: equal digests, equal tokens

    @property
    def searches(self) -> int:
        return len(self.retriever_versions)


def summarize_rollout(trajectory: Trajectory, question: QuestionRecord) -> RolloutSummary:
    t = trajectory
    return RolloutSummary(
        uid=t.uid,
        sample_index=t.sample_index,
        reward=t.reward,
        policy_version=t.policy_version,
        retriever_versions=tuple(turn.retriever_version for turn in t.retrieval_turns),
        response_tokens=t.response_length,
        action_tokens=sum(t.action_mask),
        num_actions=t.num_actions,
        invalid_actions=t.invalid_actions,
        finished=t.finished,
        truncated=t.truncated,
        gold_recall=gold_recall(question, t),
        token_digest=hashlib.sha256(json.dumps(t.token_ids).encode()).hexdigest(),
    )
