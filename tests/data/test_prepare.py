"""``prepare-data``: FlashRAG roots and Search-R1 / verl-tool parquet files, written the way their tools write
them, round-tripped into the presets' layout and read back with the real loader."""

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.data.prepare import LAYOUT, TRAIN_FILE
from bridge_ray.data.qa import load_questions

REPO = Path(__file__).resolve().parents[2]
EVAL_SPLITS = {"nq": "test", "triviaqa": "test", "popqa": "test", "hotpotqa": "dev", "2wikimultihopqa": "dev",
               "musique": "dev", "bamboogle": "test"}
ALL_FILES = {TRAIN_FILE, *(f"{name}_{split}.jsonl" for name, split in EVAL_SPLITS.items())}
SEARCH_R1_PREFIX = (  # Search-R1's make_prefix(template_type="base"), shortened in the middle
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. ... For example, <answer> Beijing </answer>. Question: "
)


def flashrag_rows(name, split, n):
    return [{"id": f"{split}_{i}", "question": f"{name} {split} question {i}", "golden_answers": [f"{name}-{i}", "alt"],
             "metadata": {"hops": i}} for i in range(n)]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def searchr1_rows(source, split, rows):
    """Search-R1's qa_search_*_merge.py rows: datasets.map keeps FlashRAG's columns and adds verl's."""
    return [{**row, "question": row["question"] + "?", "data_source": source,
             "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX + row["question"] + "?\n"}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": row["golden_answers"]}},
             "extra_info": {"split": split, "index": index}} for index, row in enumerate(rows)]


def verl_tool_frame(rows):
    """verl-tool's examples/data_preprocess/search_r1.py applied to Search-R1 rows: a pandas frame, no id."""
    return pd.DataFrame([{
        "data_source": "searchR1_" + row["data_source"],
        "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                   {"role": "user", "content": SEARCH_R1_PREFIX + row["question"]}],
        "ability": row["ability"], "reward_model": row["reward_model"],
        "extra_info": {"index": index, "need_tools_kwargs": True, "question": row["question"],
                       "split": row["extra_info"]["split"]},
    } for index, row in enumerate(rows)])


@pytest.fixture
def flashrag_root(tmp_path):
    """Two data sets, as FlashRAG_datasets lays them out: nq/{train,test}, hotpotqa/{train,dev}."""
    root = tmp_path / "flashrag"
    for name, split, n in [("nq", "train", 3), ("nq", "test", 2), ("hotpotqa", "train", 2), ("hotpotqa", "dev", 2)]:
        write_jsonl(root / name / f"{split}.jsonl", flashrag_rows(name, split, n))
    return root


@pytest.fixture
def searchr1_files(tmp_path):
    """Search-R1's train.parquet (NQ + HotpotQA) and test.parquet (the seven eval sets, plus one no preset reads)."""
    train = [*searchr1_rows("nq", "train", flashrag_rows("nq", "train", 3)),
             *searchr1_rows("hotpotqa", "train", flashrag_rows("hotpotqa", "train", 2))]
    test = [row for name, split in [*EVAL_SPLITS.items(), ("strategyqa", "train")]
            for row in searchr1_rows(name, "test", flashrag_rows(name, split, 2))]
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(test), tmp_path / "test.parquet")
    return tmp_path / "train.parquet", tmp_path / "test.parquet"


def prepare(*args):
    return main(["prepare-data", *map(str, args)])


