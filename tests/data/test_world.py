"""The synthetic world: deterministic, well-formed, answerable from its gold passages, cached atomically."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_ray.cache import MARKER
from bridge_ray.cli import main
from bridge_ray.data.world import (
    DEFAULT_SIZE,
    QUESTION_TYPES,
    SMALL_SIZE,
    SPLITS,
    WORLD_FILES,
    WorldSize,
    generate_world,
    load_split,
    world_dir,
)
from bridge_ray.retrieval.corpus import passage_from_row


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, size=DEFAULT_SIZE)


def test_same_seed_same_world_other_seed_other_world(world):
    again = generate_world(seed=0, size=DEFAULT_SIZE)
    assert again.corpus == world.corpus and again.splits == world.splits
    assert generate_world(seed=1, size=SMALL_SIZE).corpus != generate_world(seed=0, size=SMALL_SIZE).corpus


def test_world_does_not_depend_on_the_process_hash_seed(world):
    script = "import json, sys; from bridge_ray.data.world import generate_world; w = generate_world(0); " \
             "sys.stdout.write(json.dumps([w.corpus, w.splits]))"
    repo = Path(__file__).resolve().parents[2]  # this checkout's bridge_ray, not an installed one
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=repo,
                         env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(repo)}).stdout
    assert json.loads(out) == [world.corpus, world.splits]


def test_default_size_fits_a_cpu(world):
    assert 2000 <= len(world.corpus) <= 5000
    assert {s: len(q) for s, q in world.splits.items()} == {"train": 1600, "dev": 300, "test": 300}


def test_formats_ids_and_question_types(world):
    assert [row["id"] for row in world.corpus] == [str(i) for i in range(len(world.corpus))]
    for row in world.corpus:
        assert set(row) == {"id", "contents"} and row["contents"].startswith('"')
        assert passage_from_row(row).text
    questions = [q for split in world.splits.values() for q in split]
    assert len({q["id"] for q in questions}) == len(questions)  # unique across splits
    assert len({q["question"] for q in questions}) == len(questions)
    counts = {t: sum(q["metadata"]["type"] == t for q in questions) for t in QUESTION_TYPES}
    assert all(c > 0.2 * len(questions) for c in counts.values()), counts
    for q in questions:
        assert set(q) == {"id", "question", "golden_answers", "metadata"} and q["golden_answers"]
        hops = 1 if q["metadata"]["type"] == "single" else 2
        assert len(q["metadata"]["gold_doc_ids"]) == hops


def test_answers_are_in_the_gold_passages(world):
    text = {row["id"]: row["contents"] for row in world.corpus}
    title = {row["id"]: passage_from_row(row).title for row in world.corpus}
    for q in (q for split in world.splits.values() for q in split):
        gold, answer, kind = q["metadata"]["gold_doc_ids"], q["golden_answers"][0], q["metadata"]["type"]
        if kind == "single":
            assert answer in text[gold[0]], q
        elif kind == "two_hop":  # hop 1 names the bridge entity, hop 2 is about it and holds the answer
            assert title[gold[1]] in text[gold[0]] and title[gold[1]] not in q["question"], q
            assert answer in text[gold[1]], q
        else:  # both compared entities are named in the question; each passage is about one of them
            assert all(title[g] in q["question"] for g in gold), q
            assert answer in ("yes", "no") or answer in (title[gold[0]], title[gold[1]]), q


def test_near_duplicates_and_paraphrased_questions(world):
    titles = sorted({passage_from_row(row).title for row in world.corpus})

    def one_letter_apart(a, b):
        return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1

    by_length = {}
    for t in titles:
        by_length.setdefault(len(t), []).append(t)
    pairs = sum(
        one_letter_apart(a, b) for group in by_length.values() for i, a in enumerate(group) for b in group[i + 1 :]
    )
    assert pairs > 0.1 * len(titles)
    # Questions do not copy the passages' wording: e.g. no "born in" / "joined the" in single-hop questions.
    singles = [q["question"] for q in world.splits["train"] if q["metadata"]["type"] == "single"]
    assert not any(re.search(r"born in|joined the|was established in|lies on", q) for q in singles)


def test_world_dir_is_generated_once_and_reused(tmp_path):
    first = world_dir(seed=3, size=SMALL_SIZE, root=tmp_path)
    stamp = (first / "corpus.jsonl").stat().st_mtime_ns
    assert world_dir(seed=3, size=SMALL_SIZE, root=tmp_path) == first
    assert (first / "corpus.jsonl").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, f"{first.name}.lock"]  # no temp dirs left
    assert world_dir(seed=3, size=WorldSize(people=70, train=10, dev=5, test=5), root=tmp_path) != first
    assert len(load_split(first, "dev")) == SMALL_SIZE.dev
    with pytest.raises(ValueError, match="unknown split"):
        load_split(first, "validation")


def test_world_dir_regenerates_a_world_left_unfinished(tmp_path):
    first = world_dir(seed=3, size=SMALL_SIZE, root=tmp_path)
    (first / MARKER).unlink()  # an interrupted generation: no marker, a file missing
    (first / "dev.jsonl").unlink()
    assert world_dir(seed=3, size=SMALL_SIZE, root=tmp_path) == first
    assert all((first / name).is_file() for name in (*WORLD_FILES, MARKER))


def test_make_world_command_writes_the_files(tmp_path, capsys):
    assert main(["make-world", "--out", str(tmp_path / "w"), "--size", "small", "--seed", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == 2
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [
        "corpus.jsonl", "dev.jsonl", "test.jsonl", "train.jsonl", "world.json"]
    corpus = (tmp_path / "w/corpus.jsonl").read_text().splitlines()
    assert corpus == [json.dumps(r, ensure_ascii=False) for r in generate_world(2, SMALL_SIZE).corpus]


def _digest(world) -> str:
    """sha256 of the world's rows as ``write_world`` serialises them (corpus, then train, dev, test)."""
    h = hashlib.sha256()
    for rows in [world.corpus, *(world.splits[s] for s in SPLITS)]:
        for row in rows:
            h.update((json.dumps(row, ensure_ascii=False) + "\n").encode())
    return h.hexdigest()


