"""The multi-turn search loop: batched over trajectories, engine- and retriever-agnostic.

Turn structure: up to ``max_turns`` search actions, then the answer is due, so a trajectory takes at most
``max_turns + 1`` actions. Each turn generates for every active trajectory in one engine call (stop at
``</search>``, ``</answer>`` or EOS) and sends every query of the turn to the retriever in one call. The
first complete action decides what happens:

- answer: the trajectory ends; its reward is the exact match of that answer (read from the response only);
- search, with searches left: the top-m passages are inserted as an ``<information>`` block (with the
  question's gold passages in place of the lowest-ranked ones, at slots drawn from the question, when the
  rollout is given them: the oracle evaluation, ``eval.oracle_retrieval``);
- anything else (no complete action, an empty query, the action budget used up): a short corrective
  observation, and the turn counts;
- EOS without an answer, a search or invalid action on the last turn, or a response budget too small for
  the next observation: the trajectory ends without an answer (reward 0; ``truncated`` for the budget).

The prompt is never cut: a prompt longer than ``max_prompt_length`` is an error, and only the response side
(actions and observations, ``max_response_length`` in total) is budgeted.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from bridge_ray.agent.prompt import ChatTemplateMode, PromptTemplate, prompt_token_ids
from bridge_ray.agent.protocol import STOP_STRINGS, ObservationRenderer, parse_action
from bridge_ray.agent.reward import exact_match
from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.data.qa import DataError, QuestionRecord
from bridge_ray.engines.base import GenerationEngine, SamplingSpec
from bridge_ray.retrieval.types import Passage, Retriever

if TYPE_CHECKING:  # type hints only: the control plane imports these modules without transformers
    from transformers import PreTrainedTokenizerBase


def shown_with_gold(shown: Sequence[Passage], gold: Sequence[Passage], salt: str) -> list[Passage]:
    """``shown`` with every ``gold`` passage among them: those missing replace the lowest-ranked others, then
    each moves to a slot drawn from ``salt`` and its id (a swap), so that where the evidence sits says nothing.

    Left at the replaced slot, the evidence was always last wherever the retriever missed it: on the gap world
    (gold shown by the frozen retriever 45% of the time) the warm-up demonstrations taught "answer from the last
    passage", which answered 3 of 4 dev questions whose gold passage was last and 1 of 6 whose gold was first. A
    gold passage the retriever showed keeps the retriever's slot. The passages that are not replaced stay the
    real retriever's, near-duplicate distractors included.
    """
    gold_ids = {p.id for p in gold}
    out = list(shown)
    missing = [p for p in gold if all(s.id != p.id for s in out)]
    others = [i for i, p in enumerate(out) if p.id not in gold_ids]
    placed = missing[: len(others)]
    for i, passage in zip(others[len(others) - len(placed) :], placed, strict=True):
        out[i] = passage
    for passage in placed:
        i, slot = out.index(passage), others[zlib.crc32(f"{salt}\0{passage.id}".encode()) % len(others)]
        out[i], out[slot] = out[slot], out[i]
    return out


def gold_passages(
    questions: Sequence[QuestionRecord], passages: Callable[[list[int]], list[Passage]]
) -> dict[str, list[Passage]]:
    """uid -> the question's gold passages (``metadata.gold_doc_ids``, read by ``passages(ids)``): what the
    oracle evaluation (``eval.oracle_retrieval``) shows; a question without them is an error naming the key."""
    for q in questions:
        if not q.metadata.get("gold_doc_ids"):
            raise DataError(
                f"eval.oracle_retrieval: question {q.uid} ({q.origin}) has no metadata.gold_doc_ids to show"
            )
    return {q.uid: passages([int(d) for d in q.metadata["gold_doc_ids"]]) for q in questions}


class RolloutSettings(Protocol):
    """The rollout limits (``bridge_ray.config.RolloutConfig`` satisfies this)."""

    temperature: float
    top_p: float
    max_turns: int
    max_prompt_length: int
    max_response_length: int
    max_action_length: int
    max_observation_length: int


class PromptSettings(Protocol):
    prompt_template: str | None
    chat_template: ChatTemplateMode


class AgentConfig(Protocol):
    """The parts of ``bridge_ray.config.Config`` the agent reads."""

    rollout: RolloutSettings
    policy: PromptSettings


class SearchAgent:
    """Runs G rollouts per question against one engine and one retriever."""

    def __init__(
        self,
        engine: GenerationEngine,
        retriever: Retriever,
        tokenizer: PreTrainedTokenizerBase,
        settings: RolloutSettings,
        template: PromptTemplate | None = None,
        chat_template: ChatTemplateMode = "auto",
    ) -> None:
        self.engine = engine
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.settings = settings
        self.template = template or PromptTemplate.load(None)
        self.chat_template = chat_template
        self.renderer = ObservationRenderer(tokenizer, settings.max_observation_length)
        self.sampling = SamplingSpec(temperature=settings.temperature, top_p=settings.top_p, stop=STOP_STRINGS)

    @classmethod
    def from_config(
        cls, engine: GenerationEngine, retriever: Retriever, tokenizer: PreTrainedTokenizerBase, config: AgentConfig
    ) -> SearchAgent:
        """The agent of a full configuration (``bridge_ray.config.Config``): its rollout and policy sections."""
        return cls(
            engine, retriever, tokenizer, config.rollout, PromptTemplate.load(config.policy.prompt_template),
            config.policy.chat_template,
        )

    def prompt_ids(self, question: QuestionRecord) -> list[int]:
        ids = prompt_token_ids(
            self.tokenizer, self.template, question.question, self.settings.max_turns, self.chat_template,
            question.metadata.get("options"),
        )
        if len(ids) > self.settings.max_prompt_length:
            raise ValueError(
                f"question {question.uid} ({question.origin}): the prompt has {len(ids)} tokens, more than "
                f"rollout.max_prompt_length ({self.settings.max_prompt_length}); it is never truncated"
            )
        return ids

    def rollout(
        self,
        questions: Sequence[QuestionRecord],
        group_size: int,
        gold: Mapping[str, Sequence[Passage]] | None = None,
    ) -> list[Trajectory]:
        """``group_size`` trajectories per question, grouped by question in the input order; with ``gold``
        (uid -> passages, :func:`gold_passages`) every search shows the question's gold passages."""
        version = self.engine.weight_version
        trajectories = []
        for q in questions:
            ids = self.prompt_ids(q)
            trajectories.extend(
                Trajectory.start(q.uid, q.question, q.golden_answers, g, ids, version) for g in range(group_size)
            )
        for turn in range(self.settings.max_turns + 1):
            active = [t for t in trajectories if not t.done]
            if not active:
                break
            self._turn(active, searches_allowed=turn < self.settings.max_turns, gold=gold)
        for t in trajectories:
            t.done = True
            t.response_text = self.tokenizer.decode(t.token_ids[t.prompt_length :], skip_special_tokens=False)
            t.reward = exact_match(t.answer, t.golden_answers)
        return trajectories

    def _remaining(self, t: Trajectory) -> int:
        return self.settings.max_response_length - t.response_length

    def _turn(
        self, active: list[Trajectory], searches_allowed: bool, gold: Mapping[str, Sequence[Passage]] | None
    ) -> None:
        budgets = [min(self.settings.max_action_length, self._remaining(t)) for t in active]
        generations = self.engine.generate([t.token_ids for t in active], budgets, self.sampling)
        version = self.engine.weight_version
        searches: list[tuple[Trajectory, str]] = []
        for t, gen in zip(active, generations, strict=True):
            t.add_action(gen.token_ids, gen.logprobs)
            action = parse_action(self.tokenizer.decode(gen.token_ids, skip_special_tokens=False))
            if action.kind == "invalid":  # counted however the turn then ends: corrected, EOS, last turn, no room
                t.invalid_actions += 1
            room = self._remaining(t)
            if action.kind == "answer":
                t.answer, t.finished, t.done = action.content, True, True
            elif gen.finish_reason == "eos" or not searches_allowed:
                t.done = True
            elif action.kind == "search" and room > self.renderer.overhead:
                searches.append((t, action.content))
            elif action.kind == "invalid" and room >= len(self.renderer.corrective_ids):
                self._observe(t, self.renderer.corrective_ids)
            else:  # no room left for the observation this action calls for
                t.truncated, t.done = True, True
        if not searches:
            return
        results = self.retriever.retrieve([query for _, query in searches])
        if len(results) != len(searches):
            raise RuntimeError(f"the retriever answered {len(results)} of {len(searches)} queries")
        for (t, query), result in zip(searches, results, strict=True):
            salt = f"{t.uid}/{len(t.retrieval_turns)}"
            shown = result.shown if gold is None else shown_with_gold(result.shown, gold[t.uid], salt)
            t.retrieval_turns.append(
                RetrievalTurn(
                    action_index=t.num_actions - 1,
                    prefix_ids=list(t.token_ids),
                    prefix_text=self.tokenizer.decode(t.token_ids, skip_special_tokens=False),
                    query=query,
                    doc_ids=list(result.doc_ids),
                    scores=list(result.scores),
                    shown_ids=[p.id for p in shown],
                    retriever_version=result.retriever_version,
                    policy_version=version,
                )
            )
            self._observe(t, self.renderer.documents(shown, self._remaining(t))[0])

    def _observe(self, t: Trajectory, ids: list[int]) -> None:
        """Insert an observation; a trajectory left without room to act is truncated."""
        t.add_observation(ids)
        if self._remaining(t) <= 0:
            t.truncated, t.done = True, True
