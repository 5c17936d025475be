"""The index manifest: what an index directory holds and the encoder configuration that produced it.

``manifest.json`` is written last by ``build-index``, so its presence marks a complete index. Layout::

    DIR/manifest.json
    DIR/passages.jsonl, DIR/passages.offsets.npy      the corpus rows, by global row id
    DIR/shard_000/embeddings.npy                       g(d) of rows [start, stop), float32 [n, dim]
    DIR/shard_000/index.faiss                          hnsw / ivf only (flat is rebuilt from the embeddings)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bridge_ray.retrieval.presets import EncoderSpec

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


class IndexMismatchError(ValueError):
    """The index on disk does not fit the configuration that wants to use it."""


@dataclass(frozen=True)
class ShardEntry:
    id: int
    start: int
    stop: int
    files: dict[str, str]  # path relative to the index dir -> sha256

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class IndexManifest:
    encoder: dict  # EncoderSpec.to_dict() of the passage side
    dim: int
    num_passages: int
    build: dict  # the settings a resumed build must match: corpus, encoder, shards, index type and params
    shards: list[ShardEntry]
    passage_files: dict[str, str]
    skipped_lines: list[list] = field(default_factory=list)  # [line number, reason] of skipped corpus lines
    metric: str = "inner_product"
    format_version: int = FORMAT_VERSION

    @property
    def index_type(self) -> str:
        return self.build["index_type"]

    def shard_dir(self, index_dir: str | Path, shard_id: int) -> Path:
        return Path(index_dir) / shard_dirname(shard_id)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def shard_dirname(shard_id: int) -> str:
    return f"shard_{shard_id:03d}"


def load_manifest(index_dir: str | Path, encoder: EncoderSpec | None = None) -> IndexManifest:
    """Read ``index_dir/manifest.json``; with ``encoder``, refuse an index built under another configuration."""
    path = Path(index_dir) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir} is not a complete index: {MANIFEST_FILE} is missing (run build-index)")
    data = json.loads(path.read_text())
    if data.get("format_version") != FORMAT_VERSION:
        raise IndexMismatchError(f"{path}: format_version {data.get('format_version')}, expected {FORMAT_VERSION}")
    manifest = IndexManifest(**{**data, "shards": [ShardEntry(**s) for s in data["shards"]]})
    if encoder is not None:
        check_encoder(manifest, encoder, index_dir)
    return manifest


def check_encoder(manifest: IndexManifest, encoder: EncoderSpec, index_dir: str | Path) -> None:
    mismatches = encoder.index_mismatches(manifest.encoder)
    if mismatches:
        raise IndexMismatchError(
            f"index {index_dir} was built with another encoder configuration than retrieval.encoder: "
            + "; ".join(mismatches)
        )


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(index_dir: str | Path, manifest: IndexManifest) -> None:
    """Recompute every file checksum of the manifest; raise naming the first file that differs."""
    files = dict(manifest.passage_files)
    for shard in manifest.shards:
        files.update(shard.files)
    for rel, expected in files.items():
        actual = sha256_file(Path(index_dir) / rel)
        if actual != expected:
            raise IndexMismatchError(f"{Path(index_dir) / rel}: checksum {actual[:12]}… != manifest {expected[:12]}…")


def write_json_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
