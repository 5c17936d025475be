"""One shard of a built index, loaded from disk: FAISS search, document embeddings and passage rows.

Plain Python so that unit tests and the local retriever use it in-process; the shard-holder role
(``bridge_ray.shard_holder``) runs the same class as a Ray actor, whose restart re-runs this constructor and so
reloads the shard.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import faiss
import numpy as np

from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.retrieval.corpus import OFFSETS_FILE, PassageStore
from bridge_ray.retrieval.manifest import REBUILD, IndexMismatchError, VerifyMode, load_index_manifest
from bridge_ray.retrieval.merge import PAD_ID, Hits, top_k
from bridge_ray.retrieval.types import Passage

T = TypeVar("T")

# A shard's folder, as build_index writes it and a shard holder reads it (here, so that a shard holder imports no
# encoder, and with it no torch), and the vectors handed to faiss per add() call.
EMBEDDINGS_FILE = "embeddings.npy"
FAISS_FILE = "index.faiss"
ADD_CHUNK = 65536


def _read(path: Path, load: Callable[[Path], T]) -> T:
    """``load(path)``; a file that does not parse (damaged although its size is right) is an error naming it."""
    try:
        return load(path)
    except (ValueError, RuntimeError) as exc:  # numpy and faiss's errors for a malformed file
        raise IndexMismatchError(f"{path}: unreadable ({exc}); {REBUILD}") from None


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class IndexShard:
    """Rows ``[start, stop)`` of the index in ``index_dir``.

    ``encoder``: the configured encoder; an index built under another configuration is refused.
    ``use_gpu``: move the FAISS index to the (first visible) GPU; None picks it when faiss-gpu sees one.
    HNSW stays on the CPU (faiss-gpu has no HNSW).
    ``verify`` (``retrieval.index.verify``): whether to check the sha256 of the files this shard reads (the
    passage store and its own shard) before it serves; their sizes are always checked.
    """

    def __init__(
        self,
        index_dir: str | Path,
        shard_id: int,
        encoder: EncoderSpec | None = None,
        *,
        use_gpu: bool | None = None,
        hnsw_ef_search: int = 128,
        ivf_nprobe: int = 32,
        verify: VerifyMode = "auto",
    ):
        self.index_dir = Path(index_dir)
        manifest = load_index_manifest(self.index_dir, encoder, verify=verify, shard_ids=[shard_id])
        if not 0 <= shard_id < len(manifest.shards):
            raise ValueError(f"{index_dir} has {len(manifest.shards)} shards, no shard {shard_id}")
        entry = manifest.shards[shard_id]
        self.shard_id, self.start, self.stop, self.dim = shard_id, entry.start, entry.stop, manifest.dim
        self.index_type, self.encoder = manifest.index_type, manifest.encoder
        shard_dir = manifest.shard_dir(self.index_dir, shard_id)
        self.embeddings = _read(shard_dir / EMBEDDINGS_FILE, lambda path: np.load(path, mmap_mode="r"))
        if self.embeddings.shape != (entry.size, self.dim):
            raise IndexMismatchError(
                f"{shard_dir / EMBEDDINGS_FILE}: shape {self.embeddings.shape} != manifest {(entry.size, self.dim)}"
            )
        if self.index_type == "flat":
            self.index = faiss.IndexFlatIP(self.dim)
            for lo in range(0, entry.size, ADD_CHUNK):
                self.index.add(np.ascontiguousarray(self.embeddings[lo : lo + ADD_CHUNK]))
        else:
            self.index = _read(shard_dir / FAISS_FILE, lambda path: faiss.read_index(str(path)))
            if self.index_type == "hnsw":
                self.index.hnsw.efSearch = hnsw_ef_search
            else:
                self.index.nprobe = ivf_nprobe
        if self.index.ntotal != entry.size:
            raise IndexMismatchError(
                f"{shard_dir}: FAISS index holds {self.index.ntotal} vectors, manifest {entry.size}"
            )
        if use_gpu and not gpu_available():
            raise RuntimeError(f"shard {shard_id}: GPU search requested but faiss-gpu sees no GPU")
        self.on_gpu = bool(use_gpu if use_gpu is not None else gpu_available()) and self.index_type != "hnsw"
        if self.on_gpu:
            self._gpu_resources = faiss.StandardGpuResources()
            self.index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self.index)
        self.store = _read(self.index_dir / OFFSETS_FILE, lambda _: PassageStore(self.index_dir))

    @property
    def size(self) -> int:
        return self.stop - self.start

    def info(self) -> dict:
        """What the client routes and checks by, plus where the shard lives (host, process)."""
        return {
            "shard_id": self.shard_id,
            "start": self.start,
            "stop": self.stop,
            "dim": self.dim,
            "index_type": self.index_type,
            "encoder": self.encoder,
            "on_gpu": self.on_gpu,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def search(self, queries: np.ndarray, k: int) -> Hits:
        """The shard's top ``k`` per query in canonical order (score desc, id asc), global ids.

        For the exact (flat) index, the search widens until every document tied with the k-th score is
        among the returned candidates, so which tied ids make the cut never depends on FAISS internals.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"shard {self.shard_id}: queries must be [B, {self.dim}], got {queries.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        exact = self.index_type == "flat"
        probe = min(2 * k if exact else k, self.size)
        while True:
            scores, local = self.index.search(queries, probe)
            if not exact or probe == self.size or np.all(scores[:, min(k, probe) - 1] > scores[:, -1]):
                break
            probe = min(2 * probe, self.size)
        ids = np.where(local >= 0, local + self.start, PAD_ID)
        return Hits(*top_k(scores, ids, k))

    def _local(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        outside = ids[(ids < self.start) | (ids >= self.stop)]
        if outside.size:
            raise IndexError(f"shard {self.shard_id} holds ids [{self.start}, {self.stop}), not {outside[:5].tolist()}")
        return ids - self.start

    def doc_embeddings(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """g(d) of the given global ids, float32 ``[n, D]`` (the index's stored embeddings)."""
        return np.asarray(self.embeddings[self._local(ids)], dtype=np.float32)

    def rows(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        """The corpus rows of the given global ids, as the corpus file has them."""
        self._local(ids)
        return self.store.rows(ids)

    def passages(self, ids: Sequence[int] | np.ndarray) -> list[Passage]:
        self._local(ids)
        return self.store.passages(ids)
