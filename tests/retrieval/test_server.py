"""The Search-R1-compatible HTTP API, exercised with real HTTP requests against uvicorn."""

import asyncio
import json
import os
import shutil
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
from bridge_ray.retrieval.server import QueryBatcher, ServerLimits, create_app

pytestmark = pytest.mark.slow

LIMITS = ServerLimits(default_topk=3, max_topk=20, max_queries_per_request=8, max_query_chars=200, batch_window_ms=20)
REPO = Path(__file__).resolve().parents[2]  # this checkout's bridge_ray, not an installed one
LONE_SURROGATE = "\ud800"  # valid JSON ("\\ud800"), but no text: the tokenizer raises on it


def post_raw(url: str, body: dict, **kwargs) -> httpx.Response:
    """POST ``body`` as ASCII-escaped JSON, so lone surrogates reach the server as JSON sends them."""
    return httpx.post(f"{url}/retrieve", content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=60, **kwargs)


def serve_retriever(*args: str) -> subprocess.Popen:
    """The real command in a subprocess, stdout and stderr apart."""
    return subprocess.Popen([sys.executable, "-m", "bridge_ray", "serve-retriever", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queries": ["q"], "topk": "3"}, "topk"),
        ({"queries": ["q"], "topk": True}, "topk"),
        ({"queries": ["q"], "topk": 3.0}, "topk"),
        ({"queries": ["q"], "return_scores": "yes"}, "return_scores"),
        ({"queries": [1]}, "queries"),
        ({"queries": ["q"], "top_k": 3}, "top_k"),
        ({"queries": ["q"], "note": LONE_SURROGATE}, "note"),  # echoed in the 422 without becoming a 500
    ],
)
def test_loose_types_and_unknown_fields_are_422_naming_the_field(url, body, field):
    response = post_raw(url, body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["body", field]


def test_a_body_not_sent_as_json_is_415_naming_the_header(url):
    """What ``curl -d`` sends without ``-H 'Content-Type: application/json'``."""
    response = httpx.post(f"{url}/retrieve", content=json.dumps({"queries": ["q"]}),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 415
    assert "Content-Type: application/json" in response.json()["detail"]


def test_a_lone_surrogate_fails_only_its_own_request(url, questions):
    valid = [{"queries": questions[i : i + 2], "topk": 4} for i in range(0, 32, 2)]
    poisoned = {"queries": ["q", "q", "q", f"who{LONE_SURROGATE}"], "topk": 4}

    async def fire():
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(
                http.post(f"{url}/retrieve", content=json.dumps(r), headers={"content-type": "application/json"})
                for r in [*valid[:8], poisoned, *valid[8:]]))

    responses = list(asyncio.run(fire()))
    bad = responses.pop(8)
    assert bad.status_code == 422
    assert bad.json()["detail"] == "queries[3]: not valid UTF-8 (lone surrogate at character 3)"
    assert [r.status_code for r in responses] == [200] * 16
    assert all(len(r.json()["result"]) == 2 for r in responses)


def test_the_batcher_fails_only_the_request_the_encoder_rejects(client, questions):
    """Past validation, a query the encoder raises on still fails its own request alone, not its batch."""
    requests = [questions[i : i + 2] for i in range(0, 32, 2)]
    requests.insert(5, ["q", LONE_SURROGATE])

    async def submit_all(batcher: QueryBatcher):
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(r, 4) for r in requests), return_exceptions=True)
        finally:
            await batcher.stop()

    batcher = QueryBatcher(client, LIMITS)
    answers = asyncio.run(submit_all(batcher))
    assert batcher.stats.batches == 1  # all of them were merged, the bad one included
    assert isinstance(answers.pop(5), Exception)
    requests.pop(5)
    for queries, answer in zip(requests, answers, strict=True):
        hits, _ = client.search(queries, 4)
        assert [[int(doc["id"]) for doc, _ in q] for q in answer] == hits.ids.tolist()


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
    port = free_port()
    proc = serve_retriever("--index", str(world_index), "--adapter", str(tmp_path / "adapter"), "--port", str(port),
                           "retrieval.server.max_topk=10")
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.communicate()
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
        _, err = proc.communicate(timeout=30)
    assert "warning" not in err  # loopback: nothing to warn about
    hits, _ = RetrieverClient.from_index(adapter, world_index).search(questions[:3], 10)
    for i, docs in enumerate(served["result"]):  # the adapter, not the frozen encoder, ranked these
        assert [int(d["document"]["id"]) for d in docs] == hits.ids[i].tolist()
        assert [d["score"] for d in docs] == pytest.approx(hits.scores[i].tolist(), abs=1e-5)


def test_a_host_beyond_loopback_warns_that_the_server_has_no_authentication(world_index):
    proc = serve_retriever("--index", str(world_index), "--host", "0.0.0.0", "--port", "0")
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving 148 passages"), proc.communicate()
        port = int(line.rsplit(":", 1)[1].split("/")[0])  # --port 0: the line names the port the OS chose
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=60)
        assert health.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert "--host 0.0.0.0" in warning and "no authentication" in warning and "network" in warning


def test_a_port_in_use_is_an_error_before_anything_claims_to_serve(world_index):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve_retriever("--index", str(world_index), "--port", str(port))
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert out == ""
    assert err.strip() == (
        f"error: port {port} on 127.0.0.1 is in use; stop what holds it or pass another --port "
        "(retrieval.server.port)"
    )


@pytest.mark.parametrize(
    ("case", "culprit"),
    [("missing", "manifest.json is missing"), ("corrupt", "manifest.json"), ("other-encoder", "retrieval.encoder")],
)
def test_a_bad_index_is_an_error_before_anything_claims_to_serve(tmp_path, world_index, case, culprit):
    index, overrides = world_index, []
    if case == "missing":
        index = tmp_path / "empty"
        index.mkdir()
    elif case == "corrupt":
        index = tmp_path / "corrupt"
        index.mkdir()
        (index / "manifest.json").write_text("{oops")
    else:
        overrides = ["retrieval.encoder.pooling=cls"]
    proc = serve_retriever("--index", str(index), "--port", str(free_port()), *overrides)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err
    assert "serving" not in out and "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert message.startswith("error: ") and culprit in message and str(index) in message


def test_verify_flag_checks_every_checksum_before_serving(tmp_path, world_index):
    """``--verify`` is ``retrieval.index.verify=always``: it wins over ``never`` and catches a same-size edit."""
    index = shutil.copytree(world_index, tmp_path / "index")
    embeddings = index / "shard_001" / "embeddings.npy"
    data = bytearray(embeddings.read_bytes())
    data[-1] ^= 0xFF  # one float of the last passage: the size and the format stay right
    embeddings.write_bytes(bytes(data))
    proc = serve_retriever("--index", str(index), "--port", str(free_port()), "--verify",
                           "retrieval.index.verify=never")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err
    assert "serving" not in out and "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"error: {embeddings}: checksum")
