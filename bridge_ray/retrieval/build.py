"""Build a sharded FAISS index from a corpus, resumably.

Stages, each skipped when a previous run finished it: (1) stream the corpus into the passage store;
(2) encode each shard's rows into a pre-allocated ``embeddings.npy``, recording after every batch how
many rows are on disk (``progress.json``), so an interrupted build resumes at the next unwritten batch;
(3) build the hnsw / ivf index files; (4) checksum everything and write the manifest.

The output folder is owned: a complete index of the same corpus and configuration is reported up to date;
one of another corpus or configuration, or a folder holding anything else, is refused unless ``overwrite``.
The resumable state is keyed on the corpus (path, size, mtime) and the configuration, so an unfinished
build of another one (e.g. a run that failed on a corpus since fixed) is discarded with a note, never mixed
in and never in the way of the retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import faiss
import numpy as np
from tqdm import tqdm

from bridge_ray.cache_key import file_digest
from bridge_ray.errors import InputError, refuse_existing_output, refuse_taken_folder
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.retrieval.corpus import (
    OFFSETS_FILE,
    PASSAGES_FILE,
    Document,
    PassageStore,
    SkippedLines,
    read_corpus,
    write_passage_store,
)
from bridge_ray.retrieval.encoder import PassageEncoder
from bridge_ray.retrieval.manifest import (
    MANIFEST_FILE,
    IndexManifest,
    IndexMismatchError,
    ShardEntry,
    load_index_manifest,
    read_manifest,
    shard_dirname,
    write_json_atomic,
)
from bridge_ray.retrieval.shard import ADD_CHUNK, EMBEDDINGS_FILE, FAISS_FILE

if TYPE_CHECKING:
    from bridge_ray.config import IndexConfig, RetrievalConfig

IndexType = Literal["flat", "hnsw", "ivf"]
Embedder = Callable[[Sequence[Document]], np.ndarray]  # documents -> float32 [n, dim]

BUILD_STATE_FILE = "build_state.json"
INGEST_FILE = "ingest.json"
PROGRESS_FILE = "progress.json"
# What a build writes at the top of its folder (each also as ``.<name>.tmp`` while written), plus shard_NNN/.
INDEX_FILES = (MANIFEST_FILE, BUILD_STATE_FILE, INGEST_FILE, PASSAGES_FILE, OFFSETS_FILE)


def shard_ranges(num_passages: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal ``[start, stop)`` ranges covering ``0..num_passages-1``."""
    if num_shards > num_passages:
        raise InputError(
            f"{num_shards} shards for {num_passages} passages: every shard needs a passage "
            "(lower --shards / retrieval.index.num_shards)"
        )
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
    overwrite: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """Build (or resume building) the index of ``corpus`` in ``out_dir``; returns its manifest.

    ``encoder`` is the encoder's spec (``EncoderSpec.to_dict()``: a pair's query and passage models) recorded in
    the manifest;
    ``embed`` maps a batch of documents (id, ``contents`` verbatim) to their ``[n, dim]`` float32 embeddings;
    ``index_params`` are the build-time FAISS settings (hnsw: ``m``, ``ef_construction``; ivf: ``nlist``,
    null = 4·sqrt(n)). ``batch_size`` passages are embedded between two progress checkpoints. ``overwrite``
    replaces whatever index ``out_dir`` holds (other files there are kept).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")  # 0 would never advance
    corpus, out_dir = Path(corpus).resolve(), Path(out_dir)
    if not corpus.is_file():
        raise InputError(f"corpus {corpus} does not exist")
    build = {
        "corpus": file_identity(corpus),
        "encoder": encoder,
        "dim": dim,
        "num_shards": num_shards,
        "index_type": index_type,
        "index_params": index_params or {},
        "skip_bad_lines": skip_bad_lines,
    }
    created = not out_dir.exists()
    done = claim_index_dir(out_dir, build, overwrite)
    if done is not None:
        return done
    state_path = out_dir / BUILD_STATE_FILE
    if not state_path.is_file():
        write_json_atomic(state_path, json.dumps(build, indent=2))
    with discarded_on_failure(out_dir, created):  # nothing is encoded before the shards are laid out
        num_passages, skipped = _ingest(corpus, out_dir, skip_bad_lines)
        ranges = shard_ranges(num_passages, num_shards)
    store = PassageStore(out_dir)
    try:
        with tqdm(total=num_passages, unit="passage", desc="encoding", disable=not progress) as bar:
            for shard_id, (start, stop) in enumerate(ranges):
                _encode_shard(store, out_dir / shard_dirname(shard_id), start, stop, embed, dim, batch_size, bar)
    finally:
        store.close()
    shards = [finish_shard(out_dir, shard_id, start, stop, index_type, index_params or {})
              for shard_id, (start, stop) in enumerate(ranges)]
    manifest = write_manifest(out_dir, build, shards, num_passages, skipped)
    (out_dir / INGEST_FILE).unlink()
    return manifest


def file_identity(path: Path) -> dict:
    """What tells a file's versions apart, recorded in the build state: a changed input is another build."""
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@contextlib.contextmanager
def discarded_on_failure(out_dir: Path, created: bool) -> Iterator[None]:
    """Remove what the build wrote in ``out_dir`` (and the folder, if this build created it) on any failure."""
    try:
        yield
    except BaseException:
        remove_index(out_dir)
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise


