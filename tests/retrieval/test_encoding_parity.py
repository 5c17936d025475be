"""Passages and queries embed exactly as sentence-transformers, Search-R1 and FlashRAG embed them.

Indexes built here and by Search-R1's / FlashRAG's ``index_builder.py`` are interchangeable only if the same
string is embedded the same way: ``contents`` verbatim (quoted title included), the family's prefix, pooling,
truncation and normalisation.
"""

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from bridge_ray.config import EncoderConfig, load_config
from bridge_ray.config.encoders import PRESETS, EncoderSpec
from bridge_ray.coordinator import inputs
from bridge_ray.model_paths import MINILM, resolve_model_path
from bridge_ray.retrieval import build as build_module
from bridge_ray.retrieval.build import build_configured_index
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.corpus import document_from_row
from bridge_ray.retrieval.encoder import PassageEncoder, QueryEncoder
from bridge_ray.retrieval.manifest import MANIFEST_FILE

CORPUS = [
    {"id": "0", "contents": '"Velmora"\nVelmora is a river town on the Vutyn, founded in 1511.'},
    {"id": "1", "contents": '"Ilsa Varen"\nIlsa Varen was born in Velmora.\nShe later crossed the "Copper Bridge".'},
    {"id": "2", "title": '"Harrowgate Shipyard"', "text": "The Harrowgate Shipyard was founded in 1820 by Oren Dask."},
    {"id": "3", "contents": "Kidreith\nKidreith lies on the Leites; it is best known for the Willow Arcade."},
    {"id": "4", "contents": '"Copper Bridge"\nThe Copper Bridge spans the Vutyn at Velmora. ' + "It is old. " * 40},
    {"id": "5", "contents": '"Oren Dask"\nOren Dask was a shipwright from Kidreith.'},
]
QUERIES = ["Where was Ilsa Varen born?", "Who founded the Harrowgate Shipyard?", "which river does the bridge span"]
# The family conventions of Search-R1's retrieval_server.py / FlashRAG's set_default_instruction and pooling.
FAMILIES = {
    "intfloat/e5-base-v2": {"query": "query: ", "passage": "passage: ", "pooling": "mean"},
    "BAAI/bge-base-en-v1.5": {
        "query": "Represent this sentence for searching relevant passages: ",
        "passage": "",
        "pooling": "cls",
    },
}


def reference_text(row: dict) -> str:
    """What Search-R1 embeds (``contents``) and FlashRAG's ``load_corpus`` maps a ``{title, text}`` row to."""
    return row["contents"] if "contents" in row else row["text"]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reference_embeddings(model_dir, texts, *, prefix: str, pooling: str, max_length: int) -> np.ndarray:
    """Search-R1's ``Encoder.encode`` re-done with plain transformers: prefix, truncate, pool, normalise."""
    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(
        [prefix + t for t in texts], max_length=max_length, padding=True, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    if pooling == "mean":
        mask = batch["attention_mask"]
        pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(1) / mask.sum(1)[..., None]
    else:
        pooled = hidden[:, 0]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A randomly initialised 2-layer BERT with MiniLM's tokenizer, saved locally: no download."""
    path = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_minilm_index_equals_sentence_transformers_on_quoted_contents(tmp_path):
    from sentence_transformers import SentenceTransformer

    cfg = load_config().retrieval
    spec = cfg.encoder.spec()
    out = tmp_path / "index"
    build_configured_index(cfg, write_rows(tmp_path / "c.jsonl", CORPUS), out, device="cpu", progress=False)
    st = SentenceTransformer(resolve_model_path(spec.model), device="cpu")
    docs = st.encode([reference_text(r) for r in CORPUS], normalize_embeddings=True)
    queries = st.encode(QUERIES, normalize_embeddings=True)
    np.testing.assert_allclose(np.load(out / "shard_000/embeddings.npy"), docs, rtol=0, atol=1e-5)
    encoder = QueryEncoder(spec)
    np.testing.assert_allclose(encoder.embed_queries(QUERIES), queries, rtol=0, atol=1e-5)
    expected = queries @ docs.T
    for i, result in enumerate(
        RetrieverClient.from_index(encoder, out, num_candidates=4, num_shown=2).retrieve(QUERIES)
    ):
        assert result.doc_ids == np.argsort(-expected[i])[:4].tolist()
        np.testing.assert_allclose(result.scores, np.sort(expected[i])[::-1][:4], rtol=0, atol=1e-5)
        assert '"' not in result.shown[0].title  # the policy reads the display form


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_prefixes_pooling_and_truncation_match_a_hand_computed_reference(tiny_bert, family):
    convention = FAMILIES[family]
    spec = EncoderSpec(model=str(tiny_bert), **vars(PRESETS[family]), max_query_length=32, max_passage_length=24)
    documents = [document_from_row(r) for r in CORPUS]
    passages = PassageEncoder(spec, device="cpu", batch_size=4).embed_passages(documents)
    expected = reference_embeddings(
        tiny_bert,
        [reference_text(r) for r in CORPUS],
        prefix=convention["passage"],
        pooling=convention["pooling"],
        max_length=24,
    )
    np.testing.assert_allclose(passages, expected, rtol=0, atol=1e-5)
    queries = QueryEncoder(spec, rank=2).embed_queries(QUERIES)  # a fresh LoRA is the identity
    expected = reference_embeddings(
        tiny_bert, QUERIES, prefix=convention["query"], pooling=convention["pooling"], max_length=32
    )
    np.testing.assert_allclose(queries, expected, rtol=0, atol=1e-5)


def test_cached_world_index_is_keyed_on_the_passage_text_rule(tmp_path, monkeypatch):
    """A change of how rows are embedded builds a fresh cached world index instead of reusing the old one."""

    def fake_build(cfg, corpus, out, **kwargs):
        (out / MANIFEST_FILE).write_text("{}")

    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path))
    monkeypatch.setattr(inputs, "configured_world", lambda config: tmp_path / "world")
    monkeypatch.setattr(build_module, "build_configured_index", fake_build)
    config = load_config()
    current = inputs.index_dir(config)
    spec = EncoderConfig.spec
    monkeypatch.setattr(EncoderConfig, "spec", lambda self: dataclasses.replace(spec(self), passage_text="title/text"))
    assert inputs.index_dir(config) != current


def test_cached_world_index_is_keyed_on_its_build_settings(tmp_path, monkeypatch):
    """Build-time settings (an approximate index's parameters, an explicit passage dtype) key the cached world
    index; another index type's parameters do not."""
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path))
    monkeypatch.setattr(inputs, "configured_world", lambda config: tmp_path / "world")
    monkeypatch.setattr(build_module, "build_configured_index", lambda cfg, corpus, out, **kw: (
        (out / MANIFEST_FILE).write_text("{}")))
    config = load_config()
    assert re.fullmatch(r"index-[0-9a-f]{16}", inputs.index_dir(config).name)
    assert inputs.index_dir(load_config(None, ["retrieval.index.hnsw_m=8"])) == inputs.index_dir(config)
    names = {inputs.index_dir(load_config(None, overrides)).name for overrides in (
        [], ["retrieval.encoder.passage_dtype=float32"], ["retrieval.index.index_type=hnsw"],
        ["retrieval.index.index_type=hnsw", "retrieval.index.hnsw_m=8"], ["retrieval.index.index_type=ivf"],
        ["retrieval.index.index_type=ivf", "retrieval.index.ivf_nlist=64"],
    )}
    assert len(names) == 6
