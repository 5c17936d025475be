"""Search-R1-compatible HTTP retrieval: ``POST /retrieve``, the API Search-R1's
``retrieval_server.py`` serves (docs/from-search-r1-flashrag.md).

A request may hold any number of queries (Search-R1's trainer sends batch size x n_agent in one call): what is
bounded is the body, ``max_request_bytes``. A batcher answers every request in encoder passes and shard fan-outs
of at most ``batch_size`` queries: requests that arrive together (or within ``batch_window_ms``) share one pass,
and a large one is cut into several. The search runs in a worker thread, so the event loop keeps accepting
requests meanwhile. Every request is validated on its own before it joins a batch, so one bad request cannot
fail the others merged with it.
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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.corpus import passage_from_row

Ranking = list[tuple[dict, float]]  # one query's (corpus row, score) pairs, best first


class RetrieveRequest(BaseModel):
    """Search-R1's request; strict, so ``topk: "3"`` or ``true`` and misspelt fields are 422s, not guesses."""

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


@dataclass(frozen=True)
class ServerLimits:
    """``retrieval.server`` less ``host`` and ``port``."""

    default_topk: int = 3
    max_topk: int = 100
    max_query_chars: int = 4096
    max_request_bytes: int = 64 * 2**20
    batch_window_ms: float = 2.0
    batch_size: int = 1024


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    batches: int = 0
    largest_batch: int = 0
    chunked_requests: int = 0  # answered over more than one batch


@dataclass
class _Pending:
    """A request's queries; ``taken`` of them are handed to batches so far, ``answers`` holds theirs in order."""

    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)
    answers: list[Ranking] = field(default_factory=list, repr=False)
    taken: int = 0


@dataclass(frozen=True)
class _Slice:
    """``request.queries[start:stop]``: a request's share of one batch."""

    request: _Pending
    start: int
    stop: int

    @property
    def queries(self) -> list[str]:
        return self.request.queries[self.start : self.stop]


class QueryBatcher:
    """Answers requests in ``client.search`` calls of at most ``batch_size`` queries, one at a time, off the loop."""

    def __init__(self, client: RetrieverClient, limits: ServerLimits):
        self.client, self.limits, self.stats = client, limits, BatchStats()
        self._pending: deque[_Pending] = deque()
        self._cut: _Pending | None = None  # cut at the end of the last batch; rejoins the queue at the next
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def submit(self, queries: list[str], topk: int) -> list[Ranking]:
        """Per query, its ``topk`` (corpus row, score) pairs, best first."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(queries, topk, future))
        self.stats.requests += 1
        self.stats.queries += len(queries)
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            if self.limits.batch_window_ms > 0:  # let requests sent together arrive before the first batch
                await asyncio.sleep(self.limits.batch_window_ms / 1000)
            while self._pending or self._cut is not None:  # what arrives during a batch joins the next one
                batch = self._take()
                if batch:
                    self._count(batch)
                    await self._answer(batch)
            self._wakeup.clear()

    def _take(self) -> list[_Slice]:
        """The next batch: requests first come, first served, the last one cut at ``batch_size``.

        A cut request rejoins the queue behind the requests that arrived while its slice was searched, so they
        wait for that batch, not for all of it.
        """
        if self._cut is not None:
            self._pending.append(self._cut)
            self._cut = None
        batch, room = [], self.limits.batch_size
        while self._pending and room:
            request = self._pending.popleft()
            if request.future.done():  # failed in an earlier batch, or cancelled
                continue
            stop = min(request.taken + room, len(request.queries))
            batch.append(_Slice(request, request.taken, stop))
            room -= stop - request.taken
            request.taken = stop
            if stop < len(request.queries):
                self._cut = request
        return batch

    def _count(self, batch: list[_Slice]) -> None:
        size = sum(s.stop - s.start for s in batch)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, size)
        self.stats.chunked_requests += sum(s.start == 0 and s.stop < len(s.request.queries) for s in batch)

    async def _answer(self, batch: list[_Slice]) -> None:
        queries = [q for s in batch for q in s.queries]
        try:
            answers = await asyncio.to_thread(self._search, queries, max(s.request.topk for s in batch))
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0].request.future, exception=exc)
                return
            for s in batch:  # retry one by one: a request the search cannot take fails only itself
                await self._answer([s])
            return
        offset = 0
        for s in batch:
            request, size = s.request, s.stop - s.start
            request.answers += [hits[: request.topk] for hits in answers[offset : offset + size]]
            offset += size
            if len(request.answers) == len(request.queries):
                _settle(request.future, result=request.answers)

    def _search(self, queries: list[str], k: int) -> list[Ranking]:
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


def search_r1_response(answers: list[Ranking], return_scores: bool) -> bytes:
    """Search-R1's body: ``{"result": [per query, best first]}``, each hit the document, or with ``return_scores``
    ``{"document", "score"}``; bytes as FastAPI's ``JSONResponse`` writes them, so the caller can build them off
    the event loop (thousands of queries take long enough to stall every other request)."""
    if return_scores:
        result = [[{"document": search_r1_document(doc), "score": score} for doc, score in hits] for hits in answers]
    else:
        result = [[search_r1_document(doc) for doc, _ in hits] for hits in answers]
    return json.dumps({"result": result}, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


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
    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> Response:
        check_request(request, limits)
        answers = await batcher.submit(request.queries, request.topk or limits.default_topk)  # 0 too, as Search-R1
        body = await asyncio.to_thread(search_r1_response, answers, request.return_scores)
        return Response(body, media_type="application/json")

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


class BodyLimit:
    """413 naming ``retrieval.server.max_request_bytes`` for a body over ``max_bytes``, before it is parsed.

    The body is read here and handed on whole: a chunked upload declares no length, so counting is the only check.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((int(v) for k, v in scope["headers"] if k == b"content-length" and v.isdigit()), 0)
        if declared > self.max_bytes:
            await self._too_large(f"{declared} bytes")(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size, more = size + len(chunks[-1]), message.get("more_body", False)
            if size > self.max_bytes:
                await self._too_large("sent chunked")(scope, receive, send)
                return
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    def _too_large(self, size: str) -> Response:
        return _json_error(
            413,
            f"the request body ({size}) is over the limit of {self.max_bytes} bytes "
            "(retrieval.server.max_request_bytes)",
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that gives ``body`` first, then what the client sends next (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


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
    for i, query in enumerate(request.queries):
        check_query(i, query, limits)
    if request.topk is not None and not 0 <= request.topk <= limits.max_topk:
        raise HTTPException(
            422,
            f"topk must be between 1 and {limits.max_topk} (retrieval.server.max_topk), "
            f"or 0 or null for {limits.default_topk} (retrieval.server.default_topk)",
        )


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
