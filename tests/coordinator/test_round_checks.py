"""The coordinator's per-round checks, on the summaries of hand-made trajectories: staleness bound, complete groups,
splits."""

import pytest

from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.coordinator.checks import StaleSampleError, check_complete_groups, check_staleness
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.runtime.actor_group import split_evenly
from bridge_ray.sampler.summary import RolloutSummary, summarize_rollout


def trajectory(uid: str, sample: int, policy_version: int, retriever_versions: tuple[int, ...] = ()) -> RolloutSummary:
    t = Trajectory.start(uid, "q?", ["a"], sample, [1, 2, 3], policy_version)
    t.retrieval_turns = [
        RetrievalTurn(0, [1], "", "q", [0], [0.0], ["0"], retriever_version=v, policy_version=policy_version)
        for v in retriever_versions
    ]
    return summarize_rollout(t, QuestionRecord(uid, "q?", ["a"], "t"))


def test_staleness_within_the_bound_returns_the_lags_and_beyond_it_names_the_sample():
    batch = [trajectory("q1", 0, 4, (6,)), trajectory("q1", 1, 5, (7,))]
    assert check_staleness(batch, 5, 7, max_staleness=1) == (1, 1)
    with pytest.raises(StaleSampleError, match=r"q1: generated with policy v4, learner is at v5"):
        check_staleness(batch, 5, 7, max_staleness=0)
    with pytest.raises(StaleSampleError, match=r"searched with retriever v6, learner is at v8"):
        check_staleness(batch, 5, 8, max_staleness=1)
    with pytest.raises(StaleSampleError, match="v6, learner is at v5"):  # from the future: a sync went wrong
        check_staleness([trajectory("q2", 0, 6)], 5, 0, max_staleness=3)


def test_complete_groups_catch_a_lost_or_a_doubled_share():
    questions = [QuestionRecord("q1", "?", ["a"], "t"), QuestionRecord("q2", "?", ["b"], "t")]
    full = [trajectory(q.uid, g, 0) for q in questions for g in range(2)]
    check_complete_groups(full, questions, 2)
    with pytest.raises(RuntimeError, match=r"missing \[\('q2', 1\)\]"):
        check_complete_groups(full[:-1], questions, 2)
    with pytest.raises(RuntimeError, match=r"duplicated \[\('q1', 0\)\]"):
        check_complete_groups([*full, full[0]], questions, 2)


def test_split_evenly_keeps_order_and_sizes_within_one():
    parts = split_evenly(list(range(7)), 3)
    assert parts == [[0, 1], [2, 3], [4, 5, 6]] and split_evenly([1], 3) == [[], [], [1]]
