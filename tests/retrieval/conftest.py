"""Shared retrieval fixtures: a small synthetic world indexed once per session with the real MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def write_corpus(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "contents": f'"Doc {i}"\nbody of document {i}'}) + "\n")
    return path


class TableEmbedder:
    """Embeds passage ``d{i}`` as row i of a fixed table; counts what it was asked to embed."""

    def __init__(self, table: np.ndarray):
        self.table, self.calls = table, []

    def __call__(self, passages):
        rows = [int(p.id[1:]) for p in passages]
        self.calls.append(rows)
        return self.table[rows]


def vector_index(tmp_path: Path, table: np.ndarray, shards: int, index_type: str = "flat", **params) -> Path:
    """An index over ``table`` (row i = passage i) built by the real builder, without a model."""
    from bridge_ray.retrieval.build import build_index

    corpus = write_corpus(tmp_path / f"corpus-{len(table)}.jsonl", len(table))
    out = tmp_path / f"index-{index_type}-{shards}"
    build_index(
        corpus,
        out,
        TableEmbedder(table),
        encoder={"model": "table"},
        dim=table.shape[1],
        num_shards=shards,
        index_type=index_type,
        index_params=params,
        batch_size=500,
        progress=False,
    )
    return out
