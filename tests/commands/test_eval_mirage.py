"""``eval --suite mirage``: the table's averages, the passage-free responses file, the judge contract, bad input,
and one run end to end (build-index over a small corpus, the tiny random policy, two checkpoints)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from bridge_ray.cli import main
from bridge_ray.commands.eval_mirage import response_row
from bridge_ray.data.mirage import ChoiceQuestion
from bridge_ray.evaluation import judge as judging
from bridge_ray.evaluation.judge import strip_passages
from bridge_ray.evaluation.mirage import Answered, mirage_markdown, summarize_mirage

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")
BENCHMARK = {
    "medqa": {
        "0000": {"question": "Which nerve exits the stylomastoid foramen?",
                 "options": {"A": "facial nerve", "B": "vagus nerve", "C": "optic nerve", "D": "trigeminal nerve"},
                 "answer": "A"},
        "0001": {"question": "Which drug lowers LDL cholesterol?",
                 "options": {"A": "aspirin", "B": "statin", "C": "insulin", "D": "heparin"}, "answer": "B"},
    },
    "pubmedqa": {"1": {"question": "Does aspirin relieve pain?", "options": {"A": "yes", "B": "no", "C": "maybe"},
                       "answer": "A"}},
    "bioasq": {"5c": {"question": "Has the heart four chambers?", "options": {"A": "yes", "B": "no"}, "answer": "A"}},
}


def test_macro_weights_sets_micro_weights_questions():
    row = summarize_mirage("ckpt", {
        "medqa": [Answered(True, True, 4), Answered(True, True, 2)],  # acc 100, reasoning (100 + 50) / 2 = 75
        "medmcqa": [Answered(c, True, s) for c, s in [(True, 1), (True, None)] + [(False, 0)] * 6],  # 25; 25/7
    })
    assert [s.accuracy for s in row.sets] == [100.0, 25.0]
    assert row.macro_accuracy == pytest.approx(62.5)  # (100 + 25) / 2
    assert row.micro_accuracy == pytest.approx(40.0)  # 4 of 10 questions
    assert row.sets[1].reasoning == pytest.approx(25 / 7) and row.sets[1].unscored == 1
    assert row.macro_reasoning == pytest.approx((75 + 25 / 7) / 2)
    assert row.micro_reasoning == pytest.approx(25 * (4 + 2 + 1) / 9)  # the 9 scored judgments
    table = mirage_markdown([row])
    assert "| checkpoint | MedQA | MedMCQA | Macro Avg. | Micro Avg. |" in table
    assert "| ckpt | 75.00 (100.00) | 3.57 (25.00) | 39.29 (62.50) | 19.44 (40.00) |" in table
    assert "medmcqa 1" in table  # unscored judgments are counted, not scored 0
    plain = summarize_mirage("ckpt", {"medqa": [Answered(True), Answered(False)]})
    assert plain.macro_reasoning is None and "| ckpt | 50.00 | 50.00 | 50.00 |" in mirage_markdown([plain])


def test_responses_never_hold_passage_text():
    question = ChoiceQuestion("medqa", "0000", "Which nerve?", {"A": "facial", "B": "vagus"}, "A")
    text = (
        "<think>the nerve</think><search> stylomastoid foramen </search>\n\n<information>Doc 1(Title: Gray) SECRET "
        "passage</information>\n\n<search> again </search>\n\n<information>Doc 1(Title: X) cut SECRET"
    )
    row = response_row(question, text + "</information><answer> (A) </answer>", "(A)")
    assert "SECRET" not in row["response"] and "Doc 1" not in row["response"]
    assert row["response"].startswith("<think>the nerve</think>") and row["response"].endswith("<answer> (A) </answer>")
    assert (row["prediction"], row["correct"]) == ("A", True)
    assert "SECRET" not in strip_passages(text)  # an unclosed block is removed to the end


def fake_checkpoint(folder: Path, policy: Path | None = None) -> Path:
    """A checkpoint as ``train`` writes it: policy/ (an HF model) and a manifest listing every file whole."""
    if policy is None:
        (folder / "policy").mkdir(parents=True)
        (folder / "policy" / "config.json").write_text("{}\n")
    else:
        shutil.copytree(policy, folder / "policy")
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / "manifest.json").write_text(json.dumps({"round": 1, "policy_version": 1, "retriever_version": 0,
                                                       "files": files}))
    return folder


@dataclass(frozen=True)
class Judgment:
    score: int | None
    status: str


@pytest.fixture
def contract_judge(monkeypatch):
    """``bridge_ray.evaluation.judge`` as its contract states it: scores 4 a response naming the reference letter,
    else no score; records every item it was given."""
    seen = []

    @dataclass(frozen=True)
    class JudgeItem:
        question: str
        options: dict
        reference: str
        response: str

    def judge_items(items, backend, cache_dir, concurrency):
        assert backend == "backend-openai" and isinstance(cache_dir, Path) and concurrency == 8
        seen.extend(items)
        return [Judgment(4, "ok") if f"<answer> {i.reference[0]}" in i.response else Judgment(None, "unparseable")
                for i in items]

    monkeypatch.setattr(judging, "JudgeItem", JudgeItem)
    monkeypatch.setattr(judging, "judge_items", judge_items)
    monkeypatch.setattr(judging, "judge_cache_dir", lambda config: Path("judge-cache"))
    monkeypatch.setattr(judging, "judge_backend_from_config", lambda config, kind: f"backend-{kind}")
    return seen


def canned_generate(target, questions):
    """Each checkpoint answers every question with the option letter its label names (no model)."""
    letter = target.label[-1]
    return {name: [response_row(q, f"<information>PASSAGE</information><answer> {letter} </answer>", letter)
                   for q in qs] for name, qs in questions.items()}


def test_two_checkpoints_judged_through_the_contract(tmp_path, monkeypatch, capsys, contract_judge):
    monkeypatch.setattr("bridge_ray.commands.eval_mirage.generate", canned_generate)
    benchmark = tmp_path / "benchmark.json"
    benchmark.write_text(json.dumps(BENCHMARK))
    ckpt = fake_checkpoint(tmp_path / "round-1")
    out = tmp_path / "out"
    args = ["eval", "--suite", "mirage", "--benchmark", str(benchmark), "--config", LOCAL_CPU, "--judge", "openai",
            "--checkpoint", f"pick-A={ckpt}", "--checkpoint", f"pick-B={ckpt}", "--out", str(out)]
    assert main(args) == 0
    rows = json.loads((out / "mirage.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["pick-A", "pick-B"]
    assert [s["accuracy"] for s in rows[0]["sets"]] == [50.0, 100.0, 100.0]  # medqa, pubmedqa, bioasq
    assert rows[0]["micro_accuracy"] == 75.0 and rows[0]["macro_accuracy"] == pytest.approx(250 / 3)
    assert rows[0]["sets"][0]["reasoning"] == 100.0 and rows[0]["sets"][0]["unscored"] == 1
    assert all("PASSAGE" not in item.response for item in contract_judge)  # the judge never sees passages
    assert contract_judge[0].reference == "A" and contract_judge[0].options["B"] == "vagus nerve"
    judged = [json.loads(line) for line in (out / "pick-B" / "judgments.jsonl").read_text().splitlines()]
    assert judged[1] == {"set": "medqa", "id": "0001", "score": 4, "status": "ok"}
    assert "| pick-A | 100.00 (50.00) |" in (out / "mirage.md").read_text()
    assert main(args) == 2 and "--overwrite" in capsys.readouterr().err  # owned output folder


def test_a_run_that_fails_half_way_leaves_no_partial_files(tmp_path, monkeypatch, contract_judge):
    """The second checkpoint's engine fails after the first one's responses were generated: --out is not created;
    under --overwrite, an earlier run's files there keep their bytes."""
    def second_fails(target, questions):
        if target.label == "pick-B":
            raise RuntimeError("the engine ran out of memory")
        return canned_generate(target, questions)

    benchmark = tmp_path / "benchmark.json"
    benchmark.write_text(json.dumps(BENCHMARK))
    ckpt = fake_checkpoint(tmp_path / "round-1")
    out = tmp_path / "runs" / "out"
    args = ["eval", "--suite", "mirage", "--benchmark", str(benchmark), "--config", LOCAL_CPU, "--judge", "openai",
            "--checkpoint", f"pick-A={ckpt}", "--checkpoint", f"pick-B={ckpt}", "--out", str(out)]
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.setattr("bridge_ray.commands.eval_mirage.generate", second_fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        main(args)
    assert sorted(tmp_path.rglob("*")) == before  # no --out, no temporary folder, no lock

    monkeypatch.setattr("bridge_ray.commands.eval_mirage.generate", canned_generate)
    assert main(args) == 0
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr("bridge_ray.commands.eval_mirage.generate", second_fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        main([*args, "--overwrite"])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    assert [p.name for p in out.parent.iterdir()] == ["out"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sets", "medqa,nope"], "no set 'nope'"),
        (["--max-questions", "0"], "--max-questions 0"),
        (["--checkpoint", "CKPT", "--checkpoint", "CKPT"], "two checkpoints are labelled 'round-1'"),
        (["--checkpoint", "a/b=CKPT"], "LABEL=DIR"),
        (["--data", "x=y.jsonl"], "--data: not with --suite mirage"),
        (["eval.oracle_retrieval=true"], "eval.oracle_retrieval: MIRAGE's questions name no gold passages"),
    ],
)
def test_bad_input_before_any_model_loads(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.setattr("bridge_ray.commands.eval_mirage.generate", pytest.fail)
    benchmark = tmp_path / "benchmark.json"
    benchmark.write_text(json.dumps(BENCHMARK))
    ckpt = str(fake_checkpoint(tmp_path / "round-1"))
    flags = [f.replace("CKPT", ckpt) for f in flags]
    args = ["eval", "--suite", "mirage", "--benchmark", str(benchmark), "--config", LOCAL_CPU, "--judge", "none"]
    assert main([*args, *flags, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_qa_suite_refuses_mirage_flags(capsys):
    assert main(["eval", "--benchmark", "b.json"]) == 2
    assert "--benchmark: only with --suite mirage" in capsys.readouterr().err


CORPUS = [
    ("textbooks/Anatomy_Gray_0", "Anatomy_Gray", "The facial nerve exits the skull through the stylomastoid foramen."),
    ("pubmed/PMID:1", "Statins", "Statins lower LDL cholesterol."),
    ("pubmed/PMID:2", "Aspirin and pain", "Aspirin relieves mild pain."),
    ("textbooks/Physiology_0", "Physiology", "The human heart has four chambers."),
]


@pytest.mark.slow  # builds a MiniLM index and runs the tiny policy twice (and the packaged Gemma as local judge)
@pytest.mark.parametrize("judge", ["none", "local"])
def test_end_to_end_on_a_tiny_index(tmp_path, tiny_policy, capsys, judge):
    corpus = tmp_path / "medcorp.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{c}', "source": i.split("/")[0]}) + "\n"
                              for i, t, c in CORPUS))
    index = tmp_path / "index"
    assert main(["build-index", "--corpus", str(corpus), "--out", str(index), "--shards", "1", "--no-progress"]) == 0
    benchmark = tmp_path / "benchmark.json"
    benchmark.write_text(json.dumps(BENCHMARK))
    first, second = fake_checkpoint(tmp_path / "a" / "round-1", tiny_policy), tmp_path / "b" / "round-1"
    shutil.copytree(first, second)
    out = tmp_path / "out"
    assert main([
        "eval", "--suite", "mirage", "--benchmark", str(benchmark), "--sets", "medqa,bioasq", "--judge", judge,
        "--checkpoint", f"bridge={first}", "--checkpoint", f"fixed={second}", "--out", str(out), "--config", LOCAL_CPU,
        f"retrieval.index.dir={index}", "retrieval.index.num_shards=1", "algorithm.retriever.num_candidates=3",
        "rollout.max_response_length=96", "rollout.max_action_length=24", "rollout.max_observation_length=64",
        "judge.max_tokens=48", f"judge.cache_dir={tmp_path / 'judge-cache'}",
    ]) == 0
    for label in ("bridge", "fixed"):
        rows = [json.loads(line) for line in (out / label / "responses.jsonl").read_text().splitlines()]
        assert [(r["set"], r["id"]) for r in rows] == [("medqa", "0000"), ("medqa", "0001"), ("bioasq", "5c")]
        assert set(rows[0]) == {"set", "id", "question", "options", "answer", "response", "prediction", "correct"}
        assert all(c not in r["response"] for r in rows for _, _, c in CORPUS)  # no passage text
        assert all(r["correct"] == (r["prediction"] == r["answer"]) for r in rows)
    table = json.loads((out / "mirage.json").read_text())["rows"]
    assert [r["label"] for r in table] == ["bridge", "fixed"] and [s["count"] for s in table[0]["sets"]] == [2, 1]
    assert "| bridge |" in (out / "mirage.md").read_text() and "MedQA | BioASQ" in capsys.readouterr().out
    judged = out / "bridge" / "judgments.jsonl"
    assert judged.is_file() == (judge == "local")
    if judge == "local":  # every question has a verdict; a set's scored + unscored counts them all
        assert len(judged.read_text().splitlines()) == 3
        assert [s["scored"] + s["unscored"] for s in table[0]["sets"]] == [2, 1]
