"""The Search-R1-compatible HTTP API, exercised with real HTTP requests against uvicorn."""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.server import ServerLimits, create_app

pytestmark = pytest.mark.slow

LIMITS = ServerLimits(default_topk=3, max_topk=20, max_queries_per_request=8, max_query_chars=200, batch_window_ms=20)


@pytest.fixture(scope="module")
def client(world_index, minilm_spec):
    return RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index)


@pytest.fixture(scope="module")
def url(client):
    server = uvicorn.Server(uvicorn.Config(create_app(client, LIMITS), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def questions(small_world):
    return [q["question"] for q in load_split(small_world, "train")]


def test_search_r1_request_and_response_format(url, client, questions):
    body = httpx.post(f"{url}/retrieve", json={"queries": questions[:2], "topk": 5, "return_scores": True},
                      timeout=60).json()
    hits, _ = client.search(questions[:2], 5)
    assert len(body["result"]) == 2
    for i, docs in enumerate(body["result"]):
        assert [int(d["document"]["id"]) for d in docs] == hits.ids[i].tolist()
        assert [d["score"] for d in docs] == pytest.approx(hits.scores[i].tolist(), abs=1e-6)
        assert docs[0]["document"] == client.rows([hits.ids[i][0]])[0]  # the corpus row as stored
        assert set(docs[0]["document"]) == {"id", "contents"}
    plain = httpx.post(f"{url}/retrieve", json={"queries": questions[:1], "topk": None}, timeout=60).json()
    assert [d["id"] for d in plain["result"][0]] == [str(i) for i in hits.ids[0][:3].tolist()]  # default topk 3


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"queries": ["q"] * 9}, 413, "max_queries_per_request"),
        ({"queries": ["x" * 201]}, 413, "max_query_chars"),
        ({"queries": ["q"], "topk": 21}, 422, "max_topk"),
        ({"queries": ["q"], "topk": 0}, 422, "max_topk"),
        ({"queries": []}, 422, "at least one query"),
        ({"queries": "not a list"}, 422, "queries"),
    ],
)
def test_limits_answer_4xx_with_a_message(url, body, status, message):
    response = httpx.post(f"{url}/retrieve", json=body)
    assert response.status_code == status
    assert message in response.text


def test_malformed_json_is_a_4xx(url):
    response = httpx.post(f"{url}/retrieve", content=b"{oops", headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_concurrent_requests_are_batched_not_serialised(url, questions):
    requests = [{"queries": questions[i : i + 2], "topk": 4, "return_scores": True} for i in range(0, 24, 2)]
    before = httpx.get(f"{url}/health").json()["batching"]

    async def fire():
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(http.post(f"{url}/retrieve", json=r) for r in requests))

    together = [r.json() for r in asyncio.run(fire())]
    after = httpx.get(f"{url}/health").json()["batching"]
    assert after["requests"] - before["requests"] == len(requests)
    assert after["batches"] - before["batches"] < len(requests) / 2  # many requests shared one search
    assert after["largest_batch"] > 2
    alone = [httpx.post(f"{url}/retrieve", json=r, timeout=60).json() for r in requests[:3]]
    for a, b in zip(together[:3], alone, strict=True):  # batching does not change any answer
        assert [[d["document"]["id"] for d in q] for q in a["result"]] == [
            [d["document"]["id"] for d in q] for q in b["result"]]


def test_serve_retriever_command_with_adapter(tmp_path, world_index, minilm_spec, questions):
    adapter = QueryEncoder(minilm_spec)
    with torch.no_grad():
        for p in adapter.trainable_parameters():
            p.normal_(0, 0.05)
    adapter.save_adapter(tmp_path / "adapter")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "bridge_ray", "serve-retriever", "--index", str(world_index),
           "--adapter", str(tmp_path / "adapter"), "--port", str(port), "retrieval.server.max_topk=10"]
    repo = Path(__file__).resolve().parents[2]  # this checkout's bridge_ray, not an installed one
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=repo,
                            env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "serve-retriever did not come up"
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=60).json()
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert health["passages"] == 148 and health["shards"] == 2
        served = httpx.post(f"http://127.0.0.1:{port}/retrieve", timeout=60,
                            json={"queries": questions[:3], "topk": 10, "return_scores": True}).json()
        too_many = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["q"], "topk": 11}, timeout=60)
        assert too_many.status_code == 422 and "max_topk" in too_many.text
    finally:
        proc.terminate()
        proc.wait(30)
    hits, _ = RetrieverClient.from_index(adapter, world_index).search(questions[:3], 10)
    for i, docs in enumerate(served["result"]):  # the adapter, not the frozen encoder, ranked these
        assert [int(d["document"]["id"]) for d in docs] == hits.ids[i].tolist()
        assert [d["score"] for d in docs] == pytest.approx(hits.scores[i].tolist(), abs=1e-5)
