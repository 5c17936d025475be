"""Index build (resumable, manifest, checksums), shard loading, and the exact sharded top-k."""

import json

import numpy as np
import pytest
from retrieval_helpers import TableEmbedder, vector_index, write_corpus

from bridge_ray.config import ConfigError, IndexConfig, load_config
from bridge_ray.errors import InputError
from bridge_ray.retrieval import manifest as manifest_module
from bridge_ray.retrieval.build import build_index, shard_ranges
from bridge_ray.retrieval.client import ShardSet
from bridge_ray.retrieval.manifest import IndexMismatchError, load_index_manifest, verify_checksums
from bridge_ray.retrieval.merge import PAD_ID, Hits, merge_hits, top_k
from bridge_ray.retrieval.shard import IndexShard


def brute_force(table: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top k by (score desc, id asc) computed without FAISS."""
    scores = queries @ table.T
    ids = np.broadcast_to(np.arange(len(table)), scores.shape)
    order = np.lexsort((ids, -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, 1), order


def unit(rng, n, d):
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_shard_ranges_tile_the_corpus():
    assert shard_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_ranges(5, 5) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    with pytest.raises(ValueError, match="every shard needs a passage"):
        shard_ranges(2, 3)


def test_top_k_orders_by_score_then_id_and_pads_last():
    scores = np.array([[0.5, 0.9, 0.5, 0.1, -np.inf]], dtype=np.float32)
    ids = np.array([[7, 3, 2, 9, PAD_ID]])
    s, i = top_k(scores, ids, 5)
    assert i.tolist() == [[3, 2, 7, 9, PAD_ID]]
    merged = merge_hits([Hits(s[:, :2], i[:, :2]), Hits(np.array([[0.95]], np.float32), np.array([[11]]))], 2)
    assert merged.ids.tolist() == [[11, 3]] and merged.row(0) == ([11, 3], [pytest.approx(0.95), pytest.approx(0.9)])


def test_sharded_top_k_equals_single_index_on_random_vectors(tmp_path):
    rng = np.random.default_rng(0)
    table, queries = unit(rng, 2000, 32), unit(rng, 50, 32)
    single = ShardSet.local(vector_index(tmp_path, table, shards=1))
    sharded = ShardSet.local(vector_index(tmp_path, table, shards=4))
    assert len(sharded) == 4
    one, four = single.search(queries, 40), sharded.search(queries, 40)
    ref_scores, ref_ids = brute_force(table, queries, 40)
    np.testing.assert_array_equal(four.ids, one.ids)
    np.testing.assert_array_equal(four.ids, ref_ids)
    np.testing.assert_allclose(four.scores, ref_scores, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(sharded.doc_embeddings(four.ids[:3]).numpy(), table[four.ids[:3]])  # g(d) by id
    for s in (single, sharded):
        s.close()


def test_ties_at_the_cut_are_resolved_exactly_like_one_index(tmp_path):
    rng = np.random.default_rng(1)
    # Small integer vectors: every score is exact in float32, and many documents tie.
    table = rng.integers(-1, 2, size=(600, 6)).astype(np.float32)
    queries = rng.integers(-1, 2, size=(40, 6)).astype(np.float32)
    ref_scores, ref_ids = brute_force(table, queries, 10)
    all_scores = np.sort(queries @ table.T, axis=1)[:, ::-1]
    assert (all_scores[:, 9] == all_scores[:, 10]).mean() > 0.9  # the 10th score is tied past the cut
    for shards in (1, 3, 7):
        hits = ShardSet.local(vector_index(tmp_path, table, shards=shards)).search(queries, 10)
        np.testing.assert_array_equal(hits.ids, ref_ids, err_msg=f"{shards} shards")
        np.testing.assert_array_equal(hits.scores, ref_scores)


def test_k_larger_than_corpus_returns_everything(tmp_path):
    table = unit(np.random.default_rng(2), 10, 8)
    hits = ShardSet.local(vector_index(tmp_path, table, shards=3)).search(table[:2], 40)
    assert sorted(hits.row(0)[0]) == list(range(10)) and hits.row(0)[0][0] == 0


@pytest.mark.parametrize(("index_type", "params"), [("hnsw", {"m": 16}), ("ivf", {"nlist": 8})])
def test_approximate_indexes_build_load_and_search(tmp_path, index_type, params):
    rng = np.random.default_rng(3)
    table, queries = unit(rng, 1500, 16), unit(rng, 30, 16)
    out = vector_index(tmp_path, table, shards=2, index_type=index_type, **params)
    manifest = load_index_manifest(out)
    assert manifest.index_type == index_type
    assert all(f"shard_00{s.id}/index.faiss" in s.files for s in manifest.shards)
    shards = ShardSet([IndexShard(out, s, hnsw_ef_search=256, ivf_nprobe=8) for s in range(2)])
    hits = shards.search(queries, 10)
    _, ref_ids = brute_force(table, queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(hits.ids.tolist(), ref_ids.tolist(), strict=True)])
    assert recall >= (1.0 if index_type == "ivf" else 0.9)  # ivf probing every list is exact


def test_in_process_shards_search_and_verify_as_the_config_says(tmp_path, monkeypatch):
    """The warm-up, the evaluations and the benches open the index through ``index_shards``, which passes
    ``retrieval.index``'s search and check settings, as the graph's shard holders get them."""
    from bridge_ray.config import EncoderConfig
    from bridge_ray.coordinator.inputs import index_shards

    out = vector_index(tmp_path, unit(np.random.default_rng(4), 300, 8), shards=2, index_type="hnsw", m=8)
    monkeypatch.setattr(EncoderConfig, "spec", lambda self: None)  # the table embedder is no configured encoder
    overrides = [f"retrieval.index.dir={out}", "retrieval.index.num_shards=2", "retrieval.index.hnsw_ef_search=7"]
    shards = index_shards(load_config(None, overrides))
    assert [s.index.hnsw.efSearch for s in shards.calls.shards] == [7, 7]
    damaged = out / "shard_001" / "embeddings.npy"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))  # one value changed: only a checksum tells
    assert len(index_shards(load_config(None, [*overrides, "retrieval.index.verify=never"]))) == 2
    with pytest.raises(IndexMismatchError, match=r"embeddings\.npy: checksum"):
        index_shards(load_config(None, [*overrides, "retrieval.index.verify=always"]))


class FailAfter(TableEmbedder):
    def __init__(self, table, calls):
        super().__init__(table)
        self.limit = calls

    def __call__(self, passages):
        if len(self.calls) == self.limit:
            raise KeyboardInterrupt("simulated interruption")
        return super().__call__(passages)


def test_interrupted_build_resumes_where_it_stopped(tmp_path):
    table = unit(np.random.default_rng(4), 1000, 16)
    corpus = write_corpus(tmp_path / "corpus.jsonl", 1000)
    out = tmp_path / "index"
    kwargs = {"encoder": {"model": "table"}, "dim": 16, "num_shards": 2, "batch_size": 100, "progress": False}
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, out, FailAfter(table, 7), **kwargs)  # shard 0 done (5 batches), shard 1 has 200 rows
    assert not (out / "manifest.json").exists()
    assert json.loads((out / "shard_001/progress.json").read_text()) == {"rows": 200}
    resumed = TableEmbedder(table)
    manifest = build_index(corpus, out, resumed, **kwargs)
    assert [row for call in resumed.calls for row in call] == list(range(700, 1000))
    assert manifest.num_passages == 1000 and [(s.start, s.stop) for s in manifest.shards] == [(0, 500), (500, 1000)]
    stored = np.concatenate([np.load(out / f"shard_00{s}/embeddings.npy") for s in range(2)])
    np.testing.assert_array_equal(stored, table)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "passages.jsonl",
        "passages.offsets.npy",
        "shard_000",
        "shard_001",
    ]
    verify_checksums(out, manifest)
    # Re-running a finished build is a no-op; another configuration in the same directory is refused.
    assert build_index(corpus, out, FailAfter(table, 0), **kwargs) == manifest
    with pytest.raises(InputError, match=r"complete index of another corpus or configuration \(num_shards: 2 vs 3\)"):
        build_index(corpus, out, resumed, **{**kwargs, "num_shards": 3})
    emb = out / "shard_001/embeddings.npy"
    emb.write_bytes(emb.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(IndexMismatchError, match=r"shard_001/embeddings\.npy: checksum"):
        verify_checksums(out, manifest)


def test_unfinished_build_of_another_configuration_is_discarded_with_a_note(tmp_path, capsys):
    table = unit(np.random.default_rng(5), 100, 8)
    corpus = write_corpus(tmp_path / "corpus.jsonl", 100)
    kwargs = {"dim": 8, "batch_size": 10, "progress": False}
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "i", FailAfter(table, 2), encoder={"model": "a"}, **kwargs)
    fresh = TableEmbedder(table)
    manifest = build_index(corpus, tmp_path / "i", fresh, encoder={"model": "b"}, **kwargs)
    assert "discarding the unfinished build" in capsys.readouterr().err
    assert [row for call in fresh.calls for row in call] == list(range(100))  # nothing of model "a" kept
    assert manifest.encoder == {"model": "b"}
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        build_index(corpus, tmp_path / "j", fresh, encoder={"model": "b"}, **{**kwargs, "batch_size": 0})


def test_index_files_are_checked_at_load_sizes_always_checksums_per_verify(tmp_path, monkeypatch):
    assert IndexConfig().verify == "auto"
    with pytest.raises(ConfigError, match=r"retrieval\.index\.verify"):
        load_config(None, ["retrieval.index.verify=sometimes"])
    out = vector_index(tmp_path, unit(np.random.default_rng(7), 40, 8), shards=2)
    emb = out / "shard_001/embeddings.npy"
    data = bytearray(emb.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only a checksum sees it
    emb.write_bytes(bytes(data))
    IndexShard(out, 0, verify="always")  # shard 0 reads the passage store and its own files: all whole
    for verify in ("auto", "always"):
        with pytest.raises(IndexMismatchError, match=r"shard_001/embeddings\.npy: checksum"):
            IndexShard(out, 1, verify=verify)
    IndexShard(out, 1, verify="never")
    header = bytearray(data)
    header[:6] = b"NOTNPY"  # same size, unparsable: an error naming the file even without checksums
    emb.write_bytes(bytes(header))
    with pytest.raises(IndexMismatchError, match=r"shard_001/embeddings\.npy: unreadable"):
        IndexShard(out, 1, verify="never")
    emb.write_bytes(bytes(data))
    monkeypatch.setattr(manifest_module, "AUTO_VERIFY_MAX_BYTES", 100)  # "auto" on an index over the limit
    IndexShard(out, 1, verify="auto")
    emb.write_bytes(bytes(data[:-32]))  # truncated: found by its size, whatever verify says
    for load in (lambda: load_index_manifest(out), lambda: IndexShard(out, 1, verify="never")):
        with pytest.raises(IndexMismatchError, match=r"shard_001/embeddings\.npy is \d+ bytes, manifest says \d+"):
            load()
    emb.unlink()
    with pytest.raises(IndexMismatchError, match=r"shard_001/embeddings\.npy is missing"):
        ShardSet.local(out)


def test_skipped_corpus_lines_are_recorded_and_ids_stay_dense(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d0", "contents": "A\\na"}\nnot json\n{"id": "d1", "contents": "B\\nb"}\n')
    table = unit(np.random.default_rng(6), 2, 4)
    manifest = build_index(
        corpus, tmp_path / "i", TableEmbedder(table), encoder={"model": "t"}, dim=4, skip_bad_lines=True, progress=False
    )
    assert manifest.num_passages == 2 and [row[0] for row in manifest.skipped_lines] == [2]
    shard = IndexShard(tmp_path / "i", 0)
    assert [p.id for p in shard.passages([0, 1])] == ["d0", "d1"]
    with pytest.raises(IndexError, match=r"holds ids \[0, 2\)"):
        shard.doc_embeddings([2])


@pytest.mark.slow
def test_build_index_command_reports_bad_lines_or_skips_them(tmp_path, capsys):
    from bridge_ray.cli import main

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "0", "contents": "A\\na"}\n{"id": "1"}\n{"id": "2", "contents": "B\\nb"}\n')
    args = ["build-index", "--corpus", str(corpus), "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "strict")]) == 2
    assert "bad.jsonl:2: malformed corpus line: expected keys" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "lenient"), "--skip-bad-lines", "--index-type", "hnsw"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 malformed line(s): line 2" in out and "2 passages" in out and "1 line(s) skipped" in out
    assert load_index_manifest(tmp_path / "lenient").index_type == "hnsw"


def test_index_of_another_passage_text_rule_or_none_recorded_is_refused(tmp_path):
    spec = load_config().retrieval.encoder.spec()
    corpus = write_corpus(tmp_path / "corpus.jsonl", 10)
    table = unit(np.random.default_rng(8), 10, 8)
    legacy = {k: v for k, v in spec.to_dict().items() if k != "passage_text"}
    refused = {
        "legacy": (legacy, r"passage_text: index has none recorded \(built before .*`contents` verbatim.*rebuild it"),
        "other": ({**spec.to_dict(), "passage_text": "title/text"}, "passage_text: index has 'title/text', configured"),
    }
    for name, (encoder, match) in refused.items():
        build_index(corpus, tmp_path / name, TableEmbedder(table), encoder=encoder, dim=8, progress=False)
        with pytest.raises(IndexMismatchError, match=match):
            load_index_manifest(tmp_path / name, spec)
    with pytest.raises(InputError, match=r"another corpus or configuration \(encoder\.passage_text: None vs"):
        build_index(corpus, tmp_path / "legacy", TableEmbedder(table), encoder=spec.to_dict(), dim=8, progress=False)
    build_index(corpus, tmp_path / "current", TableEmbedder(table), encoder=spec.to_dict(), dim=8, progress=False)
    assert load_index_manifest(tmp_path / "current", spec).encoder["passage_text"] == "contents, else text"
