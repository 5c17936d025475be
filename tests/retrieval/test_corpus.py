import json

import pytest

from bridge_ray.errors import InputError
from bridge_ray.retrieval.corpus import (
    CorpusFormatError,
    Document,
    PassageStore,
    SkippedLines,
    document_from_row,
    read_corpus,
    write_passage_store,
)
from bridge_ray.retrieval.types import Passage


def test_both_row_formats_display_without_quotes_but_encode_verbatim(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [
        {"id": "0", "contents": '"Velmora"\nA river town.\n'},
        {"id": 7, "contents": "No quotes\nbody"},
        {"id": "x", "title": '"Quoted"', "text": " t\n"},
        {"id": "y", "contents": "only a title"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = [r.passage for r in read_corpus(path)]
    assert got == [
        Passage("0", "Velmora", "A river town."),
        Passage("7", "No quotes", "body"),
        Passage("x", "Quoted", "t"),
        Passage("y", "only a title", ""),
    ]
    # Search-R1 embeds `contents` as is; FlashRAG maps a {title, text} row to contents = text.
    assert [document_from_row(r) for r in rows] == [
        Document("0", '"Velmora"\nA river town.\n'),
        Document("7", "No quotes\nbody"),
        Document("x", " t\n"),
        Document("y", "only a title"),
    ]
    assert [r.line_no for r in read_corpus(path)] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "Expecting property name"),
        ('["a list"]', "JSON object"),
        ('{"contents": "t\\nx"}', "missing key 'id'"),
        ('{"id": "1", "text": "no title"}', "expected keys"),
        ('{"id": "1", "contents": 3}', "'contents' must be a string"),
        ("", "empty line"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "contents": "T\\nx"}\n' + line + '\n{"id": "2", "contents": "T\\ny"}\n')
    with pytest.raises(CorpusFormatError, match=rf"bad\.jsonl:2: .*{reason}"):
        list(read_corpus(path))


def test_skip_bad_lines_reports_how_many_and_which(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "A\\na"}\n{oops\n{"id": "2", "contents": "B\\nb"}\n[]\n')
    skipped = SkippedLines()
    got = [r.passage.id for r in read_corpus(path, skip_bad_lines=True, skipped=skipped)]
    assert got == ["0", "2"]
    assert [n for n, _ in skipped.lines] == [2, 4]
    assert "skipped 2 malformed line(s): line 2" in skipped.summary(path) and "line 4" in skipped.summary(path)
    with pytest.raises(ValueError, match="SkippedLines"):
        list(read_corpus(path, skip_bad_lines=True))


def test_passage_store_random_access_keeps_original_bytes(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\nbody é {i}'}, ensure_ascii=i % 2 == 0) for i in range(50)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert write_passage_store(read_corpus(path), tmp_path) == 50
    store = PassageStore(tmp_path)
    assert len(store) == 50
    assert store.raw([3, 0, 49]) == [lines[3].encode(), lines[0].encode(), lines[49].encode()]
    assert store.rows([10]) == [{"id": "10", "contents": '"T10"\nbody é 10'}]
    assert store.passages([11]) == [Passage("11", "T11", "body é 11")]
    assert list(store.iter_documents(5, 7)) == [Document("5", '"T5"\nbody é 5'), Document("6", '"T6"\nbody é 6')]
    with pytest.raises(IndexError, match="out of range"):
        store.raw([50])
    store.close()


def test_a_malformed_line_is_bad_input_and_leaves_no_partial_store(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "A\\na"}\n{oops\n')
    (tmp_path / "store").mkdir()
    with pytest.raises(InputError, match=r"c\.jsonl:2: malformed corpus line"):
        write_passage_store(read_corpus(path), tmp_path / "store")
    assert list((tmp_path / "store").iterdir()) == []  # no temporary files for a retry to trip over
