"""Which logged retrieval turns reach the retriever update (``algorithm.retriever.turns``)."""

import pytest
import torch
from pydantic import ValidationError

from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.config import AlgorithmConfig
from bridge_ray.retriever_learner.learner import retriever_batch


def trajectory(queries: list[str]) -> Trajectory:
    t = Trajectory.start("q0", "question", ["a"], 0, [1, 2], policy_version=0)
    t.retrieval_turns = [
        RetrievalTurn(n, [1], "", q, [n, 9], [0.5, 0.1], [str(n)], 0, 0) for n, q in enumerate(queries)
    ]
    return t


def test_last_keeps_each_trajectorys_final_search_with_its_advantage():
    trajectories = [trajectory(["first hop", "second hop"]), trajectory(["only"]), trajectory([])]
    logp = [[[-1.0, -2.0], [-3.0, -4.0]], [[-5.0, -6.0]], []]
    advantages = torch.tensor([0.5, -0.5, 0.0])
    every = retriever_batch(trajectories, logp, advantages)
    last = retriever_batch(trajectories, logp, advantages, "last")
    assert every.queries == ["first hop", "second hop", "only"]
    assert last.queries == ["second hop", "only"]
    assert last.answer_logp.tolist() == [[-3.0, -4.0], [-5.0, -6.0]]
    assert last.advantages.tolist() == [0.5, -0.5]
    assert last.doc_ids[:, 0].tolist() == [1, 0]


@pytest.mark.parametrize("estimator", ["drop", "two_state"])
def test_last_turns_are_refused_where_the_policy_takes_l_rag_over_every_turn(estimator):
    with pytest.raises(ValidationError, match=r"retriever\.turns: all"):
        AlgorithmConfig(estimator=estimator, retriever={"turns": "last"})
    assert AlgorithmConfig(retriever={"turns": "last"}).retriever.turns == "last"
