"""The index manifest: what an index directory holds and the encoder configuration that produced it.

``manifest.json`` is written last by ``build-index``, so its presence marks a complete index. Layout::

    DIR/manifest.json
    DIR/passages.jsonl, DIR/passages.offsets.npy      the corpus rows, by global row id
    DIR/shard_000/embeddings.npy                       g(d) of rows [start, stop), float32 [n, dim]
    DIR/shard_000/index.faiss                          hnsw / ivf only (flat is rebuilt from the embeddings)

Loading checks the files against the manifest before anything serves from them: a damaged index is an
error naming the file at load, not a failure on every request later. ``encoder`` records the encoder the index is
for (``EncoderSpec.to_dict()``, ``passage_text`` included): ``model`` the query encoder, ``passage_model`` the
passage encoder that embedded the corpus, written only for an asymmetric pair (MedCPT, DPR); without it one model
embeds both sides, as in every manifest written before pairs. A query encoder or a passage encoder other than the
recorded one is refused wherever an encoder is checked, with the ``build-index`` command that fits the index to it.
A manifest without ``passage_text`` predates verbatim ``contents`` encoding and is refused there too, with a
note to rebuild.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from bridge_ray.cache_key import file_digest
from bridge_ray.config.encoders import EncoderSpec, both_sides
from bridge_ray.errors import InputError
from bridge_ray.retrieval.corpus import PASSAGES_FILE

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
VerifyMode = Literal["auto", "always", "never"]  # retrieval.index.verify
AUTO_VERIFY_MAX_BYTES = 256 << 20  # "auto" hashes an index this small: a second or so of reading
REBUILD = "the index is damaged: rebuild it (build-index --overwrite)"


class IndexMismatchError(InputError):
    """The index on disk does not fit the configuration that wants to use it, or its files are damaged."""


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
    encoder: dict  # EncoderSpec.to_dict(): model (+ passage_model for a pair), pooling, prefixes, lengths, passage_text
    dim: int
    num_passages: int
    build: dict  # the settings a resumed build must match: corpus, encoder, shards, index type and params
    shards: list[ShardEntry]
    passage_files: dict[str, str]
    skipped_lines: list[list] = field(default_factory=list)  # [line number, reason] of skipped corpus lines
    metric: str = "inner_product"
    format_version: int = FORMAT_VERSION
    sizes: dict[str, int] = field(default_factory=dict)  # path -> bytes; {} in manifests written before sizes

    @property
    def index_type(self) -> str:
        return self.build["index_type"]

    def shard_dir(self, index_dir: str | Path, shard_id: int) -> Path:
        return Path(index_dir) / shard_dirname(shard_id)

    def files(self, shard_ids: Sequence[int] | None = None) -> dict[str, str]:
        """Path -> sha256 of the passage store and of ``shard_ids`` (default: every shard)."""
        files = dict(self.passage_files)
        for shard in self.shards:
            if shard_ids is None or shard.id in shard_ids:
                files.update(shard.files)
        return files

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def shard_dirname(shard_id: int) -> str:
    return f"shard_{shard_id:03d}"


def read_manifest(index_dir: str | Path) -> IndexManifest:
    """Parse ``index_dir/manifest.json`` alone; a missing or corrupt one is an error naming it."""
    path = Path(index_dir) / MANIFEST_FILE
    if not path.is_file():
        raise IndexMismatchError(f"{index_dir} is not a complete index: {MANIFEST_FILE} is missing (run build-index)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IndexMismatchError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}); {REBUILD}") from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        raise IndexMismatchError(f"{path}: format_version {version}, expected {FORMAT_VERSION}")
    try:
        return IndexManifest(**{**data, "shards": [ShardEntry(**s) for s in data["shards"]]})
    except (KeyError, TypeError) as exc:
        raise IndexMismatchError(f"{path}: not an index manifest ({exc}); {REBUILD}") from None


def load_index_manifest(
    index_dir: str | Path,
    encoder: EncoderSpec | None = None,
    *,
    verify: VerifyMode = "never",
    shard_ids: Sequence[int] | None = None,
) -> IndexManifest:
    """The manifest of ``index_dir``, once its files are known to be whole; every loader goes through here.

    With ``encoder``, an index built under another configuration is refused. The passage store and the
    files of ``shard_ids`` (default: every shard) are checked against the manifest: their sizes always (a
    stat each), their sha256 as ``verify`` says. Each shard checks what it reads; the default ``never``
    lets a driver check sizes early without reading everything that its shards will hash anyway.
    """
    manifest = read_manifest(index_dir)
    if encoder is not None:
        check_encoder(manifest, encoder, index_dir)
    for rel in manifest.files(shard_ids):
        check_size(Path(index_dir), manifest, rel)
    if verify == "always" or (verify == "auto" and index_bytes(index_dir, manifest) < AUTO_VERIFY_MAX_BYTES):
        verify_checksums(index_dir, manifest, shard_ids)
    return manifest


def check_encoder(manifest: IndexManifest, encoder: EncoderSpec, index_dir: str | Path) -> None:
    mismatches = encoder.index_mismatches(manifest.encoder)
    if mismatches:
        raise IndexMismatchError(
            f"index {index_dir} was built with another encoder configuration than retrieval.encoder: "
            f"{'; '.join(mismatches)}; {encoder_fix(manifest, encoder, index_dir)}"
        )


def encoder_fix(manifest: IndexManifest, encoder: EncoderSpec, index_dir: str | Path) -> str:
    """What makes an index and a configured encoder agree: configure the index's encoder, or rebuild the index."""
    recorded = both_sides(manifest.encoder)
    keys = f"retrieval.encoder.name={recorded.get('model')}"
    if encoder.asymmetric or recorded["passage_model"] != recorded.get("model"):
        keys += f" retrieval.encoder.passage_name={recorded['passage_model']}"
    corpus = manifest.build.get("corpus", {}).get("path", "CORPUS")
    passage = f" --passage-encoder {encoder.passage_model}" if encoder.asymmetric else ""
    return (
        f"set {keys} (and its settings), or rebuild the index for this encoder: bridge-ray build-index --corpus "
        f"{corpus} --out {index_dir} --encoder {encoder.model}{passage} --overwrite (with --config of this run)"
    )


