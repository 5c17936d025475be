"""Fixtures of the policy-learner tests: the tiny model on disk (the local Ray instance is suite-wide)."""

from __future__ import annotations

import pytest
from learner_fixtures import tiny_gemma3


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gemma3")
    tiny_gemma3().save_pretrained(path)
    return path