def test_default_world_is_unchanged(world):
    # Digests of the default worlds as generated before the phrasing option existed: cached worlds and the
    # indexes built on them stay valid only while these hold. Changing the default world means bumping
    # GENERATOR_VERSION (and these digests).
    assert _digest(world) == "c5710afd6a51bb5e2a908d41e7187d9ef8e07b0317571fddbfbce0922b0a5eaa"
    assert _digest(generate_world(0, SMALL_SIZE)) == "94341642a132a2d4612eff13d91b8fb37fcb3d155471efb1a99a73b0efc46e20"
    assert world.phrasing == "default"
    assert generate_world(0, SMALL_SIZE, "default").splits == generate_world(0, SMALL_SIZE).splits


@pytest.fixture(scope="module")
def paraphrased():
    return generate_world(seed=0, size=DEFAULT_SIZE, phrasing="paraphrase")


def test_paraphrase_world_asks_the_same_facts_in_other_words(world, paraphrased):
    assert paraphrased.phrasing == "paraphrase" and paraphrased.corpus == world.corpus
    default_rows = [q for split in SPLITS for q in world.splits[split]]
    rows = [q for split in SPLITS for q in paraphrased.splits[split]]
    assert [{k: v for k, v in q.items() if k != "question"} for q in rows] == [
        {k: v for k, v in q.items() if k != "question"} for q in default_rows
    ]  # same ids, answers, types and gold passages, in the same order
    questions = {q["question"] for q in rows}
    assert len(questions) == len(rows) and not questions & {q["question"] for q in default_rows}
    # The paraphrases keep the lexical gap to the passages, and name what they must name.
    singles = [q["question"] for q in rows if q["metadata"]["type"] == "single"]
    assert not any(re.search(r"born in|joined the|was established in|lies on", q) for q in singles)
    title = {row["id"]: passage_from_row(row).title for row in paraphrased.corpus}
    for q in rows:
        gold, kind = q["metadata"]["gold_doc_ids"], q["metadata"]["type"]
        if kind == "two_hop":
            assert title[gold[1]] not in q["question"], q
        elif kind == "comparison":
            assert all(title[g] in q["question"] for g in gold), q


