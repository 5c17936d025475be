"""Demonstration trajectories for the warm-up (cold-start SFT): the search protocol written out in full.

A 270M base model cannot discover the protocol by sampling, so GRPO sees no reward (README,
"The warm-up"). A demonstration is a :class:`~bridge_ray.agent.types.Trajectory` built exactly like a
rollout — prompt ids from the same template, action segments (mask 1) and observation blocks (mask 0)
appended through the same two methods — so the warm-up learns on the same token layout RL later trains.

Two sources:

- :func:`gold_search_demonstrations`: from QA records that name their gold passages (the bundled world's
  ``metadata.gold_doc_ids``, one per hop). Each hop is a search for ``metadata.gold_queries``'s query of
  that hop where the record names one (the gap world), else for the gold passage's title; the real
  retriever answers it and the gold passage is kept among the shown ones; then the first golden answer.
- :func:`load_demonstrations`: a user's JSONL of trajectory or chat records
  (:mod:`bridge_ray.data.demonstrations`): a trajectory's prompt comes from the template and its observations are
  wrapped in ``<information>``; a chat record's prompt and observations are taken as written.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge_ray.agent.loop import shown_with_gold
from bridge_ray.agent.prompt import ChatTemplateMode, PromptTemplate, prompt_token_ids
from bridge_ray.agent.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, ObservationRenderer
from bridge_ray.agent.reward import cover_exact_match
from bridge_ray.agent.types import Trajectory
from bridge_ray.data.demonstrations import (
    DemonstrationRecord,
    check_gold_searches,
    gold_passage_ids,
    read_demonstrations,
)
from bridge_ray.data.qa import QuestionRecord
from bridge_ray.retrieval.types import Passage

if TYPE_CHECKING:  # type hints only: the control plane imports these modules without transformers
    from transformers import PreTrainedTokenizerBase

_WHOLE_PROMPT = PromptTemplate("{question}", source="chat record")


def search_action(query: str) -> str:
    return f"{SEARCH_OPEN} {query} {SEARCH_CLOSE}"


def answer_action(answer: str) -> str:
    return f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"


class DemonstrationBuilder:
    """Turns prompts, actions and observations into trajectories, on token ids like the rollout loop."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: PromptTemplate,
        max_turns: int,
        renderer: ObservationRenderer,
        chat_template: ChatTemplateMode = "auto",
    ) -> None:
        self.tokenizer, self.template, self.max_turns = tokenizer, template, max_turns
        self.renderer, self.chat_template = renderer, chat_template

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def start(
        self, question: QuestionRecord | str, uid: str, answers: Sequence[str] = (), *, raw_prompt: bool = False
    ) -> Trajectory:
        """A trajectory holding only the prompt: ``question`` in the template, or as the whole prompt."""
        text = question.question if isinstance(question, QuestionRecord) else question
        template = _WHOLE_PROMPT if raw_prompt else self.template
        ids = prompt_token_ids(self.tokenizer, template, text, self.max_turns, self.chat_template)
        return Trajectory.start(uid, text, list(answers), 0, ids, policy_version=0)

    def act(self, trajectory: Trajectory, text: str) -> None:
        ids = self._ids(text)
        trajectory.add_action(ids, [0.0] * len(ids))

    def observe_passages(self, trajectory: Trajectory, passages: Sequence[Passage]) -> None:
        trajectory.add_observation(self.renderer.documents(passages)[0])

    def observe_text(self, trajectory: Trajectory, text: str) -> None:
        trajectory.add_observation(self._ids(text))


def gold_queries(record: QuestionRecord, gold: Sequence[Passage]) -> list[str]:
    """The search per hop that finds ``gold`` (the record's gold passages, one per hop):
    ``metadata.gold_queries`` where the record names them, else each passage's title."""
    return list(record.metadata.get("gold_queries", [p.title for p in gold]))[: len(gold)]


@dataclass(frozen=True)
class Detour:
    """A search made before a one-hop record's gold search: ``query`` finds passage ``doc_id``, which names the
    entity the gold passage is about (a two-hop record's first hop into that passage)."""

    doc_id: int
    query: str


def detour_sources(records: Sequence[QuestionRecord]) -> dict[int, list[Detour]]:
    """Gold passage id -> the first hops of the two-hop records whose second hop it is, each a passage that names
    its entity (a person's career passage names the employer the second hop is about)."""
    sources: dict[int, list[Detour]] = {}
    for record in records:
        ids = record.metadata.get("gold_doc_ids") or []
        queries = record.metadata.get("gold_queries")
        if len(ids) == 2 and ids[0] != ids[1]:
            sources.setdefault(int(ids[1]), []).append(Detour(int(ids[0]), queries[0] if queries else ""))
    return sources


