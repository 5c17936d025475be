"""Fixtures of the agent tests: the real packaged models and the MiniLM retriever, loaded once per session."""

from __future__ import annotations

import pytest
import torch
from agent_helpers import tiny_gemma

from bridge_ray.agent.sandbox import PASSAGES, MiniLMRetriever
from bridge_ray.engines.models import PACKAGED_GEMMA, load_causal_lm, load_tokenizer

# The CI box is shared: one intra-op thread avoids the oversubscription that makes small ops 5-10x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def gemma_tokenizer():
    return load_tokenizer(PACKAGED_GEMMA)


@pytest.fixture(scope="session")
def gemma_model():
    return load_causal_lm(PACKAGED_GEMMA, dtype="float32")


@pytest.fixture(scope="session")
def retriever() -> MiniLMRetriever:
    return MiniLMRetriever(PASSAGES, k=4, m=2, version=3)


@pytest.fixture(scope="session")
def make_tiny(gemma_tokenizer):
    """``make_tiny(seed)``: a fresh tiny random Gemma 3 over the real Gemma vocabulary."""
    return lambda seed=0: tiny_gemma(len(gemma_tokenizer), seed=seed)


@pytest.fixture(scope="session")
def tiny_model(make_tiny):
    return make_tiny(0)
