"""MIRAGE's benchmark.json and MedRAG's chunk files, in their real formats, read by the loaders and by
``prepare-data --medcorp``."""

import json

import pytest

from bridge_ray.cli import main
from bridge_ray.data.medcorp import MEDCORP_FILE
from bridge_ray.data.mirage import load_benchmark
from bridge_ray.errors import InputError
from bridge_ray.retrieval.corpus import read_corpus

BENCHMARK = {
    "medqa": {
        "0001": {"question": "Q two?", "options": {"A": "a1", "B": "b1", "C": "c1", "D": "d1"}, "answer": "B"},
        "0000": {"question": "Q one?", "options": {"A": "a0", "B": "b0", "C": "c0", "D": "d0"}, "answer": "A"},
    },
    "pubmedqa": {"25280365": {"question": "Does it?", "options": {"A": "yes", "B": "no", "C": "maybe"},
                              "answer": "C", "PMID": [25280365]}},
    "mmlu": {"anatomy-000": {"question": "Which?", "options": {"A": "x", "B": 2, "C": "z", "D": "w"}, "answer": "D"}},
}


def write_benchmark(path, benchmark=BENCHMARK):
    path.write_text(json.dumps(benchmark, indent=4))
    return path


def test_benchmark_in_paper_order_with_sorted_ids(tmp_path):
    sets = load_benchmark(write_benchmark(tmp_path / "benchmark.json"))
    assert list(sets) == ["medqa", "pubmedqa", "mmlu"]
    assert [q.id for q in sets["medqa"]] == ["0000", "0001"]  # MIRAGE's QADataset order
    first = sets["medqa"][0]
    assert (first.question, first.answer, first.options["D"]) == ("Q one?", "A", "d0")
    assert sets["mmlu"][0].options["B"] == "2"  # a number read by pandas, taken as text
    record = sets["pubmedqa"][0].record()
    assert record.uid == "pubmedqa/25280365" and record.golden_answers == ["C"]
    assert record.metadata["options"] == {"A": "yes", "B": "no", "C": "maybe"}
    assert list(load_benchmark(tmp_path / "benchmark.json", ["mmlu"])) == ["mmlu"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("not an object", "medqa/0000: expected an object"),
        ({"options": {"A": "a", "B": "b"}, "answer": "A"}, "medqa/0000: 'question' must be"),
        ({"question": "Q?", "options": {"A": "a"}, "answer": "A"}, "medqa/0000: 'options' must be"),
        ({"question": "Q?", "options": {"a": "x", "B": "y"}, "answer": "B"}, "medqa/0000: option 'a'"),
        ({"question": "Q?", "options": {"A": "x", "B": "y"}, "answer": "E"}, "medqa/0000: 'answer' 'E' is not one"),
    ],
)
def test_bad_question_names_file_set_and_id(tmp_path, entry, message):
    path = write_benchmark(tmp_path / "benchmark.json", {"medqa": {"0000": entry}})
    with pytest.raises(InputError, match=message) as error:
        load_benchmark(path)
    assert str(path) in str(error.value)


def test_bad_file_or_set(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_benchmark(tmp_path / "gone.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match=r"broken\.json: not a UTF-8 JSON file"):
        load_benchmark(tmp_path / "broken.json")
    path = write_benchmark(tmp_path / "benchmark.json")
    with pytest.raises(InputError, match="no set 'bioasq' \\(the file has: medqa, pubmedqa, mmlu\\)"):
        load_benchmark(path, ["medqa", "bioasq"])


def chunk(doc_id, title, content):
    """A MedRAG chunk row (src/data/*.py): contents = concat(title, content)."""
    return {"id": doc_id, "title": title, "content": content, "contents": f"{title}. {content}"}


def write_chunks(folder, name, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(json.dumps(r) for r in rows))  # MedRAG writes no final newline
    return folder


def medrag_corpora(root):
    write_chunks(root / "pubmed" / "chunk", "pubmed23n0001.jsonl", [
        chunk("PMID:1", "Aspirin and pain", "Aspirin relieves pain."), chunk("PMID:2", "Statins", "Lower LDL."),
    ])
    (root / "pubmed" / "chunk" / "pubmed23n0002.jsonl").write_text("")  # MedRAG leaves some files empty
    write_chunks(root / "textbooks", "Anatomy_Gray.jsonl", [
        chunk("Anatomy_Gray_0", "Anatomy_Gray", "The facial nerve exits the stylomastoid foramen."),
        {"id": "Anatomy_Gray_1", "title": "Anatomy_Gray", "contents": "Anatomy_Gray. The heart has four chambers."},
    ])
    return root


def prepare(*flags):
    return main(["prepare-data", *flags])


def test_medcorp_combines_sources_into_one_flashrag_corpus(tmp_path, capsys):
    root = medrag_corpora(tmp_path / "corpus")
    out = tmp_path / "data"
    assert prepare("--medcorp", f"pubmed={root / 'pubmed'}", "--medcorp", f"textbooks={root / 'textbooks'}",
                   "--out", str(out)) == 0
    lines = (out / MEDCORP_FILE).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["id"] for r in rows] == ["pubmed/PMID:1", "pubmed/PMID:2", "textbooks/Anatomy_Gray_0",
                                       "textbooks/Anatomy_Gray_1"]
    assert [r["source"] for r in rows] == ["pubmed", "pubmed", "textbooks", "textbooks"]
    passages = [row.passage for row in read_corpus(out / MEDCORP_FILE)]  # what build-index reads
    assert (passages[0].title, passages[0].text) == ("Aspirin and pain", "Aspirin relieves pain.")
    assert passages[3].text == "The heart has four chambers."  # contents only: the title prefix dropped
    assert "wrote 4 chunks" in capsys.readouterr().out
    assert prepare("--medcorp", f"pubmed={root / 'pubmed'}", "--out", str(out)) == 2  # owned output folder
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('{"id": "x", "title": "t"}', "needs a non-empty 'content'"),
        ('{"title": "t", "content": "c"}', "'id' must be"),
        ("{not json", "invalid JSON"),
    ],
)
def test_medcorp_bad_row_names_file_and_line_and_writes_nothing(tmp_path, capsys, row, message):
    folder = write_chunks(tmp_path / "textbooks", "book.jsonl", [chunk("b_0", "book", "fine")])
    with (folder / "book.jsonl").open("a") as f:
        f.write("\n" + row)
    out = tmp_path / "data"
    assert prepare("--medcorp", f"textbooks={folder}", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'book.jsonl'}:2" in err and message in err
    assert not (out / MEDCORP_FILE).exists() and not list(out.glob(".*"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--medcorp", "pubmed"], "expected NAME=DIR"),
        (["--medcorp", "pubmed=DIR", "--medcorp", "pubmed=DIR"], "pubmed: given twice"),
        (["--medcorp", "pubmed=/nonexistent"], "not a folder"),
        (["--medcorp", "pubmed=DIR", "--flashrag-root", "x"], "give one input"),
    ],
)
def test_medcorp_bad_flags(tmp_path, capsys, flags, message):
    folder = write_chunks(tmp_path / "pubmed", "a.jsonl", [chunk("PMID:1", "t", "c")])
    flags = [f.replace("DIR", str(folder)) for f in flags]
    assert prepare(*flags, "--out", str(tmp_path / "out")) == 2
    assert message in capsys.readouterr().err
