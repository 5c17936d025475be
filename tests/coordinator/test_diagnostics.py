"""Per-round diagnostics on the summaries of hand-made trajectories, every figure computed by hand, and the
zero-signal warning."""

import pytest

from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.coordinator.diagnostics import round_diagnostics, zero_signal_warning
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.sampler.summary import RolloutSummary, summarize_rollout

TOKENS_PER_ACTION = 4


def trajectory(uid: str, sample: int, reward: float, actions: int, invalid: int = 0,
               shown: tuple[tuple[str, ...], ...] = (), finished: bool = False, truncated: bool = False) -> Trajectory:
    t = Trajectory.start(uid, "q?", ["a"], sample, [1, 2, 3], 0)
    for _ in range(actions):
        t.add_action([7] * TOKENS_PER_ACTION, [-0.5] * TOKENS_PER_ACTION)
    t.retrieval_turns = [RetrievalTurn(0, [1], "", "q", [0], [0.0], list(ids), 0, 0) for ids in shown]
    t.reward, t.invalid_actions, t.finished, t.truncated = reward, invalid, finished, truncated
    return t


QUESTIONS = [
    QuestionRecord("q1", "?", ["a"], "t", metadata={"gold_doc_ids": [1, 2]}),  # ints, compared as strings
    QuestionRecord("q2", "?", ["a"], "t", metadata={"gold_doc_ids": ["5"]}),
    QuestionRecord("q3", "?", ["a"], "t"),  # no gold passages: left out of gold_recall
]


def summaries(trajectories: list[Trajectory]) -> list[RolloutSummary]:
    """What the samplers send back of each trajectory, its question matched by uid."""
    by_uid = {q.uid: q for q in QUESTIONS}
    return [summarize_rollout(t, by_uid[t.uid]) for t in trajectories]


ROUND = [
    trajectory("q1", 0, 1.0, 3, shown=(("1", "3"), ("4",)), finished=True),  # recall 1/2
    trajectory("q1", 1, 0.0, 2, shown=(("2", "1"),), finished=True),  # recall 1
    trajectory("q2", 0, 0.0, 2, invalid=2, truncated=True),  # recall 0
    trajectory("q2", 1, 0.0, 3, invalid=1, shown=(("5",),)),  # recall 1
    trajectory("q3", 0, 1.0, 1, finished=True),
    trajectory("q3", 1, 1.0, 1, finished=True),
]


def test_every_figure_of_a_mixed_round():
    figures = round_diagnostics(summaries(ROUND))
    assert figures == pytest.approx({
        "reward": 3 / 6,
        "reward_positive": 3 / 6,
        "zero_variance_groups": 2 / 3,  # q2 all 0, q3 all 1; q1 mixed
        "answered": 4 / 6,
        "invalid_action_rate": 3 / 12,
        "truncated": 1 / 6,
        "searches_per_trajectory": 4 / 6,
        "response_tokens": TOKENS_PER_ACTION * 12 / 6,
        "gold_recall": (0.5 + 1 + 0 + 1) / 4,
    })
    assert zero_signal_warning(figures) is None, "q1's group still teaches the policy"
    assert "gold_recall" not in round_diagnostics(summaries(ROUND[4:]))
    with pytest.raises(ValueError, match="at least one trajectory"):
        round_diagnostics([])


def test_an_all_zero_round_warns_that_the_policy_rarely_answers():
    stalled = [trajectory(q.uid, g, 0.0, 2, invalid=1, truncated=True) for q in QUESTIONS for g in range(2)]
    figures = round_diagnostics(summaries(stalled))
    assert (figures["zero_variance_groups"], figures["reward"], figures["answered"]) == (1.0, 0.0, 0.0)
    warning = zero_signal_warning(figures)
    assert warning is not None and "every advantage is 0" in warning
    assert "complete <answer> (answered=0.00" in warning and "python -m bridge_ray warmup" in warning
    assert "rollout.max_response_length" in warning and "algorithm.grpo.rollouts_per_question" in warning


FLAT = {"zero_variance_groups": 1.0, "truncated": 0.0}


@pytest.mark.parametrize(("figures", "cause"), [
    ({**FLAT, "reward_positive": 1.0, "answered": 1.0}, "too easy"),
    ({**FLAT, "reward_positive": 0.5, "answered": 1.0}, "either always or never solved"),
    ({**FLAT, "reward_positive": 0.0, "answered": 0.9, "gold_recall": 0.1}, "retrieval misses the evidence"),
    ({**FLAT, "reward_positive": 0.0, "answered": 0.9, "gold_recall": 0.9}, "reads the passages badly"),
    ({**FLAT, "reward_positive": 0.0, "answered": 0.9}, "retrieval cannot be told from reading"),
])
def test_the_warning_names_the_likely_cause(figures, cause):
    warning = zero_signal_warning(figures)
    assert warning is not None and cause in warning and "rollouts_per_question" in warning