def check_size(index_dir: Path, manifest: IndexManifest, rel: str) -> None:
    """Raise naming ``rel`` when it is missing or its size is not the manifest's (truncated, replaced)."""
    path = index_dir / rel
    if not path.is_file():
        raise IndexMismatchError(f"{path} is missing; {REBUILD}")
    actual, expected = path.stat().st_size, manifest.sizes.get(rel)
    if expected is None or actual == expected:
        return
    if rel == PASSAGES_FILE:
        with path.open("rb") as f:
            lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 22), b""))
        raise IndexMismatchError(
            f"{path} has {lines} lines ({actual} bytes), manifest says {manifest.num_passages} ({expected} bytes); "
            + REBUILD
        )
    raise IndexMismatchError(f"{path} is {actual} bytes, manifest says {expected}; {REBUILD}")


def index_bytes(index_dir: str | Path, manifest: IndexManifest) -> int:
    """The whole index's size on disk: what ``verify: auto`` decides by, the same for every shard."""
    paths = [Path(index_dir) / rel for rel in manifest.files()]
    return sum(p.stat().st_size for p in paths if p.is_file())


def verify_checksums(index_dir: str | Path, manifest: IndexManifest, shard_ids: Sequence[int] | None = None) -> None:
    """Recompute the checksums of the passage store and of ``shard_ids``; raise naming the first that differs."""
    for rel, expected in manifest.files(shard_ids).items():
        actual = file_digest(Path(index_dir) / rel)
        if actual != expected:
            raise IndexMismatchError(
                f"{Path(index_dir) / rel}: checksum {actual[:12]}… != manifest {expected[:12]}…; {REBUILD}"
            )


def write_json_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
