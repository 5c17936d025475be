"""The retriever the agent loop calls: query encoder with the current LoRA -> all shards in parallel -> exact merge.

Shards are in-process :class:`IndexShard` objects (:class:`LocalShards`) or the actors of the shard-holder role,
called through that role's handle (:class:`bridge_ray.shard_holder.handle.ShardHolders`, whose every wait is
bounded); the client calls the same :class:`IndexShard` methods, passed as themselves, on either
(:class:`ShardCalls`), so tests can run it without Ray and the training graph with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.manifest import IndexMismatchError, load_index_manifest
from bridge_ray.retrieval.merge import PAD_ID, Hits, merge_hits, top_k
from bridge_ray.retrieval.shard import IndexShard
from bridge_ray.retrieval.types import Passage, RetrievalResult

T = TypeVar("T")


class ShardCalls(Protocol):
    """How a :class:`ShardSet` reaches its shards: :class:`LocalShards` in this process, or the shard holders'
    handle (:class:`bridge_ray.shard_holder.handle.ShardHolders`) on Ray actors."""

    def __len__(self) -> int: ...

    def fan_out(self, method: Callable[..., T], args: Mapping[int, tuple]) -> list[T]:
        """``method(*args[i])`` (an :class:`IndexShard` method) on shard ``i`` for every key, all at once; the
        results in the keys' order."""
        ...

    def shared(self, value: Any) -> Any:
        """``value`` as an argument of every shard's call (for actors one copy in the object store)."""
        ...

    def close(self) -> None: ...


class LocalShards:
    """In-process shards, called from a thread pool (FAISS releases the GIL)."""

    def __init__(self, shards: Sequence[IndexShard]) -> None:
        if not all(isinstance(s, IndexShard) for s in shards):
            raise TypeError("in-process shards must be IndexShard objects; the shard-holder actors are reached "
                            "through their handle (bridge_ray.shard_holder.handle.ShardHolders)")
        self.shards = list(shards)
        self._pool = ThreadPoolExecutor(max(len(shards), 1), thread_name_prefix="shard")

    def __len__(self) -> int:
        return len(self.shards)

    def fan_out(self, method: Callable[..., T], args: Mapping[int, tuple]) -> list[T]:
        return list(self._pool.map(lambda item: method(self.shards[item[0]], *item[1]), args.items()))

    def shared(self, value: Any) -> Any:
        return value

    def close(self) -> None:
        self._pool.shutdown()


class ShardSet:
    r"""The shards of one index, called in parallel: exact top-k over all of them, and lookups by global id.

    ``shards``: in-process :class:`IndexShard`\ s, or any :class:`ShardCalls` (the shard holders' handle, whose
    every wait is bounded by ``run.call_timeout_s`` and names the method and the shards).
    """

    def __init__(self, shards: Sequence[IndexShard] | ShardCalls):
        self.calls: ShardCalls = LocalShards(shards) if isinstance(shards, Sequence) else shards
        if not len(self.calls):
            raise ValueError("a retriever needs at least one shard")
        infos = self.calls.fan_out(IndexShard.info, {i: () for i in range(len(self.calls))})
        order = np.argsort([info["start"] for info in infos])
        self._order, self.infos = [int(i) for i in order], [infos[i] for i in order]  # shards in corpus order
        self._starts = np.array([info["start"] for info in self.infos], dtype=np.int64)
        stops = [info["stop"] for info in self.infos]
        if self._starts[0] != 0 or any(self._starts[1:] != stops[:-1]):
            ranges = list(zip(self._starts.tolist(), stops, strict=True))
            raise ValueError(f"shards do not tile the corpus: ranges {ranges}")
        self.num_passages, self.dim = stops[-1], self.infos[0]["dim"]

    @classmethod
    def local(cls, index_dir: str | Path, encoder: EncoderSpec | None = None, **shard_options) -> ShardSet:
        """Every shard of ``index_dir`` in this process (no Ray): tests, the local server, small corpora.

        ``shard_options``: keyword arguments of :class:`IndexShard` (``use_gpu``, ``hnsw_ef_search``, ...).
        """
        manifest = load_index_manifest(index_dir, encoder)
        return cls([IndexShard(index_dir, s.id, encoder, **shard_options) for s in manifest.shards])

    def __len__(self) -> int:
        return len(self.calls)

    def search(self, vectors: np.ndarray, k: int) -> Hits:
        """The exact top ``k`` over all shards for every query vector (one fan-out, then a merge)."""
        vectors = self.calls.shared(vectors)
        return merge_hits(self.calls.fan_out(IndexShard.search, {i: (vectors, k) for i in self._order}), k)

    def routed(self, method: Callable[..., list], ids: Sequence[int] | np.ndarray) -> list:
        """``method`` on the shards owning ``ids``, results concatenated back in the order of ``ids``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.num_passages)]
        if bad.size:
            raise IndexError(f"document ids {bad[:5].tolist()} outside the corpus [0, {self.num_passages})")
        owner = np.searchsorted(self._starts, ids, side="right") - 1
        used = np.unique(owner).tolist()
        parts = self.calls.fan_out(method, {self._order[s]: (ids[owner == s],) for s in used})
        out: list = [None] * len(ids)
        for s, part in zip(used, parts, strict=True):
            for pos, item in zip(np.flatnonzero(owner == s), part, strict=True):
                out[pos] = item
        return out

    def doc_embeddings(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """g(d) of ``ids`` (any shape) as float32 ``[*ids.shape, D]``, from the shards' stored embeddings."""
        shape = tuple(np.shape(ids))
        rows = self.routed(IndexShard.doc_embeddings, ids)
        flat = np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)
        return torch.from_numpy(flat.reshape(*shape, self.dim))

    def close(self) -> None:
        self.calls.close()


