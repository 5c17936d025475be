"""Import an existing FAISS index (Search-R1's or FlashRAG's ``e5_Flat.index``) instead of re-encoding the corpus.

Their builders add the corpus rows to one FAISS index in order, so vector i is g(d) of corpus line i. Read
back chunk by chunk from the memory-mapped file, the vectors fill the shards' ``embeddings.npy`` (the g(d)
the retriever learner reads), and the configured flat / hnsw / ivf shard indexes are built from them as
``build-index`` builds them. Only an index that keeps the exact vectors can give them back: Flat (also inside
an IndexIDMap with ids 0..n-1), HNSW-Flat and IVF-Flat; PQ and SQ keep lossy codes and are refused.

The index's type, metric and dimension are checked before anything is written, its size against the corpus
once the passage store is written; a failure removes everything the import wrote.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np
from tqdm import tqdm
from transformers import AutoConfig

from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.errors import InputError
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.retrieval.build import (
    BUILD_STATE_FILE,
    IndexType,
    claim_index_dir,
    configured_index_params,
    discarded_on_failure,
    file_identity,
    finish_shard,
    shard_ranges,
    write_manifest,
)
from bridge_ray.retrieval.corpus import read_corpus, write_passage_store
from bridge_ray.retrieval.manifest import IndexManifest, shard_dirname, write_json_atomic
from bridge_ray.retrieval.shard import EMBEDDINGS_FILE

if TYPE_CHECKING:
    from bridge_ray.config import RetrievalConfig

COPY_CHUNK = 65536  # vectors read back at a time: ~200 MB at dim 768
NORM_TOLERANCE = 1e-2  # |‖g(d)‖ - 1| allowed of a normalising encoder's vectors (fp16-encoded indexes: ~1e-3)
SUPPORTED = "IndexFlatIP, IndexIDMap over it with ids 0..n-1, IndexHNSWFlat, IndexIVFFlat"
ENCODE_INSTEAD = "or encode the corpus here: build-index without --from-faiss"


@dataclasses.dataclass(frozen=True)
class FaissSource:
    """A memory-mapped FAISS index and the part of it that stores vector i exactly (which it owns: keep both)."""

    path: Path
    index: faiss.Index
    store: faiss.Index

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def vectors(self, start: int, stop: int) -> np.ndarray:
        """Vectors ``[start, stop)``, float32 ``[n, dim]``, copied out of the mapped file."""
        return self.store.reconstruct_n(start, stop - start)


def open_faiss_index(path: str | Path, dim: int, encoder_name: str) -> FaissSource:
    """Map ``path`` and check it can stand for ``encoder_name``'s g(d): type, metric and dimension."""
    path = Path(path).resolve()
    if not path.is_file():
        raise InputError(f"--from-faiss {path} does not exist")
    try:
        # IO_FLAG_MMAP maps only IVF lists; IO_FLAG_MMAP_IFC maps flat codes (Flat, HNSW storage) and IVF lists.
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
    except RuntimeError as exc:
        raise InputError(f"{path} is not a FAISS index ({str(exc).splitlines()[-1]})") from None
    source = FaissSource(path, index, _vector_store(index, path))
    _check_metric(index, path)
    if source.dim != dim:
        raise InputError(
            f"{path} holds vectors of dimension {source.dim}, encoder {encoder_name} has dimension {dim}: set "
            "retrieval.encoder (--encoder) to the encoder that built the index"
        )
    return source


def _type_name(index: faiss.Index) -> str:
    if isinstance(index, faiss.IndexIDMap):
        return f"{type(index).__name__}({type(faiss.downcast_index(index.index)).__name__})"
    return type(index).__name__


def _vector_store(index: faiss.Index, path: Path) -> faiss.Index:
    """The index inside ``index`` that gives vector i back exactly by ``reconstruct_n``; InputError if none does."""
    store = index
    if isinstance(index, faiss.IndexIDMap):  # IndexIDMap2 too
        if not np.array_equal(faiss.vector_to_array(index.id_map), np.arange(index.ntotal)):
            raise _not_sequential(path, index)
        store = faiss.downcast_index(index.index)
    elif type(index) is faiss.IndexHNSWFlat:
        store = faiss.downcast_index(index.storage)
    if isinstance(store, faiss.IndexFlat):
        return store
    if type(store) is faiss.IndexIVFFlat:
        _make_direct_map(store, path)
        return store
    raise InputError(
        f"{path}: {_type_name(index)} cannot be imported (supported: {SUPPORTED}): PQ and SQ indexes keep only "
        "compressed codes, from which the passage embeddings g(d) that the retriever learner needs cannot be "
        f"recovered. Rebuild it with --faiss_type Flat (Search-R1 / FlashRAG index_builder), {ENCODE_INSTEAD}"
    )


def _make_direct_map(ivf: faiss.IndexIVFFlat, path: Path) -> None:
    """Index the IVF lists by id, so ``reconstruct_n`` reads vector i directly; every id 0..n-1 must be there."""
    try:
        ivf.make_direct_map()  # refuses an id outside 0..ntotal-1
    except RuntimeError:
        raise _not_sequential(path, ivf) from None
    if (faiss.vector_to_array(ivf.direct_map.array) < 0).any():  # a duplicated id leaves another one out
        raise _not_sequential(path, ivf)


def _not_sequential(path: Path, index: faiss.Index) -> InputError:
    return InputError(
        f"{path}: {_type_name(index)} holds ids other than 0..{index.ntotal - 1} in order; vector i must be "
        f"corpus line i (build it with add(), not add_with_ids()), {ENCODE_INSTEAD}"
    )


