"""``bench paired``: two arms' evaluation files, paired question by question."""

import json

from bridge_ray.cli import main


def write_eval(path, em, recall, uids=None):
    uids = uids or [f"q{i}" for i in range(len(em))]
    questions = {"gap_dev": {"uid": uids, "em": em, "recall": recall}}
    path.write_text(json.dumps({"rows": [], "m_avg": None, "avg": None, "questions": questions}))
    return str(path)


def test_paired_rows_difference_the_same_questions(tmp_path, capsys):
    base = write_eval(tmp_path / "before.json", [0, 0, 1, 1], [0.0, 0.5, 1.0, 0.5])
    treated = write_eval(tmp_path / "after.json", [1, 0, 1, 1], [1.0, 0.5, 1.0, 0.5])
    out = tmp_path / "paired.json"
    assert main(["bench", "paired", "--baseline", base, "--treated", treated, "--out", str(out)]) == 0
    [row] = json.loads(out.read_text())["paired"]
    assert row["set"] == "gap_dev" and row["questions"] == 4 and row["seeds"] == 1
    assert row["diff_em"] == 25.0 and row["diff_recall_at_3"] == 25.0
    assert row["ci_low"] <= 25.0 <= row["ci_high"]
    assert "| gap_dev | 4 | 1 | +25.0" in capsys.readouterr().out


def test_three_seeds_give_a_two_level_interval_and_each_seed_its_own(tmp_path, capsys):
    """Seeds that disagree (+0, +25, +75 EM): the pooled interval is over seeds and questions, and so marked;
    each seed's own difference is printed and kept, with its interval over questions."""
    base = [write_eval(tmp_path / f"before{s}.json", [0, 0, 1, 1], [0.5] * 4) for s in range(3)]
    treated = [write_eval(tmp_path / f"after{s}.json", em, [0.5] * 4)
               for s, em in enumerate(([0, 0, 1, 1], [1, 0, 1, 1], [1, 1, 1, 0]))]
    out = tmp_path / "paired.json"
    assert main(["bench", "paired", "--baseline", *base, "--treated", *treated, "--out", str(out)]) == 0
    [row] = json.loads(out.read_text())["paired"]
    assert row["seeds"] == 3 and row["interval"] == "seeds+questions" and row["diff_em"] == 16.67
    assert [s["diff_em"] for s in row["per_seed"]] == [0.0, 25.0, 25.0]
    printed = capsys.readouterr().out
    assert "| gap_dev | 4 | all 3 | +16.7 [" in printed and printed.count("| seeds+questions |") == 1
    assert "| gap_dev | 4 | 2 | +25.0 [" in printed and printed.count("| questions |\n") == 3
    assert main(["bench", "paired", "--baseline", *base[:2], "--treated", *treated[:2]]) == 0
    pooled = capsys.readouterr().out.splitlines()[2]  # two seeds: over questions only, and marked so
    assert pooled.startswith("| gap_dev | 4 | all 2 | +12.5 [") and pooled.endswith("| questions |")


def test_other_questions_or_unpaired_seeds_are_refused(tmp_path, capsys):
    base = write_eval(tmp_path / "before.json", [0, 1], [None, None])
    other = write_eval(tmp_path / "other.json", [1, 1], [None, None], uids=["q0", "x"])
    assert main(["bench", "paired", "--baseline", base, "--treated", other]) == 2
    assert "gap_dev: the two arms were evaluated on different questions" in capsys.readouterr().err
    assert main(["bench", "paired", "--baseline", base, base, "--treated", base]) == 2
    assert "--baseline has 2 files and --treated 1" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert main(["bench", "paired", "--baseline", str(tmp_path / "bad.json"), "--treated", base]) == 2
    assert "bad.json:1: not JSON" in capsys.readouterr().err


def test_every_damaged_file_is_named_with_its_field(tmp_path, capsys):
    """Records checked against the evaluation file's schema: a missing field, a wrong type and lists of unequal
    length are each named by file and field, every file at once, with no traceback."""
    good = write_eval(tmp_path / "good.json", [0, 1], [0.5, 1.0])
    no_recall = tmp_path / "no_recall.json"
    no_recall.write_text(json.dumps({"rows": [], "m_avg": None, "avg": None,
                                     "questions": {"gap_dev": {"uid": ["q0", "q1"], "em": [0, 1]}}}))
    text_em = write_eval(tmp_path / "text_em.json", ["1", 0], [0.5, 1.0])
    short = write_eval(tmp_path / "short.json", [0, 1], [0.5])
    assert main(["bench", "paired", "--baseline", str(no_recall), text_em, "--treated", short, good]) == 2
    err = capsys.readouterr().err
    assert f"error: {no_recall}: questions.gap_dev.recall: Field required" in err
    assert f"error: {text_em}: questions.gap_dev.em[0]: Input should be a valid number" in err
    assert f"error: {short}: questions.gap_dev: Value error, recall has 1 entries and uid 2" in err
    assert "Traceback" not in err
