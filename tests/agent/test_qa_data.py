import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge_ray.data.qa import DataError, load_flashrag_jsonl, load_questions, load_searchr1_parquet


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def searchr1_row(source, index, question, target, split="train"):
    prompt = f"Answer the given question. ... Question: {question}\n"
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": split, "index": index},
    }


def test_flashrag_jsonl_and_world_format(tmp_path):
    path = write_jsonl(
        tmp_path / "world" / "train.jsonl",
        [
            {"id": "q1", "question": " Where was Ada born? ", "golden_answers": ["Valmora"],
             "metadata": {"type": "single_hop", "gold_doc_ids": [0]}},
            {"id": 7, "question": "Which is older?", "golden_answers": ["Kessington", "Kessington University"]},
        ],
    )
    records = load_flashrag_jsonl(path)
    assert [r.uid for r in records] == ["world/train/q1", "world/train/7"]
    assert records[0].question == "Where was Ada born?" and records[0].golden_answers == ["Valmora"]
    assert records[0].metadata == {"type": "single_hop", "gold_doc_ids": [0]} and records[1].metadata == {}
    assert records[0].source == "world/train" and records[1].origin == f"{path}:2"
    assert load_flashrag_jsonl(path, source="nq")[0].uid == "nq/q1"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "invalid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "1", "question": "q"}', "missing key 'golden_answers'"),
        ('{"id": "1", "question": "", "golden_answers": ["a"]}', "question must be a non-empty string"),
        ('{"id": "1", "question": "q", "golden_answers": []}', "golden answers must be a non-empty list"),
        ('{"id": "1", "question": "q", "golden_answers": [3]}', "golden answers must be a non-empty list"),
        ('{"id": null, "question": "q", "golden_answers": ["a"]}', "id must be a string or an integer"),
        ('{"id": "1", "question": "q", "golden_answers": ["a"], "metadata": 3}', "metadata must be an object"),
        ('{"id": "0", "question": "q", "golden_answers": ["a"]}', "duplicate question uid 'd/f/0'"),
    ],
)
def test_bad_jsonl_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "d" / "f.jsonl"
    path.parent.mkdir()
    path.write_text('{"id": "0", "question": "ok", "golden_answers": ["a"]}\n' + line + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_flashrag_jsonl(path)
    assert f"{path}:2" in str(err.value)


def test_searchr1_parquet(tmp_path):
    rows = [
        searchr1_row("nq", 0, "who wrote hamlet?", ["William Shakespeare"]),
        searchr1_row("hotpotqa", 0, "which is older, a or b?", ["a"]),  # same per-source index as the nq row
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_searchr1_parquet(path)
    assert [r.uid for r in records] == ["nq/train-0", "hotpotqa/train-0"]
    assert records[0].question == "who wrote hamlet?" and records[0].golden_answers == ["William Shakespeare"]
    assert records[1].source == "hotpotqa" and records[1].metadata["extra_info"] == {"split": "train", "index": 0}

    with_ids = [{**r, "id": f"id{i}", "question": f"plain question {i}"} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(with_ids), tmp_path / "ids.parquet")
    records = load_searchr1_parquet(tmp_path / "ids.parquet")
    assert [r.uid for r in records] == ["nq/id0", "hotpotqa/id1"] and records[1].question == "plain question 1"


def test_bad_parquet_names_file_and_row(tmp_path):
    rows = [searchr1_row("nq", 0, "q0", ["a"]), searchr1_row("nq", 1, "q1", [])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: row 1: golden answers"):
        load_searchr1_parquet(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable parquet"):
        load_searchr1_parquet(tmp_path / "junk.parquet")
    rows = [searchr1_row("nq", 0, "q0", ["a"]), searchr1_row("nq", 0, "q0 again", ["b"])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dup.parquet")
    with pytest.raises(DataError, match=r"duplicate question uid 'nq/train-0' at .*dup\.parquet: row 1"):
        load_searchr1_parquet(tmp_path / "dup.parquet")


def test_mixture_gets_unique_uids(tmp_path):
    row = {"id": "0", "question": "q", "golden_answers": ["a"]}
    nq = write_jsonl(tmp_path / "nq" / "train.jsonl", [row])
    hotpot = write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", [row])
    pq.write_table(pa.Table.from_pylist([searchr1_row("nq", 0, "q", ["a"])]), tmp_path / "sr1.parquet")
    records = load_questions([nq, hotpot, tmp_path / "sr1.parquet"])
    assert [r.uid for r in records] == ["nq/train/0", "hotpotqa/train/0", "nq/train-0"]
    with pytest.raises(DataError, match="duplicate question uid 'nq/train/0'"):
        load_questions([nq, nq])
    with pytest.raises(DataError, match="unknown question file type"):
        load_questions([tmp_path / "x.csv"])


def test_non_utf8_line_names_file_and_line(tmp_path):
    path = tmp_path / "d" / "f.jsonl"
    path.parent.mkdir()
    good = '{"id": "0", "question": "ok", "golden_answers": ["a"]}\n'
    path.write_bytes((good + '{"id": "1", "question": "café?", "golden_answers": ["a"]}\n').encode("latin-1"))
    with pytest.raises(DataError, match=rf"{path}:2: not UTF-8 text \(byte 0xe9 at offset 28\)"):
        load_questions([path])


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "d" / "f.jsonl"
    path.parent.mkdir()
    row = '{{"id": "{}", "question": "q", "golden_answers": ["a"]}}\n'
    path.write_text(row.format(0) + "\n   \n" + row.format(1) + "\n")
    records = load_flashrag_jsonl(path)
    assert [r.origin for r in records] == [f"{path}:1", f"{path}:4"]


def test_data_errors_are_input_errors():
    from bridge_ray.errors import InputError

    assert issubclass(DataError, InputError)


VERL_TOOL_PREFIX = (  # verl-tool's examples/data_preprocess/search_r1.py, --prefix_type search_r1
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. ... For example, <answer> Beijing </answer>. Question: "
)


def verl_tool_row(index, source, question, target, with_question=True):
    """A row as verl-tool writes it: a pandas frame of system + user prompt, data_source tagged, no id column."""
    extra = {"index": index, "need_tools_kwargs": True, "split": "train",
             "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": {"target": target}}}}}
    return {
        "data_source": f"searchR1_{source}",
        "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                   {"role": "user", "content": VERL_TOOL_PREFIX + question}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {**extra, "question": question} if with_question else extra,
    }


def test_verl_tool_parquet(tmp_path):
    import pandas as pd

    rows = [verl_tool_row(0, "nq", "who wrote hamlet?", ["Shakespeare"]),
            verl_tool_row(1, "hotpotqa", "Question: which came first, a or b?", ["a"], with_question=False)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet", index=False)
    records = load_searchr1_parquet(tmp_path / "train.parquet")
    assert [(r.uid, r.source, r.question_id) for r in records] == [
        ("nq/train-0", "nq", "train-0"), ("hotpotqa/train-1", "hotpotqa", "train-1")]
    assert records[0].question == "who wrote hamlet?" and records[0].golden_answers == ["Shakespeare"]
    assert records[1].question == "Question: which came first, a or b?", "the first marker is the template's"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompt": [{"role": "user", "content": "no marker here"}]}, "user message has no 'Question:'"),
        ({"prompt": [{"role": "system", "content": "Question: x"}]}, "'prompt' holds no user message"),
        ({"prompt": [{"role": "user", "content": "Question:   "}]}, "text after 'Question:' in the prompt"),
        ({"data_source": "searchR1_"}, "data_source must be a non-empty string"),
        ({"reward_model": None}, r"no answers \(neither reward_model.ground_truth.target nor golden_answers\)"),
        ({"extra_info": None}, "neither an 'id' column nor extra_info.index"),
    ],
)
def test_bad_searchr1_rows_name_file_and_row(tmp_path, change, message):
    rows = [searchr1_row("nq", 0, "fine?", ["a"]), {**searchr1_row("nq", 1, "q?", ["a"]), **change}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=rf"bad\.parquet: row 1: .*{message}"):
        load_searchr1_parquet(tmp_path / "bad.parquet")


def test_answers_from_a_bare_ground_truth_or_golden_answers(tmp_path):
    bare = {**searchr1_row("nq", 0, "q?", []), "reward_model": {"ground_truth": ["x", "y"]}, "golden_answers": None}
    golden = {**searchr1_row("nq", 1, "q?", []), "reward_model": None, "golden_answers": ["z"]}
    pq.write_table(pa.Table.from_pylist([bare, golden]), tmp_path / "a.parquet")
    assert [r.golden_answers for r in load_searchr1_parquet(tmp_path / "a.parquet")] == [["x", "y"], ["z"]]


def test_flashrag_root_split_is_named_by_its_path_in_a_config(tmp_path, monkeypatch):
    from bridge_ray.config import load_config

    row = {"id": "test_0", "question": "q", "golden_answers": ["a"]}
    write_jsonl(tmp_path / "flashrag" / "nq" / "test.jsonl", [row])
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["data.eval.nq=flashrag/nq/test.jsonl", "data.train=[flashrag/nq/test.jsonl]"])
    assert config.data.eval["nq"] == config.data.train[0] == str(tmp_path / "flashrag" / "nq" / "test.jsonl")
    assert [r.uid for r in load_questions([config.data.eval["nq"]])] == ["nq/test/test_0"]