def _check_metric(index: faiss.Index, path: Path) -> None:
    if index.metric_type == faiss.METRIC_INNER_PRODUCT:
        return
    what = "an L2 index" if index.metric_type == faiss.METRIC_L2 else f"an index of FAISS metric {index.metric_type}"
    raise InputError(
        f"{path} is {what} ({_type_name(index)}); the retriever scores by inner product, as Search-R1 "
        f"and FlashRAG build (faiss.METRIC_INNER_PRODUCT): rebuild it with that metric, {ENCODE_INSTEAD}"
    )


def encoder_dim(spec: EncoderSpec) -> int:
    """g(d)'s dimension for ``spec``: the passage model config's ``hidden_size``, read without loading the weights."""
    name = spec.passage_encoder
    try:
        return int(AutoConfig.from_pretrained(resolve_model_path(name)).hidden_size)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the config of encoder {name!r} for the index's dimension: {exc}") from None


def import_faiss_index(
    corpus: str | Path,
    faiss_path: str | Path,
    out_dir: str | Path,
    *,
    encoder: dict,
    dim: int,
    num_shards: int = 1,
    index_type: IndexType = "flat",
    index_params: dict | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """Split the FAISS index of ``corpus`` at ``faiss_path`` into the shard layout in ``out_dir``; its manifest.

    Arguments as :func:`~bridge_ray.retrieval.build.build_index`, whose output-folder rules apply: ``encoder``
    (the spec recorded, whose ``normalize`` the vectors are checked against) and ``dim`` describe the encoder
    that built the index.
    """
    corpus, out_dir = Path(corpus).resolve(), Path(out_dir)
    if not corpus.is_file():
        raise InputError(f"corpus {corpus} does not exist")
    source = open_faiss_index(faiss_path, dim, encoder["model"])
    build = {
        "corpus": file_identity(corpus),
        "from_faiss": {**file_identity(source.path), "type": _type_name(source.index)},
        "encoder": encoder,
        "dim": dim,
        "num_shards": num_shards,
        "index_type": index_type,
        "index_params": index_params or {},
        "skip_bad_lines": False,  # build_index's key: vector i is line i, so none can be
    }
    created = not out_dir.exists()
    done = claim_index_dir(out_dir, build, overwrite)
    if done is not None:
        return done
    with discarded_on_failure(out_dir, created):
        return _import(corpus, source, out_dir, build, progress)


def _import(corpus: Path, source: FaissSource, out_dir: Path, build: dict, progress: bool) -> IndexManifest:
    """Passage store, shard embeddings and indexes, manifest last (its presence marks a complete index)."""
    write_json_atomic(out_dir / BUILD_STATE_FILE, json.dumps(build, indent=2))
    count = write_passage_store(read_corpus(corpus), out_dir)
    if count != source.ntotal:
        raise InputError(
            f"{source.path} holds {source.ntotal} vectors, corpus {corpus} has {count} rows: import the index "
            "with the corpus it was built from (vector i = line i)"
        )
    ranges, unit_norm = shard_ranges(count, build["num_shards"]), bool(build["encoder"].get("normalize"))
    with tqdm(total=count, unit="vector", desc="importing", disable=not progress) as bar:
        for shard_id, (start, stop) in enumerate(ranges):
            _copy_shard(source, out_dir / shard_dirname(shard_id), start, stop, unit_norm, bar)
    shards = [
        finish_shard(out_dir, shard_id, start, stop, build["index_type"], build["index_params"])
        for shard_id, (start, stop) in enumerate(ranges)
    ]
    return write_manifest(out_dir, build, shards, count)


def _copy_shard(source: FaissSource, shard_dir: Path, start: int, stop: int, unit_norm: bool, bar: tqdm) -> None:
    """Write vectors ``[start, stop)`` into the shard's ``embeddings.npy``, one chunk in memory at a time."""
    shard_dir.mkdir(exist_ok=True)
    emb = np.lib.format.open_memmap(
        shard_dir / EMBEDDINGS_FILE, mode="w+", dtype=np.float32, shape=(stop - start, source.dim)
    )
    for lo in range(start, stop, COPY_CHUNK):
        vectors = source.vectors(lo, min(lo + COPY_CHUNK, stop))
        if unit_norm:
            _check_unit_norm(vectors, source.path, lo)
        emb[lo - start : lo - start + len(vectors)] = vectors
        bar.update(len(vectors))
    emb.flush()
    del emb


def _check_unit_norm(vectors: np.ndarray, path: Path, first_row: int) -> None:
    """A normalising encoder gives unit vectors: others mean the index was built by another encoder (e.g. DPR)."""
    norms = np.linalg.norm(vectors, axis=1)
    off = np.flatnonzero(np.abs(norms - 1) > NORM_TOLERANCE)
    if off.size:
        raise InputError(
            f"{path}: vector {first_row + off[0]} has norm {norms[off[0]]:.4f}, but retrieval.encoder normalises "
            "embeddings: the index was built by another encoder configuration; set retrieval.encoder to that one"
        )


def import_configured_index(
    cfg: RetrievalConfig,
    corpus: str | Path,
    faiss_path: str | Path,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> IndexManifest:
    """:func:`import_faiss_index` with the encoder, shard count and index type of a ``retrieval`` config."""
    spec, ix = cfg.encoder.spec(), cfg.index
    return import_faiss_index(
        corpus,
        faiss_path,
        out_dir,
        encoder=spec.to_dict(),
        dim=encoder_dim(spec),
        num_shards=ix.num_shards,
        index_type=ix.index_type,
        index_params=configured_index_params(ix),
        overwrite=overwrite,
        progress=progress,
    )