def test_the_alternate_wording_asks_the_same_questions_in_words_of_its_own(world, paraphrased):
    """The third wording, which the warm-up may train on beside the default (warmup.phrasings): the same rows but
    for the text, and no text shared with the default or with the paraphrase (the wording kept unseen)."""
    alternate = generate_world(seed=0, size=DEFAULT_SIZE, phrasing="alternate")
    assert alternate.corpus == world.corpus
    rows = {split: alternate.splits[split] for split in SPLITS}
    for split in SPLITS:
        assert [{k: v for k, v in q.items() if k != "question"} for q in rows[split]] == [
            {k: v for k, v in q.items() if k != "question"} for q in world.splits[split]
        ]
    texts = {q["question"] for split in SPLITS for q in rows[split]}
    assert len(texts) == sum(len(r) for r in rows.values())
    for other in (world, paraphrased):
        assert not texts & {q["question"] for split in SPLITS for q in other.splits[split]}


def test_paraphrase_world_is_deterministic(paraphrased):
    again = generate_world(seed=0, size=DEFAULT_SIZE, phrasing="paraphrase")
    assert again.splits == paraphrased.splits and again.corpus == paraphrased.corpus
    other = generate_world(seed=1, size=SMALL_SIZE, phrasing="paraphrase")
    assert other.splits != generate_world(seed=0, size=SMALL_SIZE, phrasing="paraphrase").splits
    with pytest.raises(ValueError, match="unknown phrasing"):
        generate_world(seed=0, size=SMALL_SIZE, phrasing="casual")


def test_each_phrasing_has_its_own_world_dir(tmp_path):
    default = world_dir(seed=3, size=SMALL_SIZE, root=tmp_path)
    assert default == world_dir(seed=3, size=SMALL_SIZE, root=tmp_path, phrasing="default")
    assert re.fullmatch(r"world-default-v\d+-seed3-[0-9a-f]{16}", default.name)
    paraphrase = world_dir(seed=3, size=SMALL_SIZE, root=tmp_path, phrasing="paraphrase")
    assert paraphrase != default and re.fullmatch(r"world-default-v\d+-seed3-[0-9a-f]{16}", paraphrase.name)
    assert (paraphrase / "corpus.jsonl").read_bytes() == (default / "corpus.jsonl").read_bytes()
    assert (paraphrase / "dev.jsonl").read_text() != (default / "dev.jsonl").read_text()
    assert "phrasing" not in json.loads((default / "world.json").read_text())
    assert json.loads((paraphrase / "world.json").read_text())["phrasing"] == "paraphrase"


def test_make_world_command_takes_a_phrasing(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["make-world", "--out", str(out), "--size", "small", "--seed", "2", "--phrasing", "paraphrase"]) == 0
    assert json.loads(capsys.readouterr().out)["phrasing"] == "paraphrase"
    assert load_split(out, "test") == generate_world(2, SMALL_SIZE, "paraphrase").splits["test"]


def test_make_world_refuses_a_taken_folder_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "w"
    args = ["make-world", "--out", str(out), "--size", "small"]
    assert main([*args, "--seed", "2"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*args, "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert f"error: {out} already holds a world (corpus.jsonl, dev.jsonl, test.jsonl, …)" in err
    assert "pass --overwrite to write over it" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "index").mkdir()  # e.g. build-index --out w/index: not the world's, so kept by --overwrite
    assert main([*args, "--seed", "3", "--overwrite"]) == 0
    assert json.loads((out / "world.json").read_text())["seed"] == 3 and (out / "index").is_dir()
    assert load_split(out, "dev") == generate_world(3, SMALL_SIZE).splits["dev"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]  # no staging folder left beside it


def test_make_world_refuses_a_folder_of_other_files_or_a_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["make-world", "--out", str(tmp_path), "--size", "small"]) == 2
    assert f"error: {tmp_path} already holds files that are not a world (notes.txt)" in capsys.readouterr().err
    assert main(["make-world", "--out", str(tmp_path / "notes.txt"), "--size", "small"]) == 2
    assert f"error: --out {tmp_path / 'notes.txt'}: is a file, not a folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_failed_make_world_leaves_nothing_behind(tmp_path, monkeypatch):
    import bridge_ray.data.world as world_module

    def disk_full(path, rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(world_module, "_write_jsonl", disk_full)
    with pytest.raises(OSError, match="No space left"):
        main(["make-world", "--out", str(tmp_path / "w"), "--size", "small"])
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a staging copy: the retry starts clean
