"""Shared retrieval fixtures: a small synthetic world indexed once per session with the real MiniLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.data.world import SMALL_SIZE, write_world


@pytest.fixture(scope="session")
def minilm_spec():
    return load_config().retrieval.encoder.spec()


@pytest.fixture(scope="session")
def small_world(tmp_path_factory) -> Path:
    return write_world(tmp_path_factory.mktemp("world"), seed=0, size=SMALL_SIZE)


@pytest.fixture(scope="session")
def world_index(tmp_path_factory, small_world) -> Path:
    """The small world's corpus, encoded by the real MiniLM into 2 flat shards through the CLI."""
    out = tmp_path_factory.mktemp("index") / "world"
    rc = main(
        [
            "build-index",
            "--corpus",
            str(small_world / "corpus.jsonl"),
            "--out",
            str(out),
            "--shards",
            "2",
            "--no-progress",
            "--chunk",
            "64",
        ]
    )
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def passage_encoder(minilm_spec):
    from bridge_ray.retrieval.encoder import PassageEncoder

    return PassageEncoder(minilm_spec, device="cpu")
