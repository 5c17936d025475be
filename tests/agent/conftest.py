"""Fixtures of the agent tests, loaded once per session: the real packaged models, and the production retriever
(MiniLM query encoder + FAISS shards) over the small world's index, with that world's questions."""

from __future__ import annotations

import pytest
import torch
from agent_helpers import RecordingRetriever, tiny_gemma

from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.engines.models import load_causal_lm, load_tokenizer
from bridge_ray.model_paths import PACKAGED_GEMMA
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder

# The CI box is shared: one intra-op thread avoids the oversubscription that makes small ops 5-10x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def gemma_tokenizer():
    return load_tokenizer(PACKAGED_GEMMA)


@pytest.fixture(scope="session")
def gemma_model():
    return load_causal_lm(PACKAGED_GEMMA, dtype="float32")


@pytest.fixture(scope="session")
def retriever(world_index, minilm_spec) -> RecordingRetriever:
    """k = 4 candidates, m = 2 shown, at adapter version 3 (so a test sees the version travel)."""
    client = RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index, num_candidates=4, num_shown=2,
                                        version=3)
    return RecordingRetriever(client)


@pytest.fixture(scope="session")
def world_questions(small_world) -> list[QuestionRecord]:
    """The small world's train split, with each question's gold passages (``metadata.gold_doc_ids``)."""
    return load_questions([small_world / "train.jsonl"])


@pytest.fixture(scope="session")
def make_tiny(gemma_tokenizer):
    """``make_tiny(seed)``: a fresh tiny random Gemma 3 over the real Gemma vocabulary."""
    return lambda seed=0: tiny_gemma(len(gemma_tokenizer), seed=seed)


@pytest.fixture(scope="session")
def tiny_model(make_tiny):
    return make_tiny(0)
