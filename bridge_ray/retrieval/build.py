"""Build a sharded FAISS index from a corpus, resumably.

Stages, each skipped when a previous run finished it: (1) stream the corpus into the passage store;
(2) encode each shard's rows into a pre-allocated ``embeddings.npy``, recording after every batch how
many rows are on disk (``progress.json``), so an interrupted build resumes at the next unwritten batch;
(3) build the hnsw / ivf index files; (4) checksum everything and write the manifest. A directory holding
an unfinished build of another configuration is refused rather than mixed.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import faiss
import numpy as np
from tqdm import tqdm

from bridge_ray.retrieval.corpus import (
    OFFSETS_FILE,
    PASSAGES_FILE,
    PassageStore,
    SkippedLines,
    read_corpus,
    write_passage_store,
)
from bridge_ray.retrieval.manifest import (
    MANIFEST_FILE,
    IndexManifest,
    IndexMismatchError,
    ShardEntry,
    load_manifest,
    sha256_file,
    shard_dirname,
    write_json_atomic,
)
from bridge_ray.retrieval.types import Passage

if TYPE_CHECKING:
    from bridge_ray.config import RetrievalConfig

IndexType = Literal["flat", "hnsw", "ivf"]
Embedder = Callable[[Sequence[Passage]], np.ndarray]  # passages -> float32 [n, dim]

BUILD_STATE_FILE = "build_state.json"
INGEST_FILE = "ingest.json"
PROGRESS_FILE = "progress.json"
EMBEDDINGS_FILE = "embeddings.npy"
FAISS_FILE = "index.faiss"
ADD_CHUNK = 65536  # vectors handed to faiss per add() call


def shard_ranges(num_passages: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal ``[start, stop)`` ranges covering ``0..num_passages-1``."""
    if num_shards > num_passages:
        raise ValueError(f"{num_shards} shards for {num_passages} passages: every shard needs a passage")
    bounds = [num_passages * s // num_shards for s in range(num_shards + 1)]
    return list(itertools.pairwise(bounds))


def build_index(
    corpus: str | Path,
    out_dir: str | Path,
    embed: Embedder,
    *,
    encoder: dict,
    dim: int,
    num_shards: int = 1,
    index_type: IndexType = "flat",
    index_params: dict | None = None,
    batch_size: int = 256,
    skip_bad_lines: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """Build (or resume building) the index of ``corpus`` in ``out_dir``; returns its manifest.

    ``encoder`` is the passage encoder's spec (``EncoderSpec.to_dict()``) recorded in the manifest;
    ``embed`` maps a batch of passages to their ``[n, dim]`` float32 embeddings; ``index_params`` are the
    build-time FAISS settings (hnsw: ``m``, ``ef_construction``; ivf: ``nlist``, null = 4·sqrt(n)).
    ``batch_size`` passages are embedded between two progress checkpoints.
    """
    corpus, out_dir = Path(corpus).resolve(), Path(out_dir)
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus {corpus} does not exist")
    stat = corpus.stat()
    build = {
        "corpus": {"path": str(corpus), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns},
        "encoder": encoder,
        "dim": dim,
        "num_shards": num_shards,
        "index_type": index_type,
        "index_params": index_params or {},
        "skip_bad_lines": skip_bad_lines,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / MANIFEST_FILE).is_file():
        manifest = load_manifest(out_dir)
        _require_same_build(out_dir, manifest.build, build, "a complete index")
        return manifest
    state_path = out_dir / BUILD_STATE_FILE
    if state_path.is_file():
        _require_same_build(out_dir, json.loads(state_path.read_text()), build, "an unfinished build")
    else:
        write_json_atomic(state_path, json.dumps(build, indent=2))

    skipped = _ingest(corpus, out_dir, skip_bad_lines)
    store = PassageStore(out_dir)
    try:
        ranges = shard_ranges(len(store), num_shards)
        with tqdm(total=len(store), unit="passage", desc="encoding", disable=not progress) as bar:
            for shard_id, (start, stop) in enumerate(ranges):
                _encode_shard(store, out_dir / shard_dirname(shard_id), start, stop, embed, dim, batch_size, bar)
    finally:
        store.close()
    shards = []
    for shard_id, (start, stop) in enumerate(ranges):
        shard_dir = out_dir / shard_dirname(shard_id)
        if index_type != "flat" and not (shard_dir / FAISS_FILE).is_file():
            _write_faiss_index(shard_dir, index_type, index_params or {})
        files = [EMBEDDINGS_FILE] + ([FAISS_FILE] if index_type != "flat" else [])
        rel = {f"{shard_dirname(shard_id)}/{name}": sha256_file(shard_dir / name) for name in files}
        shards.append(ShardEntry(id=shard_id, start=start, stop=stop, files=rel))
        (shard_dir / PROGRESS_FILE).unlink(missing_ok=True)
    manifest = IndexManifest(
        encoder=encoder,
        dim=dim,
        num_passages=len(store),
        build=build,
        shards=shards,
        passage_files={name: sha256_file(out_dir / name) for name in (PASSAGES_FILE, OFFSETS_FILE)},
        skipped_lines=[list(x) for x in skipped],
    )
    write_json_atomic(out_dir / MANIFEST_FILE, manifest.to_json())
    state_path.unlink()
    (out_dir / INGEST_FILE).unlink()
    return manifest


def _require_same_build(out_dir: Path, recorded: dict, wanted: dict, what: str) -> None:
    diffs = [f"{key}: {recorded.get(key)!r} vs {wanted[key]!r}" for key in wanted if recorded.get(key) != wanted[key]]
    if diffs:
        raise IndexMismatchError(
            f"{out_dir} holds {what} of another configuration ({'; '.join(diffs)}); remove it or choose another --out"
        )


def _ingest(corpus: Path, out_dir: Path, skip_bad_lines: bool) -> list[tuple[int, str]]:
    """Stage 1: corpus -> passage store (redone whole if interrupted: it is I/O, not encoding)."""
    ingest_path = out_dir / INGEST_FILE
    if ingest_path.is_file():
        return [tuple(x) for x in json.loads(ingest_path.read_text())["skipped_lines"]]
    skipped = SkippedLines()
    count = write_passage_store(read_corpus(corpus, skip_bad_lines, skipped), out_dir)
    if count == 0:
        raise ValueError(f"corpus {corpus} has no valid passages")
    if skipped.lines:
        print(skipped.summary(corpus))
    write_json_atomic(ingest_path, json.dumps({"passages": count, "skipped_lines": skipped.lines}))
    return skipped.lines


def _encode_shard(
    store: PassageStore, shard_dir: Path, start: int, stop: int, embed: Embedder, dim: int, batch_size: int, bar
) -> None:
    """Stage 2 for one shard: fill ``embeddings.npy`` from the first row not yet recorded as written."""
    shard_dir.mkdir(exist_ok=True)
    emb_path, progress_path = shard_dir / EMBEDDINGS_FILE, shard_dir / PROGRESS_FILE
    if emb_path.is_file() and not progress_path.is_file():  # finished earlier
        bar.update(stop - start)
        return
    done = json.loads(progress_path.read_text())["rows"] if progress_path.is_file() else 0
    if done == 0:
        np.lib.format.open_memmap(emb_path, mode="w+", dtype=np.float32, shape=(stop - start, dim)).flush()
        write_json_atomic(progress_path, json.dumps({"rows": 0}))
    emb = np.lib.format.open_memmap(emb_path, mode="r+")
    if emb.shape != (stop - start, dim):
        raise IndexMismatchError(f"{emb_path}: shape {emb.shape} != expected {(stop - start, dim)}")
    bar.update(done)
    passages = store.iter_passages(start + done, stop)
    while done < stop - start:
        batch = [next(passages) for _ in range(min(batch_size, stop - start - done))]
        vectors = np.asarray(embed(batch), dtype=np.float32)
        if vectors.shape != (len(batch), dim):
            raise ValueError(f"embedder returned shape {vectors.shape} for {len(batch)} passages of dim {dim}")
        emb[done : done + len(batch)] = vectors
        emb.flush()
        done += len(batch)
        write_json_atomic(progress_path, json.dumps({"rows": done}))
        bar.update(len(batch))
    del emb
    progress_path.unlink()


def _write_faiss_index(shard_dir: Path, index_type: IndexType, params: dict) -> None:
    """Stage 3: train (ivf) and fill an approximate index over the shard's embeddings."""
    emb = np.load(shard_dir / EMBEDDINGS_FILE, mmap_mode="r")
    n, dim = emb.shape
    if index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params.get("m", 32), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.get("ef_construction", 200)
    else:
        nlist = min(n, params.get("nlist") or max(1, int(4 * math.sqrt(n))))
        index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 256 * nlist), replace=False)
        index.train(np.ascontiguousarray(emb[np.sort(sample)]))
    for lo in range(0, n, ADD_CHUNK):
        index.add(np.ascontiguousarray(emb[lo : lo + ADD_CHUNK]))
    tmp = shard_dir / f".{FAISS_FILE}.tmp"
    faiss.write_index(index, str(tmp))
    tmp.replace(shard_dir / FAISS_FILE)


def build_configured_index(
    cfg: RetrievalConfig,
    corpus: str | Path,
    out_dir: str | Path,
    *,
    device: str = "auto",
    chunk: int = 2048,
    skip_bad_lines: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """:func:`build_index` with the passage encoder, shard count and index type of a ``retrieval`` config."""
    from bridge_ray.retrieval.encoder import PassageEncoder

    enc, ix = cfg.encoder, cfg.index
    spec = enc.spec()
    encoder = PassageEncoder(spec, device=device, dtype=enc.passage_dtype, batch_size=enc.passage_batch_size)
    params = {
        "flat": {},
        "hnsw": {"m": ix.hnsw_m, "ef_construction": ix.hnsw_ef_construction},
        "ivf": {"nlist": ix.ivf_nlist},
    }[ix.index_type]
    return build_index(
        corpus,
        out_dir,
        encoder.embed_passages,
        encoder=spec.to_dict(),
        dim=encoder.dim,
        num_shards=ix.num_shards,
        index_type=ix.index_type,
        index_params=params,
        batch_size=chunk,
        skip_bad_lines=skip_bad_lines,
        progress=progress,
    )
