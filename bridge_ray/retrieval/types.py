"""The contract between the retriever and its users (the agent loop, the learners, the HTTP API).

The query encoder embeds the search query of a retrieval turn (the text of its ``<search>`` action,
the part of the prefix ``h_t`` the retriever sees); ``s_eta(h_t, d) = f_eta(query)ᵀ g(d)``. The agent
records the full prefix ``h_t`` separately for the answer-likelihood scorer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Passage:
    """One corpus row as shown to the policy: ``Doc i(Title: title) text``."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class RetrievalResult:
    """The outcome of one query: the k training candidates and the m passages shown.

    ``doc_ids`` are global integer ids (row numbers of the corpus in the index), best first, and
    ``scores`` their relevance under the adapter version ``retriever_version``; ``shown`` holds the
    first m of them as passages.
    """

    query: str
    doc_ids: list[int]
    scores: list[float]
    shown: list[Passage]
    retriever_version: int = 0


class Retriever(Protocol):
    """Anything that answers a batch of queries in one call (all the queries of one turn)."""

    def retrieve(self, queries: list[str]) -> list[RetrievalResult]: ...