def finish_shard(out_dir: Path, shard_id: int, start: int, stop: int, index_type: IndexType,
                 params: dict) -> ShardEntry:
    """Stage 3 for one shard: its hnsw / ivf file from its embeddings (unless a resumed build has it), checksums."""
    shard_dir = out_dir / shard_dirname(shard_id)
    if index_type != "flat" and not (shard_dir / FAISS_FILE).is_file():
        write_faiss_index(shard_dir, index_type, params)
    files = [EMBEDDINGS_FILE] + ([FAISS_FILE] if index_type != "flat" else [])
    rel = {f"{shard_dirname(shard_id)}/{name}": file_digest(shard_dir / name) for name in files}
    (shard_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return ShardEntry(id=shard_id, start=start, stop=stop, files=rel)


def write_manifest(out_dir: Path, build: dict, shards: list[ShardEntry], num_passages: int,
                   skipped: Sequence[tuple[int, str]] = ()) -> IndexManifest:
    """Stage 4: the manifest, written last and atomically (its presence marks a complete index)."""
    manifest = IndexManifest(
        encoder=build["encoder"],
        dim=build["dim"],
        num_passages=num_passages,
        build=build,
        shards=shards,
        passage_files={name: file_digest(out_dir / name) for name in (PASSAGES_FILE, OFFSETS_FILE)},
        skipped_lines=[list(x) for x in skipped],
    )
    manifest = dataclasses.replace(manifest, sizes={rel: (out_dir / rel).stat().st_size for rel in manifest.files()})
    write_json_atomic(out_dir / MANIFEST_FILE, manifest.to_json())
    (out_dir / BUILD_STATE_FILE).unlink()
    return manifest


# Per index type, the ``retrieval.index`` keys a build reads and the names the manifest's ``index_params`` gives them.
INDEX_PARAMS = {
    "flat": {},
    "hnsw": {"hnsw_m": "m", "hnsw_ef_construction": "ef_construction"},
    "ivf": {"ivf_nlist": "nlist"},
}


def configured_index_params(ix: IndexConfig) -> dict:
    """The build-time FAISS settings of ``retrieval.index`` for its ``index_type``."""
    return {param: getattr(ix, key) for key, param in INDEX_PARAMS[ix.index_type].items()}


def claim_index_dir(out_dir: Path, build: dict, overwrite: bool) -> IndexManifest | None:
    """Make ``out_dir`` this build's; returns the manifest when it already holds this very index.

    An unfinished build of this corpus and configuration is left to resume; anything else of ours is
    replaced only when it cannot be anyone's finished work or under ``overwrite``.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file, not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / MANIFEST_FILE).is_file() and not overwrite:
        diffs = _build_diffs(read_manifest(out_dir).build, build)
        if diffs:
            raise refuse_existing_output(
                str(out_dir),
                f"a complete index of another corpus or configuration ({diffs})",
                "choose another --out, or pass --overwrite to replace it",
            )
        manifest = load_index_manifest(out_dir, verify="auto")
        print(f"{out_dir} already holds this index (same corpus and configuration): up to date, nothing rebuilt")
        return manifest
    if (out_dir / MANIFEST_FILE).is_file():
        print(f"note: --overwrite: replacing the index in {out_dir}", file=sys.stderr)
        remove_index(out_dir)
    elif (out_dir / BUILD_STATE_FILE).is_file():
        diffs = _build_diffs(json.loads((out_dir / BUILD_STATE_FILE).read_text()), build)
        if diffs:
            print(
                f"note: discarding the unfinished build in {out_dir}, of another corpus or configuration ({diffs})",
                file=sys.stderr,
            )
            remove_index(out_dir)
    else:
        refuse_taken_folder(out_dir, overwrite, "an index", MANIFEST_FILE,
                            "choose an empty or new --out, or pass --overwrite to build the index among them")
    return None


def _build_diffs(recorded: dict, wanted: dict) -> str:
    """The settings (``corpus.size``, ``num_shards``, ...) where two builds differ, as ``key: old vs new``."""
    old, new = _flat(recorded), _flat(wanted)
    return "; ".join(f"{key}: {old.get(key)!r} vs {new[key]!r}" for key in new if old.get(key) != new[key])


def _flat(settings: dict) -> dict:
    """``{"corpus": {"size": 3}}`` -> ``{"corpus.size": 3}`` (one level: the build settings' nesting)."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def remove_index(out_dir: Path) -> None:
    """Delete what a build wrote in ``out_dir``, the manifest first (never a "complete" partial index)."""
    for name in INDEX_FILES:
        (out_dir / name).unlink(missing_ok=True)
        (out_dir / f".{name}.tmp").unlink(missing_ok=True)
    for shard_dir in out_dir.glob("shard_[0-9][0-9][0-9]"):
        shutil.rmtree(shard_dir)


def _ingest(corpus: Path, out_dir: Path, skip_bad_lines: bool) -> tuple[int, list[tuple[int, str]]]:
    """Stage 1: corpus -> passage store (redone whole if interrupted: it is I/O, not encoding).

    Returns the number of passages stored and the skipped lines.
    """
    ingest_path = out_dir / INGEST_FILE
    if ingest_path.is_file():
        ingest = json.loads(ingest_path.read_text())
        return ingest["passages"], [tuple(x) for x in ingest["skipped_lines"]]
    skipped = SkippedLines()
    count = write_passage_store(read_corpus(corpus, skip_bad_lines, skipped), out_dir)
    if count == 0:
        raise InputError(f"corpus {corpus} has no valid passages")
    if skipped.lines:
        print(skipped.summary(corpus))
    write_json_atomic(ingest_path, json.dumps({"passages": count, "skipped_lines": skipped.lines}))
    return count, skipped.lines


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
    documents = store.iter_documents(start + done, stop)
    while done < stop - start:
        batch = [next(documents) for _ in range(min(batch_size, stop - start - done))]
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


def write_faiss_index(shard_dir: Path, index_type: IndexType, params: dict) -> None:
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
    overwrite: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """:func:`build_index` with the passage encoder (a pair's passage model), shard count and index type of a
    ``retrieval`` config."""
    from transformers import AutoConfig  # not at import: the job driver imports this module, without transformers

    enc, ix = cfg.encoder, cfg.index
    spec = enc.spec()
    encoder = PassageEncoder(spec, device=device, dtype=enc.passage_dtype, batch_size=enc.passage_batch_size)
    query_dim = AutoConfig.from_pretrained(resolve_model_path(spec.model)).hidden_size if spec.asymmetric else None
    if query_dim not in (None, encoder.dim):
        raise InputError(f"the query encoder {spec.model} embeds into {query_dim} dimensions, the passage encoder "
                         f"{spec.passage_model} into {encoder.dim}: a pair must share one space "
                         "(retrieval.encoder.name, retrieval.encoder.passage_name)")
    return build_index(
        corpus,
        out_dir,
        encoder.embed_passages,
        encoder=spec.to_dict(),
        dim=encoder.dim,
        num_shards=ix.num_shards,
        index_type=ix.index_type,
        index_params=configured_index_params(ix),
        batch_size=chunk,
        skip_bad_lines=skip_bad_lines,
        overwrite=overwrite,
        progress=progress,
    )
