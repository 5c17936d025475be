"""The Search-R1-compatible HTTP API, exercised with real HTTP requests against uvicorn."""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from serving import served

from bridge_ray.config import ConfigError, load_config
from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.server import QueryBatcher, ServerLimits, create_app

pytestmark = pytest.mark.slow

LIMITS = ServerLimits(default_topk=3, max_topk=20, max_query_chars=200, max_request_bytes=2**20, batch_window_ms=20,
                      batch_size=256)
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


def expected_ids(client: RetrieverClient, queries: list[str], k: int) -> list[list[int]]:
    """Per query, the ids of an in-process search (each distinct query searched once)."""
    unique = sorted(set(queries))
    hits, _ = client.search(unique, k)
    return [hits.ids[unique.index(q)].tolist() for q in queries]


def expected_scores(client: RetrieverClient, queries: list[str], k: int) -> list[list[float]]:
    unique = sorted(set(queries))
    hits, _ = client.search(unique, k)
    return [hits.scores[unique.index(q)].tolist() for q in queries]


def batching(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=60).json()["batching"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client(world_index, minilm_spec):
    return RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index)


@pytest.fixture(scope="module")
def url(client):
    with served(create_app(client, LIMITS)) as base_url:
        yield base_url


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
    for default in ({"topk": None}, {"topk": 0}, {}):  # Search-R1's `if not request.topk`: the default topk
        plain = httpx.post(f"{url}/retrieve", json={"queries": questions[:1], **default}, timeout=60).json()
        assert plain["result"][0] == client.rows(hits.ids[0][:3].tolist())  # the documents alone, no scores


def test_search_r1_retrieval_request_payload(url, client):
    """What Search-R1's ``search_r1/search/retrieval_request.py`` sends: 400 queries in one call."""
    payload = {"queries": ["What is the capital of France?", "Explain neural networks."] * 200, "topk": 5,
               "return_scores": True}
    response = httpx.post(f"{url}/retrieve", json=payload, timeout=300)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert len(result) == 400
    assert [[int(d["document"]["id"]) for d in q] for q in result] == expected_ids(client, payload["queries"], 5)
    assert [[d["score"] for d in q] for q in result] == [
        pytest.approx(s, abs=1e-5) for s in expected_scores(client, payload["queries"], 5)]


def test_search_r1_generation_payload(url, client, questions):
    """What Search-R1's ``LLMGenerationManager._batch_search`` sends (batch x n_agent queries, its topk 3, scores),
    read as its ``_passages2string`` reads it."""
    queries = questions * 5  # 60 questions, n_agent 5
    response = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}, timeout=300)
    assert response.status_code == 200, response.text
    ids = expected_ids(client, queries, 3)
    for q, docs in enumerate(response.json()["result"]):
        assert [d["document"] for d in docs] == client.rows(ids[q])
        for doc_item in docs:
            title, *text = doc_item["document"]["contents"].split("\n")
            assert title.startswith('"') and text


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"queries": ["x" * 201]}, 413, "max_query_chars"),
        ({"queries": ["q"], "topk": 21}, 422, "max_topk"),
        ({"queries": ["q"], "topk": -1}, 422, "max_topk"),
        ({"queries": []}, 422, "at least one query"),
        ({"queries": "not a list"}, 422, "queries"),
    ],
)
def test_limits_answer_4xx_with_a_message(url, body, status, message):
    response = httpx.post(f"{url}/retrieve", json=body)
    assert response.status_code == status
    assert message in response.text


