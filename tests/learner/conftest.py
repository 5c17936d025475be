"""Fixtures of the policy-learner tests: the tiny model on disk and a local Ray instance per module."""

from __future__ import annotations

import os

import pytest
import ray
from learner_fixtures import tiny_gemma3


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gemma3")
    tiny_gemma3().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def local_ray():
    """A small local Ray instance for one test module (other engineers' clusters are left alone)."""
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=300_000_000, log_to_driver=False)
    yield
    ray.shutdown()