def test_flashrag_root_round_trip(flashrag_root, tmp_path, capsys):
    out = tmp_path / "data"
    assert prepare("--flashrag-root", flashrag_root, "--out", out, "--allow-missing") == 0
    assert {p.name for p in out.iterdir()} == {TRAIN_FILE, "nq_test.jsonl", "hotpotqa_dev.jsonl"}
    train = load_questions([out / TRAIN_FILE])
    assert [r.uid for r in train] == ["nq/train_0", "nq/train_1", "nq/train_2", "hotpotqa/train_0", "hotpotqa/train_1"]
    assert (train[3].question, train[3].golden_answers) == ("hotpotqa train question 0", ["hotpotqa-0", "alt"])
    for name, split in [("nq", "test"), ("hotpotqa", "dev")]:
        rows = [json.loads(line) for line in (out / f"{name}_{split}.jsonl").read_text().splitlines()]
        assert rows == flashrag_rows(name, split, 2), "eval sets are copied row for row"
        assert [r.uid for r in load_questions([out / f"{name}_{split}.jsonl"])] == [
            f"data/{name}_{split}/{split}_0", f"data/{name}_{split}/{split}_1"]
    printed = capsys.readouterr().out
    assert f"wrote 4 question sets to {out}" in printed
    assert "  nq/train (nq_hotpotqa_train.parquet)             3 questions  (from " in printed
    assert "  hotpotqa/dev (hotpotqa_dev.jsonl)                2 questions  (from " in printed
    assert f"missing: triviaqa/test (triviaqa_test.jsonl): no {flashrag_root / 'triviaqa' / 'test.jsonl'}" in printed


def test_missing_sets_are_an_error_listing_them(flashrag_root, tmp_path, capsys):
    out = tmp_path / "data"
    assert prepare("--flashrag-root", flashrag_root, "--out", out) == 2
    err = capsys.readouterr().err
    assert "question sets missing (--allow-missing writes the others)" in err
    for name in ("triviaqa", "popqa", "2wikimultihopqa", "musique", "bamboogle"):
        assert f"{name}/{EVAL_SPLITS[name]} ({name}_{EVAL_SPLITS[name]}.jsonl): no {flashrag_root / name}" in err
    assert "nq/test" not in err and not out.exists()


def test_searchr1_parquet_round_trip_fills_every_preset(searchr1_files, tmp_path, capsys):
    train, test = searchr1_files
    out = tmp_path / "data"
    assert prepare("--searchr1-train", train, "--searchr1-test", test, "--out", out) == 0
    assert {p.name for p in out.iterdir()} == ALL_FILES, "nothing else, no temporary files"
    assert [r.uid for r in load_questions([out / TRAIN_FILE])] == [
        "nq/train_0", "nq/train_1", "nq/train_2", "hotpotqa/train_0", "hotpotqa/train_1"]
    musique = load_questions([out / "musique_dev.jsonl"])
    assert [(r.question, r.golden_answers) for r in musique] == [
        ("musique dev question 0?", ["musique-0", "alt"]), ("musique dev question 1?", ["musique-1", "alt"])]
    printed = capsys.readouterr().out
    assert "wrote 9 question sets" in printed
    assert "bamboogle/test (bamboogle_test.jsonl)            2 questions" in printed
    assert f"left out (no preset reads it): strategyqa: 2 questions of {test}" in printed
    assert ("training mix nq_hotpotqa_train.parquet: 5 questions = nq 3 (paper 79,168) + hotpotqa 2 "
            "(paper 90,447); the paper's: 169,615") in printed
    training = [p for p in (REPO / "jobs" / "configs").glob("qwen2.5-*.yaml") if not p.stem.endswith("-eval")]
    for preset in sorted(training):  # the medical eval preset reads MIRAGE's benchmark.json instead
        data = load_config(preset).data
        assert {Path(p).name for p in [*data.train, *data.eval.values()]} == ALL_FILES, preset.name
        assert {Path(p).parent for p in [*data.train, *data.eval.values()]} == {REPO / "data"}, preset.name


def test_verl_tool_parquet_round_trip(searchr1_files, tmp_path):
    sources = []
    for path in searchr1_files:  # verl-tool rewrites Search-R1's files: tagged data_source, system prompt, no id
        verl_tool_frame(pq.read_table(path).to_pylist()).to_parquet(tmp_path / f"vt-{path.name}", index=False)
        sources.append(tmp_path / f"vt-{path.name}")
    out = tmp_path / "data"
    assert prepare("--searchr1-train", sources[0], "--searchr1-test", sources[1], "--out", out) == 0
    train = load_questions([out / TRAIN_FILE])
    assert [r.uid for r in train] == ["nq/train-0", "nq/train-1", "nq/train-2", "hotpotqa/train-3", "hotpotqa/train-4"]
    assert train[0].question == "nq train question 0?" and train[0].golden_answers == ["nq-0", "alt"]
    assert [r.question for r in load_questions([out / "popqa_test.jsonl"])] == [
        "popqa test question 0?", "popqa test question 1?"]


