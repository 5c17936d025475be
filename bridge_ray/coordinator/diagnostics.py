"""Per-round training diagnostics: why the rewards of a round look the way they do.

GRPO learns only from groups (the G trajectories of one question) whose rewards differ. When every group
is flat, every advantage is 0 and the policy update does nothing; the figures here say which step of the
search loop (answering, retrieving, reading) is the likely reason, and :func:`zero_signal_warning` says it
in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from bridge_ray.sampler.summary import RolloutSummary

# Below this share, answers (``answered``) are "few" and retrieval (``gold_recall``) "misses the evidence".
LOW = 0.5
WARM_UP = "warm the policy up first (python -m bridge_ray warmup, or warmup.enabled=true in train)"


def round_diagnostics(summaries: Sequence[RolloutSummary]) -> dict[str, float]:
    """Reward, GRPO signal, action and retrieval figures of one round's rollouts, from their summaries.

    ``gold_recall`` is left out when no question of the round has ``metadata.gold_doc_ids``.
    """
    if not summaries:
        raise ValueError("round_diagnostics needs at least one trajectory")
    groups: dict[str, set[float]] = defaultdict(set)
    for s in summaries:
        groups[s.uid].add(s.reward)
    figures = {
        "reward": _mean([s.reward for s in summaries]),
        "reward_positive": _mean([s.reward > 0 for s in summaries]),
        "zero_variance_groups": _mean([len(rewards) == 1 for rewards in groups.values()]),
        "answered": _mean([s.finished for s in summaries]),
        "invalid_action_rate": sum(s.invalid_actions for s in summaries)
        / max(sum(s.num_actions for s in summaries), 1),
        "truncated": _mean([s.truncated for s in summaries]),
        "searches_per_trajectory": _mean([s.searches for s in summaries]),
        "response_tokens": _mean([s.response_tokens for s in summaries]),
    }
    recalls = [s.gold_recall for s in summaries if s.gold_recall is not None]
    if recalls:
        figures["gold_recall"] = _mean(recalls)
    return figures


def record_diagnostics(round_index: int, summaries: Sequence[RolloutSummary], record: dict) -> dict[str, float]:
    """The round's diagnostics, also kept in its reward phase ``record``, with a warning printed and recorded when
    no GRPO group carries a signal: the rollouts alone say why training stalls."""
    figures = round_diagnostics(summaries)
    record.update(figures)
    if (warning := zero_signal_warning(figures)) is not None:
        print(f"WARNING [round {round_index}] {warning}", flush=True)
        record["warning"] = warning
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