def test_a_2000_query_request_is_answered_in_chunks(url, client, questions):
    queries = [questions[i % len(questions)] for i in range(2000)]
    before = batching(url)
    response = httpx.post(f"{url}/retrieve", json={"queries": queries}, timeout=600)
    after = batching(url)
    assert response.status_code == 200, response.text
    assert [[int(d["id"]) for d in q] for q in response.json()["result"]] == expected_ids(client, queries, 3)
    assert after["queries"] - before["queries"] == 2000
    assert after["batches"] - before["batches"] == 8  # ceil(2000 / batch_size 256)
    assert after["chunked_requests"] - before["chunked_requests"] == 1
    assert after["largest_batch"] == LIMITS.batch_size


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_max_request_bytes_is_413_naming_the_key(url, chunked):
    body = json.dumps({"queries": ["x" * 150] * 7000}).encode()  # every query is valid; the body is not
    assert len(body) > LIMITS.max_request_bytes
    content = iter([body[i : i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    response = httpx.post(f"{url}/retrieve", content=content, headers={"content-type": "application/json"},
                          timeout=60)
    assert response.status_code == 413
    detail = response.json()["detail"]
    assert "retrieval.server.max_request_bytes" in detail and str(LIMITS.max_request_bytes) in detail
    assert (str(len(body)) in detail) != chunked  # a declared length is named
    assert httpx.post(f"{url}/retrieve", json={"queries": ["q"]}, timeout=60).status_code == 200


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


def run_batcher(client: RetrieverClient, limits: ServerLimits, requests: list[list[str]], k: int, later: int = 0):
    """Submit ``requests`` in order, the last ``later`` of them once the first batch is being searched; return the
    batcher, the answers (or exceptions) and, per request, how many batches had started when it resumed."""
    done_at = {}

    async def one(i: int, batcher: QueryBatcher):
        if i >= len(requests) - later:
            while batcher.stats.batches == 0:
                await asyncio.sleep(0.001)
        try:
            return await batcher.submit(requests[i], k)
        finally:
            done_at[i] = batcher.stats.batches

    async def submit_all(batcher: QueryBatcher):
        batcher.start()
        try:
            return await asyncio.gather(*(one(i, batcher) for i in range(len(requests))), return_exceptions=True)
        finally:
            await batcher.stop()

    batcher = QueryBatcher(client, limits)
    return batcher, asyncio.run(submit_all(batcher)), done_at


def test_a_large_request_is_cut_and_requests_sent_meanwhile_wait_for_one_batch_of_it(client, questions):
    large = [questions[i % len(questions)] for i in range(300)]
    small = [questions[i : i + 2] for i in range(0, 8, 2)]
    limits = ServerLimits(batch_size=64, batch_window_ms=20)
    batcher, answers, done_at = run_batcher(client, limits, [large, *small], 4, later=len(small))
    # batch 1: large[:64]; 2: the small ones, merged, and large[64:120]; 3 to 5: the rest of large. A request
    # resumes after the batcher has started the next batch, so those answered by batch 2 see 3.
    assert done_at == {0: 5, 1: 3, 2: 3, 3: 3, 4: 3}
    assert vars(batcher.stats) == {"requests": 5, "queries": 308, "batches": 5, "largest_batch": 64,
                                   "chunked_requests": 1}
    for queries, answer in zip([large, *small], answers, strict=True):  # cutting changes no answer or order
        assert [[int(doc["id"]) for doc, _ in q] for q in answer] == expected_ids(client, queries, 4)


def test_a_large_request_that_fails_in_its_second_batch_fails_alone_and_stops(client, questions):
    large = [questions[i % len(questions)] for i in range(200)]
    large[100] = LONE_SURROGATE  # in the large request's second batch, merged with the small ones
    small = [questions[i : i + 2] for i in range(0, 8, 2)]
    batcher, answers, _ = run_batcher(client, ServerLimits(batch_size=64, batch_window_ms=20), [large, *small], 4)
    assert isinstance(answers[0], Exception)
    assert batcher.stats.batches == 2  # what was left of the large request was not searched
    for queries, answer in zip(small, answers[1:], strict=True):
        assert [[int(doc["id"]) for doc, _ in q] for q in answer] == expected_ids(client, queries, 4)


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
                           "retrieval.server.max_topk=10", "retrieval.server.batch_size=2")
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
        assert batching(f"http://127.0.0.1:{port}") == {"requests": 1, "queries": 3, "batches": 2, "largest_batch": 2,
                                                        "chunked_requests": 1}  # batch_size reached the server
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


def test_a_config_that_sets_a_removed_server_key_names_its_replacement(tmp_path, capsys):
    """A config written before requests were chunked (a run's saved config.yaml too) says what to set instead: a
    removed key is an error, a renamed one loads into its new name with a note naming its line."""
    old = tmp_path / "old.yaml"
    old.write_text("retrieval:\n  server:\n    max_queries_per_request: 256\n    max_batch_queries: 1024\n")
    with pytest.raises(ConfigError) as raised:
        load_config(old)
    message = str(raised.value)
    assert "max_queries_per_request was removed" in message and "retrieval.server.max_request_bytes" in message
    assert f"[{old}:3]" in message and "max_batch_queries" not in message
    old.write_text("retrieval:\n  server:\n    max_batch_queries: 1024\n")
    assert load_config(old).retrieval.server.batch_size == 1024
    assert f"{old}:3: retrieval.server.max_batch_queries is now retrieval.server.batch_size" in capsys.readouterr().err
