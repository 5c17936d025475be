import json

from bridge_ray.agent.outcomes import question_outcome
from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.evaluation.table import summarize


def test_an_outcome_keeps_the_answer_and_searches_that_the_eval_json_lists_per_question():
    question = QuestionRecord("world/q1", "Who founded the institution where Ada worked?", ["Bo Lind"], "world",
                              {"type": "two_hop", "gold_doc_ids": [3, 7]})
    trajectory = Trajectory.start("world/q1", question.question, ["Bo Lind"], 0, [1, 2], 0)
    for n, (query, shown) in enumerate([("Ada", ["3"]), ("Vell Institute founder", ["9"])]):
        trajectory.retrieval_turns.append(RetrievalTurn(n, [1], "", query, [int(shown[0])], [0.5], shown, 0, 0))
    trajectory.answer = "Vell Institute"
    outcome = question_outcome(question, trajectory)
    assert (outcome.em, outcome.recall, outcome.type) == (0.0, 0.5, "two_hop")
    assert outcome.answer == "Vell Institute" and outcome.queries == ("Ada", "Vell Institute founder")

    unanswered = question_outcome(question, Trajectory.start("world/q1", question.question, ["Bo Lind"], 0, [1], 0))
    listed = json.loads(summarize({"world": [outcome, unanswered]}).to_json())["questions"]["world"]
    assert listed["uid"] == ["world/q1", "world/q1"] and listed["em"] == [0.0, 0.0]
    assert listed["answer"] == ["Vell Institute", None]
    assert listed["queries"] == [["Ada", "Vell Institute founder"], []]
