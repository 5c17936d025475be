"""Per-round training diagnostics: why the rewards of a round look the way they do.

GRPO learns only from groups (the G trajectories of one question) whose rewards differ. When every group
is flat, every advantage is 0 and the policy update does nothing; the figures here say which step of the
search loop (answering, retrieving, reading) is the likely reason, and :func:`zero_signal_warning` says it
in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from bridge_ray.agent.types import Trajectory
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.evaluation.outcomes import gold_recall

# Below this share, answers (``answered``) are "few" and retrieval (``gold_recall``) "misses the evidence".
LOW = 0.5
WARM_UP = "warm the policy up first (python -m bridge_ray sft, or warmup.enabled=true in train)"


def round_diagnostics(trajectories: Sequence[Trajectory], questions: Sequence[QuestionRecord]) -> dict[str, float]:
    """Reward, GRPO signal, action and retrieval figures of one round's rollouts (questions matched by uid).

    ``gold_recall`` is left out when no question of the round has ``metadata.gold_doc_ids``.
    """
    if not trajectories:
        raise ValueError("round_diagnostics needs at least one trajectory")
    groups: dict[str, set[float]] = defaultdict(set)
    for t in trajectories:
        groups[t.uid].add(t.reward)
    figures = {
        "reward": _mean([t.reward for t in trajectories]),
        "reward_positive": _mean([t.reward > 0 for t in trajectories]),
        "zero_variance_groups": _mean([len(rewards) == 1 for rewards in groups.values()]),
        "answered": _mean([t.finished for t in trajectories]),
        "invalid_action_rate": sum(t.invalid_actions for t in trajectories)
        / max(sum(t.num_actions for t in trajectories), 1),
        "truncated": _mean([t.truncated for t in trajectories]),
        "searches_per_trajectory": _mean([len(t.retrieval_turns) for t in trajectories]),
        "response_tokens": _mean([t.response_length for t in trajectories]),
    }
    by_uid = {q.uid: q for q in questions}
    recalls = [r for t in trajectories if (r := gold_recall(by_uid[t.uid], t)) is not None]
    if recalls:
        figures["gold_recall"] = _mean(recalls)
    return figures


def zero_signal_warning(figures: Mapping[str, float]) -> str | None:
    """A short warning when no GRPO group has a reward spread (the round teaches the policy nothing), naming
    the likely cause from :func:`round_diagnostics`' figures; None while some group has a signal."""
    if figures["zero_variance_groups"] < 1:
        return None
    return (
        "every GRPO group has equal rewards, so every advantage is 0 and the policy update learns nothing: "
        f"{_likely_cause(figures)}. Raising algorithm.grpo.rollouts_per_question, or rollout.oversample with "
        "rollout.dynamic_sampling, makes mixed groups more likely."
    )


def _likely_cause(figures: Mapping[str, float]) -> str:
    answered, recall = figures["answered"], figures.get("gold_recall")
    if figures["reward_positive"] == 1:
        return "every trajectory is rewarded: the questions are too easy for this policy, GRPO has no signal"
    if figures["reward_positive"] > 0:
        return (
            f"each question is either always or never solved (reward_positive={figures['reward_positive']:.2f}): "
            "its rollouts do not differ"
        )
    if answered < LOW:
        return (
            f"no trajectory is rewarded and the policy rarely writes a complete <answer> (answered={answered:.2f}, "
            f"truncated={figures['truncated']:.2f}): {WARM_UP} or raise rollout.max_response_length"
        )
    if recall is not None and recall < LOW:
        return (
            f"the policy answers (answered={answered:.2f}) but is never right, and retrieval misses the evidence "
            f"(gold_recall={recall:.2f}): check the index and the queries the policy writes"
        )
    if recall is None:
        return (
            f"the policy answers (answered={answered:.2f}) but is never right, and without gold passages retrieval "
            f"cannot be told from reading: check the queries it writes, {WARM_UP}"
        )
    return (
        f"the policy answers (answered={answered:.2f}) but is never right although the evidence is shown "
        f"(gold_recall={recall:.2f}): it reads the passages badly, {WARM_UP}"
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
