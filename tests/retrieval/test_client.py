"""RetrieverClient over the small world indexed with the real MiniLM: exact merge, k / m, scores, adapters."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from bridge_ray.config.encoders import PRESETS
from bridge_ray.data.world import load_split
from bridge_ray.retrieval.build import build_index
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.corpus import document_from_row, read_corpus
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.manifest import IndexMismatchError, load_index_manifest, verify_checksums

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder(minilm_spec):
    return QueryEncoder(minilm_spec)


@pytest.fixture(scope="module")
def all_embeddings(world_index):
    manifest = load_index_manifest(world_index)
    return np.concatenate([np.load(manifest.shard_dir(world_index, s.id) / "embeddings.npy") for s in manifest.shards])


@pytest.fixture(scope="module")
def questions(small_world):
    return [q["question"] for q in load_split(small_world, "test")]


def test_cli_built_index_holds_the_real_encoders_embeddings(world_index, small_world, passage_encoder, minilm_spec):
    manifest = load_index_manifest(world_index, minilm_spec)
    corpus = [document_from_row(json.loads(r.raw)) for r in read_corpus(small_world / "corpus.jsonl")]
    assert manifest.num_passages == len(corpus) and len(manifest.shards) == 2 and manifest.dim == 384
    assert manifest.encoder == minilm_spec.to_dict() and manifest.index_type == "flat"
    verify_checksums(world_index, manifest)
    stored = np.concatenate([np.load(world_index / f"shard_00{s}/embeddings.npy") for s in range(2)])
    np.testing.assert_allclose(stored[:20], passage_encoder.embed_passages(corpus[:20]), atol=1e-5)


def test_two_shards_give_exactly_the_single_index_top_k(tmp_path, world_index, small_world, minilm_spec, encoder,
                                                        all_embeddings, questions):
    single_dir = tmp_path / "single"
    build_index(small_world / "corpus.jsonl", single_dir, lambda ps: all_embeddings[[int(p.id) for p in ps]],
                encoder=minilm_spec.to_dict(), dim=384, num_shards=1, progress=False)
    sharded = RetrieverClient.from_index(encoder, world_index, num_candidates=40)
    single = RetrieverClient.from_index(encoder, single_dir, num_candidates=40)
    for a, b in zip(sharded.retrieve(questions), single.retrieve(questions), strict=True):
        assert a.doc_ids == b.doc_ids and a.scores == b.scores and a.shown == b.shown
    scores = encoder.embed_queries(questions) @ all_embeddings.T
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :40]
    hits, _ = sharded.search(questions, 40)
    assert (hits.ids == expected).mean() > 0.99  # brute force agrees up to float near-ties


def test_retrieve_returns_k_candidates_m_shown_and_learner_scores(world_index, small_world, encoder, questions):
    client = RetrieverClient.from_index(encoder, world_index, num_candidates=40, num_shown=3)
    results = client.retrieve(questions[:5])
    rows = {int(r["id"]): r for r in map(json.loads, (small_world / "corpus.jsonl").read_text().splitlines())}
    for r, q in zip(results, questions[:5], strict=True):
        assert r.query == q and len(r.doc_ids) == len(r.scores) == 40 and len(r.shown) == 3
        assert r.scores == sorted(r.scores, reverse=True) and r.retriever_version == 0
        assert [p.id for p in r.shown] == [str(d) for d in r.doc_ids[:3]]
        assert r.shown[0].title == rows[r.doc_ids[0]]["contents"].split("\n")[0].strip('"')
        g = client.doc_embeddings(r.doc_ids)
        # The learner's s_eta: f_eta(q) with grad, against the logged g(d): equals the logged scores.
        learner = encoder.encode_queries([q]) @ g.T
        torch.testing.assert_close(learner.detach()[0], torch.tensor(r.scores), atol=1e-5, rtol=0)
    assert client.doc_embeddings(np.array([[0, 1], [2, 3]])).shape == (2, 2, 384)
    assert client.rows([0])[0] == rows[0] and client.retrieve([]) == []
    with pytest.raises(IndexError, match="outside the corpus"):
        client.doc_embeddings([client.num_passages])


def test_set_adapter_updates_the_running_client(world_index, minilm_spec, questions):
    client = RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index, num_candidates=10)
    before = client.retrieve(questions[:4])
    learner = QueryEncoder(minilm_spec)
    with torch.no_grad():
        for p in learner.trainable_parameters():
            p.normal_(0, 0.05)
    client.set_adapter(learner.adapter_state_dict(), version=7)
    after = client.retrieve(questions[:4])
    assert all(r.retriever_version == 7 for r in after)
    assert [r.scores for r in after] != [r.scores for r in before]
    for r in after:
        expected = learner.encode_queries([r.query]).detach() @ client.doc_embeddings(r.doc_ids).T
        torch.testing.assert_close(expected[0], torch.tensor(r.scores), atol=1e-5, rtol=0)


def test_base_candidates_keep_the_frozen_top_k_ranked_by_the_adapted_query(world_index, minilm_spec, questions):
    """candidates=base: a drifted adapter re-ranks the frozen encoder's k candidates and can never lose one."""
    frozen = RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index, num_candidates=8)
    drifted = QueryEncoder(minilm_spec)
    with torch.no_grad():
        for p in drifted.trainable_parameters():
            p.normal_(0, 0.2)
    reranked = RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index, num_candidates=8, candidates="base")
    adapted = RetrieverClient.from_index(QueryEncoder(minilm_spec), world_index, num_candidates=8)
    for client in (reranked, adapted):
        client.set_adapter(drifted.adapter_state_dict(), version=1)
    base, mine, free = (c.retrieve(questions[:6]) for c in (frozen, reranked, adapted))
    assert all(set(b.doc_ids) == set(r.doc_ids) for b, r in zip(base, mine, strict=True))
    assert any(b.doc_ids != r.doc_ids for b, r in zip(base, mine, strict=True)), "the adapter re-ranks"
    assert any(set(b.doc_ids) != set(f.doc_ids) for b, f in zip(base, free, strict=True)), "adapted: it searches"
    for r in mine:
        expected = drifted.encode_queries([r.query]).detach() @ reranked.doc_embeddings(r.doc_ids).T
        torch.testing.assert_close(expected[0], torch.tensor(r.scores), atol=1e-5, rtol=0)
        assert r.scores == sorted(r.scores, reverse=True) and r.retriever_version == 1