def test_out_is_owned_like_the_other_commands(flashrag_root, tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["--flashrag-root", flashrag_root, "--out", out, "--allow-missing"]
    assert prepare(*args) == 2
    err = capsys.readouterr().err
    assert f"{out} already holds files (notes.txt); choose another --out, or pass --overwrite" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert prepare(*args, "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "nq_test.jsonl").is_file()
    assert prepare("--flashrag-root", flashrag_root, "--out", out / "notes.txt", "--overwrite") == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_older_file_of_a_missing_set_is_pointed_out(flashrag_root, tmp_path, capsys):
    out = tmp_path / "data"
    write_jsonl(out / "popqa_test.jsonl", flashrag_rows("popqa", "test", 1))
    assert prepare("--flashrag-root", flashrag_root, "--out", out, "--allow-missing", "--overwrite") == 0
    assert "popqa_test.jsonl): no " in (printed := capsys.readouterr().out)
    assert "(the popqa_test.jsonl there is an older one)" in printed


@pytest.mark.parametrize(
    "args",
    [[], ["--flashrag-root", "x", "--searchr1-test", "y"]],
    ids=["no input", "two inputs"],
)
def test_one_input_kind(tmp_path, capsys, args):
    assert prepare(*args, "--out", tmp_path / "data") == 2
    assert "give one input: --flashrag-root DIR, or --searchr1-train / --searchr1-test FILE" in capsys.readouterr().err


def test_bad_input_names_file_and_row_and_writes_nothing(flashrag_root, searchr1_files, tmp_path, capsys):
    out = tmp_path / "data"
    bad_line = flashrag_root / "hotpotqa" / "dev.jsonl"
    bad_line.write_text(bad_line.read_text() + '{"id": "x", "question": "q", "golden_answers": []}\n')
    assert prepare("--flashrag-root", flashrag_root, "--out", out, "--allow-missing") == 2
    assert f"{bad_line}:3: golden answers must be a non-empty list" in capsys.readouterr().err

    train, test = searchr1_files
    rows = pq.read_table(test).to_pylist()
    rows[5]["reward_model"] = {"ground_truth": {"target": []}}
    pq.write_table(pa.Table.from_pylist(rows), test)
    assert prepare("--searchr1-train", train, "--searchr1-test", test, "--out", out) == 2
    assert f"{test}: row 5: golden answers must be a non-empty list" in capsys.readouterr().err

    assert prepare("--searchr1-test", tmp_path / "gone.parquet", "--out", out, "--allow-missing") == 2
    assert f"--searchr1-test {tmp_path / 'gone.parquet'}: no such file" in capsys.readouterr().err
    assert prepare("--flashrag-root", tmp_path / "nowhere", "--out", out) == 2
    assert f"--flashrag-root {tmp_path / 'nowhere'}: not a folder" in capsys.readouterr().err
    assert not out.exists()


def test_layout_is_the_presets_sets():
    assert {(q.name, q.split) for q in LAYOUT if q.file_name == TRAIN_FILE} == {("nq", "train"), ("hotpotqa", "train")}
    assert {(q.name, q.split) for q in LAYOUT if q.file_name != TRAIN_FILE} == set(EVAL_SPLITS.items())


def test_prepared_files_keep_the_umask_mode_so_other_users_pods_can_read_them(searchr1_files, tmp_path):
    train, test = searchr1_files
    out = tmp_path / "shared" / "data"
    old = os.umask(0o022)
    try:
        assert prepare("--searchr1-train", train, "--searchr1-test", test, "--out", out) == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out.parent, out, *out.iterdir()]}
    assert modes == dict.fromkeys(modes, 0o755) | {name: 0o644 for name in ALL_FILES}
