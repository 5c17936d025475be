"""The text protocol between the policy and the system: action tags, their parsing, and observations.

Observations are built as token ids, never by re-tokenising the running text: the ids inserted into a
trajectory are exactly the ids of :meth:`ObservationRenderer.documents` (or ``corrective_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bridge_ray.retrieval.types import Passage

if TYPE_CHECKING:  # type hints only: the control plane imports these modules without transformers
    from transformers import PreTrainedTokenizerBase

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
# Generation stops at the first of these (or EOS): one action per turn.
STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)
# What the system says after an invalid action. It names the tags but holds no complete tag pair, so nothing
# in it can ever be read as a search or an answer.
CORRECTIVE_MESSAGE = (
    "Invalid action. To search, write <search> then your query and close the tag; to finish, write <answer> "
    "then the final answer and close the tag."
)


@dataclass(frozen=True)
class Action:
    """The first complete action of a turn's text: a search query, an answer, or nothing valid."""

    kind: Literal["search", "answer", "invalid"]
    content: str = ""


def parse_action(text: str) -> Action:
    """The first complete ``<search>…</search>`` or ``<answer>…</answer>`` of ``text``.

    "First" is by closing tag; its content starts after the last matching opening tag before it. A search
    with an empty query is invalid; an empty answer is still an answer (it simply scores 0).
    """
    ends = []
    for kind, opening, closing in (("search", SEARCH_OPEN, SEARCH_CLOSE), ("answer", ANSWER_OPEN, ANSWER_CLOSE)):
        end = text.find(closing)
        if end >= 0:
            ends.append((end, kind, opening))
    for end, kind, opening in sorted(ends):
        start = text.rfind(opening, 0, end)
        if start < 0:
            continue
        content = text[start + len(opening) : end].strip()
        if kind == "search" and not content:
            return Action("invalid")
        return Action(kind, content)  # type: ignore[arg-type]
    return Action("invalid")


def format_documents(passages: Sequence[Passage]) -> str:
    """``Doc i(Title: title) text`` per passage, one per line, numbered from 1 (the format Search-R1 models know)."""
    return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))


class ObservationRenderer:
    """Token ids of observation blocks, truncated to a token budget with the closing tag always kept."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.open_ids = self._ids(f"\n\n{INFO_OPEN}")
        self.close_ids = self._ids(f"{INFO_CLOSE}\n\n")
        self.corrective_ids = self._ids(f"\n\n{CORRECTIVE_MESSAGE}\n\n")
        if self.overhead >= max_tokens or len(self.corrective_ids) > max_tokens:
            raise ValueError(
                f"rollout.max_observation_length ({max_tokens}) cannot hold the {INFO_OPEN} block's tags "
                f"or the corrective message"
            )

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    @property
    def overhead(self) -> int:
        """Tokens of the block's own tags: a budget must exceed this to hold any document text."""
        return len(self.open_ids) + len(self.close_ids)

    def documents(self, passages: Sequence[Passage], budget: int | None = None) -> tuple[list[int], bool]:
        """The ``<information>`` block for ``passages`` within ``min(max_tokens, budget)`` tokens, and whether its
        body was cut to fit (the closing tag is always kept)."""
        limit = self.max_tokens if budget is None else min(self.max_tokens, budget)
        if limit <= self.overhead:
            raise ValueError(f"an observation budget of {limit} tokens cannot hold the {INFO_OPEN} block's tags")
        body = self._ids(format_documents(passages))
        room = limit - self.overhead
        return [*self.open_ids, *body[:room], *self.close_ids], len(body) > room