class RetrieverClient:
    """Implements :class:`~bridge_ray.retrieval.types.Retriever`: query encoder with the current LoRA + shards.

    ``retrieve`` returns, per query, the ``num_candidates`` (k) training candidates with their scores
    ``s_eta(q, d) = f_eta(q)ᵀ g(d)`` and the first ``num_shown`` (m) as passages. The retriever learner reads
    the candidates' g(d) from the shards once per round (:meth:`doc_embeddings`), not with every search.
    """

    def __init__(
        self,
        encoder: QueryEncoder,
        shards: ShardSet | Sequence[IndexShard] | ShardCalls,
        *,
        num_candidates: int = 40,
        num_shown: int = 3,
        version: int = 0,
        candidates: str = "adapted",
    ):
        if not 1 <= num_shown <= num_candidates:
            raise ValueError(f"need 1 <= num_shown ({num_shown}) <= num_candidates ({num_candidates})")
        if candidates not in ("adapted", "base"):
            raise ValueError(f"candidates must be adapted or base, not {candidates!r}")
        self.encoder, self.num_candidates, self.num_shown = encoder, num_candidates, num_shown
        self.candidates = candidates
        self.version = version
        self.shards = shards if isinstance(shards, ShardSet) else ShardSet(shards)
        self.num_passages = self.shards.num_passages
        self._lock = threading.Lock()  # encoder forward vs. set_adapter
        for info in self.shards.infos:
            mismatches = encoder.spec.index_mismatches(info["encoder"])
            if mismatches or info["dim"] != encoder.dim:
                raise IndexMismatchError(
                    f"shard {info['shard_id']} was built with another encoder configuration: "
                    + "; ".join(mismatches or [f"dim {info['dim']} != query encoder dim {encoder.dim}"])
                )

    @classmethod
    def from_index(cls, encoder: QueryEncoder, index_dir: str | Path, **kwargs) -> RetrieverClient:
        """A client over in-process shards of ``index_dir``."""
        return cls(encoder, ShardSet.local(index_dir, encoder.spec), **kwargs)

    def embed(self, queries: Sequence[str]) -> tuple[np.ndarray, int]:
        """Query embeddings under the current adapter, with that adapter's version."""
        with self._lock:
            return self.encoder.embed_queries(list(queries)), self.version

    def search(self, queries: Sequence[str], k: int) -> tuple[Hits, int]:
        """The top ``k`` for every query, scored ``f_eta(q)ᵀ g(d)``, and the adapter version that scored them:
        the exact top k of the adapted query over all shards, or (``candidates="base"``) the frozen encoder's
        top k re-ranked by the adapted query."""
        vectors, version = self.embed(queries)
        if self.candidates == "adapted":
            return self.shards.search(vectors, k), version
        with self._lock:  # the adapter is switched off for this forward: set_adapter must wait
            base = self.encoder.embed_queries(list(queries), adapted=False)
        found = self.shards.search(base, k)
        valid = found.ids != PAD_ID
        embeddings = self.doc_embeddings(np.where(valid, found.ids, 0)).numpy()  # [B, k, D]
        scores = np.where(valid, np.einsum("bd,bkd->bk", vectors, embeddings), -np.inf).astype(np.float32)
        return Hits(*top_k(scores, found.ids, k)), version

    def retrieve(self, queries: list[str]) -> list[RetrievalResult]:
        """One call per agent turn, carrying all of that turn's queries."""
        if not queries:
            return []
        hits, version = self.search(queries, self.num_candidates)
        rows = [hits.row(i) for i in range(len(queries))]
        shown_ids = sorted({d for ids, _ in rows for d in ids[: self.num_shown]})
        shown = dict(zip(shown_ids, self.passages(shown_ids), strict=True))
        return [
            RetrievalResult(query, ids, scores, [shown[d] for d in ids[: self.num_shown]], version)
            for query, (ids, scores) in zip(queries, rows, strict=True)
        ]

    def set_adapter(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load new LoRA factors into the running query encoder; later results carry ``version``."""
        with self._lock:
            self.encoder.load_adapter_state_dict(state_dict)
            self.version = version

    def doc_embeddings(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        return self.shards.doc_embeddings(ids)

    def passages(self, ids: Sequence[int] | np.ndarray) -> list[Passage]:
        return self.shards.routed(IndexShard.passages, ids)

    def rows(self, ids: Sequence[int] | np.ndarray) -> list[dict]:
        return self.shards.routed(IndexShard.rows, ids)

    def close(self) -> None:
        self.shards.close()
