"""build-index --from-faiss: an existing Search-R1 / FlashRAG FAISS index split into shards without re-encoding."""

import json
from pathlib import Path

import faiss
import numpy as np
import pytest
from retrieval_helpers import write_corpus

from bridge_ray.cli import main
from bridge_ray.errors import InputError
from bridge_ray.model_paths import MINILM, resolve_model_path
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.faiss_import import import_faiss_index
from bridge_ray.retrieval.shard import IndexShard

N, DIM = 600, 16


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def exact_top_k(table: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top k by (score desc, id asc), without FAISS."""
    scores = queries @ table.T
    order = np.lexsort((np.broadcast_to(np.arange(len(table)), scores.shape), -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, 1), order


def faiss_file(path: Path, factory: str, table: np.ndarray, metric: int = faiss.METRIC_INNER_PRODUCT, ids=None) -> Path:
    """What Search-R1's / FlashRAG's builders write: ``index_factory(dim, factory, metric)``, trained, filled."""
    index = faiss.index_factory(table.shape[1], factory, metric)
    if not index.is_trained:
        index.train(table)
    if ids is None:
        index.add(table)
    else:
        index.add_with_ids(table, np.asarray(ids, dtype=np.int64))
    faiss.write_index(index, str(path))
    return path


def import_table(tmp_path: Path, source: Path, rows: int = N, **kwargs):
    corpus = write_corpus(tmp_path / "corpus.jsonl", rows)
    options = {"encoder": {"model": "t"}, "dim": DIM, "progress": False, **kwargs}
    return import_faiss_index(corpus, source, tmp_path / "out", **options)


def refused(tmp_path: Path, source: Path, message: str, **kwargs) -> str:
    """The import's error, which must read ``<source><message>...``; the output folder is left empty or absent."""
    with pytest.raises(InputError) as err:
        import_table(tmp_path, source, **kwargs)
    assert str(err.value).startswith(f"{source}{message}"), err.value
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    return str(err.value)


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return unit(np.random.default_rng(0), N, DIM)


@pytest.mark.slow  # the real MiniLM through sentence-transformers
def test_search_r1_flat_index_searches_like_its_model(tmp_path, minilm_spec, capsys):
    from sentence_transformers import SentenceTransformer

    topics = ["Mount Everest", "Photosynthesis", "The Beatles", "Python (language)", "Great Wall", "Jupiter"]
    facts = ["is the highest mountain", "turns light into sugar", "were a band from Liverpool"]
    contents = [f'"{t}"\n{t} {f}, entry {i}.' for i, (t, f) in enumerate((t, f) for t in topics for f in facts)]
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(contents)))
    model = SentenceTransformer(resolve_model_path(MINILM), device="cpu")
    emb = model.encode(contents, normalize_embeddings=True)  # Search-R1: `contents` verbatim, normalised
    source = faiss_file(tmp_path / "e5_Flat.index", "Flat", emb)
    out = tmp_path / "index"
    args = ["build-index", "--corpus", str(corpus), "--from-faiss", str(source), "--out", str(out), "--shards", "2"]
    assert main([*args, "--no-progress"]) == 0
    assert f"index {out}: {len(contents)} passages, dim 384, 2 flat shard(s)" in capsys.readouterr().out

    queries = model.encode(["tallest mountain on earth", "band from Liverpool", "how plants make sugar"])
    shards = ShardSet.local(out, minilm_spec)
    hits = shards.search(queries, 5)
    ref_scores, ref_ids = exact_top_k(emb, queries, 5)
    np.testing.assert_array_equal(hits.ids, ref_ids)
    np.testing.assert_allclose(hits.scores, ref_scores, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(shards.doc_embeddings(np.arange(len(contents))).numpy(), emb)  # g(d), bit for bit
    assert [row["contents"] for row in shards.routed(IndexShard.rows, hits.ids[0])] == [contents[i] for i in ref_ids[0]]
    shards.close()


@pytest.mark.parametrize("index_type", ["flat", "ivf"])
def test_ivf_flat_index_imports_its_exact_vectors(tmp_path, table, index_type):
    source = faiss_file(tmp_path / "e5_IVF8,Flat.index", "IVF8,Flat", table)
    manifest = import_table(tmp_path, source, num_shards=3, index_type=index_type)
    assert manifest.index_type == index_type and manifest.build["from_faiss"]["type"] == "IndexIVFFlat"
    shards = ShardSet.local(tmp_path / "out")
    np.testing.assert_array_equal(shards.doc_embeddings(np.arange(N)).numpy(), table)
    hits = shards.search(table[:20], 10)
    if index_type == "flat":  # exact search over the imported vectors
        np.testing.assert_array_equal(hits.ids, exact_top_k(table, table[:20], 10)[1])
    else:  # a unit vector's nearest neighbour is itself, in the list it was filed under
        assert (tmp_path / "out" / "shard_002" / "index.faiss").is_file()
        np.testing.assert_array_equal(hits.ids[:, 0], np.arange(20))
    shards.close()


@pytest.mark.parametrize(
    ("factory", "ids", "kind"),
    [("IDMap,Flat", np.arange(N), "IndexIDMap(IndexFlatIP)"), ("HNSW16", None, "IndexHNSWFlat")],
)
def test_id_mapped_flat_and_hnsw_flat_import(tmp_path, table, factory, ids, kind):
    manifest = import_table(tmp_path, faiss_file(tmp_path / "x.index", factory, table, ids=ids))
    assert manifest.build["from_faiss"]["type"] == kind
    shards = ShardSet.local(tmp_path / "out")
    np.testing.assert_array_equal(shards.doc_embeddings(np.arange(N)).numpy(), table)
    shards.close()


@pytest.mark.parametrize(
    ("factory", "ids", "kind"),
    [
        ("IDMap,Flat", np.arange(N)[::-1], "IndexIDMap(IndexFlatIP)"),
        ("IVF4,Flat", np.arange(N) + 1, "IndexIVFFlat"),  # an id past the end
        ("IVF4,Flat", np.r_[0, np.arange(N - 1)], "IndexIVFFlat"),  # id 0 twice, N-1 missing
    ],
)
def test_ids_other_than_the_row_numbers_are_refused(tmp_path, table, factory, ids, kind):
    source = faiss_file(tmp_path / "x.index", factory, table, ids=ids)
    refused(tmp_path, source, f": {kind} holds ids other than 0..{N - 1} in order; vector i must be corpus line i")


@pytest.mark.parametrize(
    ("factory", "kind"),
    [("PQ4x4", "IndexPQ"), ("SQ8", "IndexScalarQuantizer"), ("IVF4,PQ4x4", "IndexIVFPQ"), ("HNSW8,SQ8", "IndexHNSWSQ")],
)
def test_lossy_indexes_are_refused_naming_the_type(tmp_path, table, factory, kind):
    source = faiss_file(tmp_path / "x.index", factory, table)
    message = refused(tmp_path, source, f": {kind} cannot be imported (supported: IndexFlatIP, ")
    assert "Rebuild it with --faiss_type Flat" in message and "build-index without --from-faiss" in message


def test_an_l2_index_is_refused_as_such(tmp_path, table):
    source = faiss_file(tmp_path / "e5_Flat.index", "Flat", table, metric=faiss.METRIC_L2)
    refused(tmp_path, source, " is an L2 index (IndexFlatL2); the retriever scores by inner product")


@pytest.mark.parametrize("existing", [False, True])
def test_a_corpus_of_another_size_is_refused_and_the_folder_left_clean(tmp_path, table, existing):
    source = faiss_file(tmp_path / "e5_Flat.index", "Flat", table)
    if existing:
        (tmp_path / "out").mkdir()
    corpus = (tmp_path / "corpus.jsonl").resolve()
    refused(tmp_path, source, f" holds {N} vectors, corpus {corpus} has {N + 1} rows", rows=N + 1, num_shards=2)
    assert (tmp_path / "out").exists() == existing


def test_unnormalised_vectors_are_refused_for_a_normalising_encoder(tmp_path, table):
    source = faiss_file(tmp_path / "dpr_Flat.index", "Flat", np.r_[table[:5], 2 * table[5:]])
    encoder = {"model": "t", "normalize": True}
    refused(tmp_path, source, ": vector 5 has norm 2.0000, but retrieval.encoder normalises", encoder=encoder)


def test_the_same_import_again_is_up_to_date_and_another_is_refused(tmp_path, table, capsys):
    corpus = write_corpus(tmp_path / "corpus.jsonl", N)
    source = faiss_file(tmp_path / "e5_Flat.index", "Flat", table)
    paths = [corpus, source, tmp_path / "out"]
    first = import_faiss_index(*paths, encoder={"model": "t"}, dim=DIM, progress=False)
    capsys.readouterr()
    assert import_faiss_index(*paths, encoder={"model": "t"}, dim=DIM, progress=False) == first
    assert "up to date" in capsys.readouterr().out
    with pytest.raises(InputError, match=r"another corpus or configuration .*num_shards: 1 vs 2"):
        import_faiss_index(*paths, encoder={"model": "t"}, dim=DIM, num_shards=2, progress=False)


def test_command_checks_the_dimension_against_the_encoder_config(tmp_path, table, capsys):
    corpus = write_corpus(tmp_path / "corpus.jsonl", N)
    source = faiss_file(tmp_path / "e5_Flat.index", "Flat", table)
    args = ["build-index", "--corpus", str(corpus), "--from-faiss", str(source), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{source} holds vectors of dimension {DIM}, encoder {MINILM} has dimension 384" in err
    assert main([*args, "--skip-bad-lines"]) == 2
    assert "--skip-bad-lines cannot be used with --from-faiss" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