def test_index_of_another_encoder_configuration_is_refused(world_index, minilm_spec):
    e5 = dataclasses.replace(minilm_spec, model="intfloat/e5-base-v2", **vars(PRESETS["intfloat/e5-base-v2"]))
    with pytest.raises(IndexMismatchError, match=r"another encoder configuration.*model.*passage_prefix"):
        load_index_manifest(world_index, e5)
    with pytest.raises(IndexMismatchError, match="query_prefix"):
        ShardSet.local(world_index, dataclasses.replace(minilm_spec, query_prefix="query: "))
    prefixed = QueryEncoder(dataclasses.replace(minilm_spec, query_prefix="query: "), rank=2)
    with pytest.raises(IndexMismatchError, match="shard 0 was built with another encoder configuration"):
        RetrieverClient(prefixed, ShardSet.local(world_index))
    # max_query_length only truncates queries: the index stays usable.
    ShardSet.local(world_index, dataclasses.replace(minilm_spec, max_query_length=32)).close()


def test_frozen_minilm_is_imperfect_but_finds_most_gold_passages(world_index, small_world, encoder):
    qs = [q for split in ("train", "dev", "test") for q in load_split(small_world, split)]
    hits, _ = RetrieverClient.from_index(encoder, world_index).search([q["question"] for q in qs], 10)
    first_hop = [int(q["metadata"]["gold_doc_ids"][0]) for q in qs]
    at1 = np.mean([g == ids[0] for g, ids in zip(first_hop, hits.ids.tolist(), strict=True)])
    at10 = np.mean([g in ids for g, ids in zip(first_hop, hits.ids.tolist(), strict=True)])
    print(f"small world, first-hop recall@1 {at1:.2f} @10 {at10:.2f}")
    assert 0.1 < at1 < 0.95 and at10 > 0.5