def plan_detours(
    records: Sequence[QuestionRecord], sources: Mapping[int, list[Detour]], share: float, rng: random.Random
) -> dict[str, Detour]:
    """Record uid -> its detour, for about ``share`` of the one-hop records whose gold passage has a source, each
    drawn by ``rng`` (one draw per such record, whatever ``share``, so that shares nest)."""
    plans = {}
    for record in records:
        ids = record.metadata.get("gold_doc_ids") or []
        options = sources.get(int(ids[0]), []) if len(ids) == 1 else []
        if options:
            coin, detour = rng.random(), rng.choice(options)
            if coin < share:
                plans[record.uid] = detour
    return plans


def gold_search_demonstrations(
    records: Sequence[QuestionRecord],
    builder: DemonstrationBuilder,
    retrieve,
    passages,
    detours: Mapping[str, Detour] | None = None,
) -> list[Trajectory]:
    """One demonstration per record with ``metadata.gold_doc_ids``: a search per hop (the record's
    ``metadata.gold_queries`` when it has them, else its gold passage's title; at most ``max_turns``), each
    showing its gold passage (the demonstration shows the evidence its answer rests on), then ``<answer>``
    with the first golden answer.

    A record in ``detours`` first searches its detour (the passage's title where the source names no query),
    with that passage shown, as an observation (mask 0: the warm-up never teaches a search that misses), where
    the searches still fit ``max_turns`` and no shown passage holds a golden answer or the gold passage.

    ``retrieve(queries) -> list[RetrievalResult]`` is the real retriever, ``passages(ids) -> list[Passage]``
    reads corpus rows (both :class:`~bridge_ray.retrieval.client.RetrieverClient` methods).
    """
    check_gold_searches(records)
    demos = []
    for record in (r for r in records if gold_passage_ids(r)):
        gold = passages(gold_passage_ids(record)[: builder.max_turns])
        queries = gold_queries(record, gold)
        results = retrieve(queries)
        trajectory = builder.start(record, record.uid, record.golden_answers)
        if (detour := (detours or {}).get(record.uid)) is not None and len(gold) < builder.max_turns:
            _take_detour(trajectory, builder, record, detour, gold, retrieve, passages)
        for hop, (passage, query, result) in enumerate(zip(gold, queries, results, strict=True)):
            builder.act(trajectory, search_action(query))
            builder.observe_passages(trajectory, shown_with_gold(result.shown, [passage], f"{record.uid}/{hop}"))
        builder.act(trajectory, answer_action(record.golden_answers[0]))
        trajectory.answer, trajectory.finished, trajectory.done = record.golden_answers[0], True, True
        demos.append(trajectory)
    return demos


def _take_detour(
    trajectory: Trajectory, builder: DemonstrationBuilder, record: QuestionRecord, detour: Detour,
    gold: Sequence[Passage], retrieve, passages,
) -> None:
    [source] = passages([detour.doc_id])
    query = detour.query or source.title
    [result] = retrieve([query])
    shown = shown_with_gold(result.shown, [source], f"{record.uid}/detour")
    gold_ids = {p.id for p in gold}
    if any(p.id in gold_ids or cover_exact_match(p.text, record.golden_answers) for p in shown):
        return
    builder.observe_text(trajectory, search_action(query))
    builder.observe_passages(trajectory, shown)


def load_demonstrations(path: str | Path, builder: DemonstrationBuilder) -> list[Trajectory]:
    """Trajectory or chat records from a JSONL file (:mod:`bridge_ray.data.demonstrations`, which names the file
    and line of a malformed one), each built on token ids like a rollout."""
    return [_demonstration(record, builder) for record in read_demonstrations(path)]


def _demonstration(record: DemonstrationRecord, builder: DemonstrationBuilder) -> Trajectory:
    """A trajectory record's observations are wrapped as retrieved text is; a chat record's are taken as written."""
    trajectory = builder.start(record.prompt, record.where, raw_prompt=record.chat)
    for step in record.steps:
        if step.action:
            builder.act(trajectory, step.text)
        elif record.chat:
            builder.observe_text(trajectory, step.text)
        else:
            builder.observe_text(trajectory, f"\n\n<information>{step.text}</information>\n\n")
    return trajectory
