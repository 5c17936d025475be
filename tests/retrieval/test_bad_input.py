"""Bad input to build-index and serve-retriever, through the real commands: exit 2 and a message naming the culprit.

A failed build leaves nothing that blocks its retry; an output folder holding someone else's work is refused;
a damaged index is refused at load, naming the file, before anything serves.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import uvicorn
from retrieval_helpers import write_corpus

from bridge_ray.cli import main

pytestmark = pytest.mark.slow  # build-index loads the real MiniLM


def build(corpus: Path, out: Path, *extra: str) -> int:
    return main(["build-index", "--corpus", str(corpus), "--out", str(out), "--no-progress", *extra])


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


INDEX = ["manifest.json", "passages.jsonl", "passages.offsets.npy", "shard_000"]


@pytest.mark.parametrize("chunk", ["0", "-3"])
def test_build_index_refuses_a_chunk_below_one(tmp_path, capsys, chunk):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 5)
    assert build(corpus, tmp_path / "index", "--chunk", chunk) == 2
    assert f"--chunk must be at least 1 (passages encoded between two resume points), got {chunk}" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "index").exists()


def test_failed_build_is_retried_once_the_corpus_is_fixed(tmp_path, capsys):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "index"
    good = [json.dumps({"id": str(i), "contents": f"T{i}\nbody {i}"}) for i in range(3)]
    corpus.write_text("\n".join([good[0], '{"id": "1", "contents": ', good[2]]) + "\n")
    assert build(corpus, out) == 2
    assert f"error: {corpus}:2: malformed corpus line" in capsys.readouterr().err
    assert not out.exists()  # nothing was encoded: the failed build leaves no trace, not even its folder
    corpus.write_text("\n".join(good) + "\n")
    assert build(corpus, out) == 0
    assert "3 passages" in capsys.readouterr().out and listing(out) == INDEX


@pytest.mark.parametrize("existing", [False, True])
def test_more_shards_than_passages_leaves_nothing(tmp_path, capsys, existing):
    corpus, out = write_corpus(tmp_path / "corpus.jsonl", 10), tmp_path / "index"
    if existing:
        out.mkdir()
    assert build(corpus, out, "--shards", "20") == 2
    assert "20 shards for 10 passages: every shard needs a passage" in capsys.readouterr().err
    assert (listing(out) == []) if existing else not out.exists()  # a folder it found stays, empty
    assert build(corpus, out, "--shards", "2") == 0 and listing(out) == [*INDEX[:3], "shard_000", "shard_001"]


def test_build_index_owns_its_output_folder(tmp_path, capsys):
    first, second = write_corpus(tmp_path / "a.jsonl", 4), write_corpus(tmp_path / "b.jsonl", 6)
    out = tmp_path / "index"
    assert build(first, out) == 0
    manifest = (out / "manifest.json").read_bytes()
    capsys.readouterr()
    assert build(first, out) == 0  # the identical command on a complete index: reported, not rebuilt
    assert "up to date, nothing rebuilt" in capsys.readouterr().out
    assert (out / "manifest.json").read_bytes() == manifest
    for other in ([str(second)], [str(first), "--shards", "2"]):
        assert build(Path(other[0]), out, *other[1:]) == 2
        err = capsys.readouterr().err
        assert f"error: {out} already holds a complete index of another corpus or configuration" in err
        assert ("corpus.path" if other[0] == str(second) else "num_shards: 1 vs 2") in err and "--overwrite" in err
        assert (out / "manifest.json").read_bytes() == manifest and listing(out) == INDEX
    assert build(second, out, "--overwrite") == 0
    assert "6 passages" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["build"]["corpus"]["path"] == str(second)


def test_build_index_refuses_a_folder_of_other_files(tmp_path, capsys):
    corpus, out = write_corpus(tmp_path / "corpus.jsonl", 4), tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert build(corpus, out) == 2
    assert f"error: {out} already holds files that are not an index (notes.txt)" in capsys.readouterr().err
    assert listing(out) == ["notes.txt"]
    assert build(corpus, out, "--overwrite") == 0  # builds among them, keeps them
    assert listing(out) == sorted([*INDEX, "notes.txt"]) and (out / "notes.txt").read_text() == "mine"


@pytest.fixture(scope="module")
def index_50(tmp_path_factory) -> Path:
    """50 passages in 2 shards, encoded by the real MiniLM through the command: what serve-retriever loads."""
    root = tmp_path_factory.mktemp("index50")
    assert build(write_corpus(root / "corpus.jsonl", 50), root / "index", "--shards", "2") == 0
    return root / "index"


def truncate_lines(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:37]))


def truncate_bytes(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:20000])


def drop_a_comma(path: Path) -> None:
    path.write_text(path.read_text().replace('"dim": 384,', '"dim": 384', 1))


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("rel", "damage", "message"),
    [
        ("passages.jsonl", truncate_lines, r"passages\.jsonl has 37 lines \(\d+ bytes\), manifest says 50"),
        ("shard_001/embeddings.npy", truncate_bytes, r"shard_001/embeddings\.npy is 20000 bytes, manifest says 38528"),
        ("manifest.json", drop_a_comma, r"manifest\.json:\d+:\d+: invalid JSON \(Expecting ',' delimiter\)"),
        ("shard_000/embeddings.npy", flip_a_byte, r"shard_000/embeddings\.npy: checksum \w+… != manifest"),
    ],
)
def test_damaged_index_is_refused_before_serving(tmp_path, capsys, monkeypatch, index_50, rel, damage, message):
    def serve(*args, **kwargs):
        raise AssertionError("serve-retriever served a damaged index")

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    monkeypatch.setattr(uvicorn, "run", serve)
    index = shutil.copytree(index_50, tmp_path / "index")
    damage(index / rel)
    assert main(["serve-retriever", "--index", str(index), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"error: {index / rel}" in err and "the index is damaged: rebuild it" in err
    assert re.search(message, err), err
