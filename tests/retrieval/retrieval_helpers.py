"""Retrieval test helpers (plain functions; the fixtures are in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


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
