"""One evaluated question: answer scores of its greedy trajectory and, when gold passages are known, recall.

A sampler scores the questions it evaluates itself (its rollout summaries report the recall too); the
evaluation tables (:mod:`bridge_ray.evaluation.table`) sum the outcomes up.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_ray.agent.reward import cover_exact_match, exact_match, f1_score
from bridge_ray.agent.types import Trajectory
from bridge_ray.data.qa import QuestionRecord


@dataclass(frozen=True)
class QuestionOutcome:
    em: float
    f1: float
    cover_em: float
    recall: float | None = None  # share of gold passages shown in any turn; None when unknown
    type: str | None = None
    uid: str | None = None  # the question's id: two evaluations of one set are paired question by question
    answer: str | None = None  # what the policy answered (None: no complete <answer>)
    queries: tuple[str, ...] = ()  # its searches, in order


def question_outcome(question: QuestionRecord, trajectory: Trajectory) -> QuestionOutcome:
    """EM / F1 / cover-EM of the answer the policy wrote (response only), gold-passage recall, and the answer and
    searches themselves (what a wrong answer came from)."""
    return QuestionOutcome(
        em=exact_match(trajectory.answer, question.golden_answers),
        f1=f1_score(trajectory.answer, question.golden_answers),
        cover_em=cover_exact_match(trajectory.answer, question.golden_answers),
        recall=gold_recall(question, trajectory),
        type=question.metadata.get("type"),
        uid=question.uid,
        answer=trajectory.answer,
        queries=tuple(turn.query for turn in trajectory.retrieval_turns),
    )


def gold_recall(question: QuestionRecord, trajectory: Trajectory) -> float | None:
    """The share of ``metadata.gold_doc_ids`` among the passages shown in any turn (None without gold ids):
    whether the agent's searches surfaced the evidence, whatever it then answered.

    Ids are compared as strings: data sets may store them as ints, passages carry them as strings.
    """
    gold = [str(d) for d in question.metadata.get("gold_doc_ids", [])]
    shown = {str(d) for turn in trajectory.retrieval_turns for d in turn.shown_ids}
    return sum(d in shown for d in gold) / len(gold) if gold else None
