"""Search-R1-compatible HTTP retrieval: ``POST /retrieve`` (FACTS.md "Retrieval HTTP API").

Concurrent requests do not queue behind one another: a batcher gathers the queries of every request
that arrives while the previous batch is being searched (or within ``batch_window_ms``) and answers them
with one encoder pass and one shard fan-out. The search runs in a worker thread, so the event loop keeps
accepting requests meanwhile. Every request is validated on its own before it joins a batch, so one bad
request cannot fail the others merged with it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.corpus import passage_from_row


class RetrieveRequest(BaseModel):
    """Search-R1's request; strict, so ``topk: "3"`` or ``true`` and misspelt fields are 422s, not guesses."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


@dataclass(frozen=True)
class ServerLimits:
    default_topk: int = 3
    max_topk: int = 100
    max_queries_per_request: int = 256
    max_query_chars: int = 4096
    batch_window_ms: float = 2.0
    max_batch_queries: int = 1024


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    batches: int = 0
    largest_batch: int = 0


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)


class QueryBatcher:
    """Merges concurrent requests into batched ``client.search`` calls, run one at a time off the event loop."""

    def __init__(self, client: RetrieverClient, limits: ServerLimits):
        self.client, self.limits, self.stats = client, limits, BatchStats()
        self._pending: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[tuple[dict, float]]]:
        """Per query, its ``topk`` (corpus row, score) pairs, best first."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(queries, topk, future))
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            if self.limits.batch_window_ms > 0:
                await asyncio.sleep(self.limits.batch_window_ms / 1000)
            batch, size = [], 0
            while self._pending and (
                not batch or size + len(self._pending[0].queries) <= self.limits.max_batch_queries
            ):
                batch.append(self._pending.popleft())
                size += len(batch[-1].queries)
            if not self._pending:
                self._wakeup.clear()
            self.stats.requests += len(batch)
            self.stats.queries += size
            self.stats.batches += 1
            self.stats.largest_batch = max(self.stats.largest_batch, size)
            await self._answer(batch)

    async def _answer(self, batch: list[_Pending]) -> None:
        queries = [q for p in batch for q in p.queries]
        try:
            answers = await asyncio.to_thread(self._search, queries, max(p.topk for p in batch))
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0].future, exception=exc)
                return
            for p in batch:  # retry one by one: a request the search cannot take fails only itself
                await self._answer([p])
            return
        offset = 0
        for p in batch:
            mine = answers[offset : offset + len(p.queries)]
            offset += len(p.queries)
            _settle(p.future, result=[hits[: p.topk] for hits in mine])

    def _search(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        hits, _ = self.client.search(queries, k)
        rows = [hits.row(i) for i in range(len(queries))]
        unique = sorted({d for ids, _ in rows for d in ids})
        documents = dict(zip(unique, self.client.rows(unique), strict=True))
        return [[(documents[d], s) for d, s in zip(ids, scores, strict=True)] for ids, scores in rows]


def _settle(future: asyncio.Future, result: object = None, exception: Exception | None = None) -> None:
    """Resolve ``future`` unless its request is gone (client disconnected): that must not stop the batcher."""
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


def search_r1_document(row: dict) -> dict:
    """The corpus row, with ``contents`` (``"title"\\ntext``) added for ``{id, title, text}`` corpora."""
    if "contents" in row:
        return row
    passage = passage_from_row(row)
    return {**row, "contents": f'"{passage.title}"\n{passage.text}'}


def create_app(client: RetrieverClient, limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    batcher = QueryBatcher(client, limits)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="bridge-ray retriever", lifespan=lifespan)
    app.state.batcher = batcher
    app.add_exception_handler(RequestValidationError, validation_error)

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest):
        check_request(request, limits)
        topk = request.topk if request.topk is not None else limits.default_topk
        answers = await batcher.submit(request.queries, topk)
        if request.return_scores:
            result = [
                [{"document": search_r1_document(doc), "score": score} for doc, score in hits] for hits in answers
            ]
        else:
            result = [[search_r1_document(doc) for doc, _ in hits] for hits in answers]
        return {"result": result}

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "passages": client.num_passages,
            "shards": len(client.shards),
            "retriever_version": client.version,
            "batching": vars(batcher.stats),
        }

    return app


async def validation_error(_: Request, exc: RequestValidationError) -> Response:
    """FastAPI's 422, but ASCII-escaped: an echoed lone surrogate would otherwise make the error itself a 500.

    A body that was not parsed as JSON (curl ``-d`` without ``Content-Type: application/json``) is a 415.
    """
    if isinstance(exc.body, bytes):
        return _json_error(415, "send the body as JSON with the header Content-Type: application/json")
    return _json_error(422, jsonable_encoder(exc.errors()))


def _json_error(status: int, detail: object) -> Response:
    return Response(json.dumps({"detail": detail}), status_code=status, media_type="application/json")


def check_request(request: RetrieveRequest, limits: ServerLimits) -> None:
    """4xx with a message naming the field and limit for requests the server will not answer.

    Runs per request before batching: a query the encoder cannot take must fail only its own request.
    """
    if not request.queries:
        raise HTTPException(422, "queries must hold at least one query")
    if len(request.queries) > limits.max_queries_per_request:
        raise HTTPException(
            413,
            f"{len(request.queries)} queries in one request; the limit is {limits.max_queries_per_request} "
            "(retrieval.server.max_queries_per_request)",
        )
    for i, query in enumerate(request.queries):
        check_query(i, query, limits)
    if request.topk is not None and not 1 <= request.topk <= limits.max_topk:
        raise HTTPException(422, f"topk must be between 1 and {limits.max_topk} (retrieval.server.max_topk)")


def check_query(i: int, query: str, limits: ServerLimits) -> None:
    if len(query) > limits.max_query_chars:
        raise HTTPException(
            413,
            f"queries[{i}] has {len(query)} characters; the limit is {limits.max_query_chars} "
            "(retrieval.server.max_query_chars)",
        )
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON "\ud800" is valid JSON but no text; the tokenizer raises on it
        raise HTTPException(422, f"queries[{i}]: not valid UTF-8 (lone surrogate at character {exc.start})") from None
