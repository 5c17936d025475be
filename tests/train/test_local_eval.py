"""Local evaluation's progress: a large question set is evaluated in pieces, in order, with a line per piece in logs."""

from __future__ import annotations

import io
import sys

from bridge_ray.train.local_eval import evaluate_in_pieces


class Recorder:
    """Stands in for the sampler's ``evaluate`` only: records the pieces it is given, answers each question."""

    def __init__(self):
        self.pieces: list[int] = []

    def evaluate(self, questions: list[int]) -> list[int]:
        self.pieces.append(len(questions))
        return [-q for q in questions]


def test_a_large_set_goes_in_pieces_in_order_with_a_line_each(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stderr", stderr := io.StringIO())  # not a terminal: lines, on stderr
    sampler = Recorder()
    assert evaluate_in_pieces(sampler, "nq", list(range(1000))) == [-q for q in range(1000)]
    assert sampler.pieces == [333, 333, 334]  # pieces of at least 256 questions
    assert capsys.readouterr().out == ""  # stdout is the table's
    lines = stderr.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "evaluation on nq: 333/1000 questions", "evaluation on nq: 666/1000 questions",
        "evaluation on nq: 1000/1000 questions",
    ]


def test_a_small_set_goes_whole(monkeypatch):
    monkeypatch.setattr(sys, "stderr", stderr := io.StringIO())
    sampler = Recorder()
    assert evaluate_in_pieces(sampler, "world", [1, 2, 3]) == [-1, -2, -3] and sampler.pieces == [3]
    assert stderr.getvalue().startswith("evaluation on world: 3/3 questions (100%)")
