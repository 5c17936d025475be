"""Progress in logs: a plain line per tenth of the work, never more, the last one at 100%; a bar on a terminal."""

from __future__ import annotations

import io
import re
import sys

from bridge_ray.progress import Progress, clock


def test_a_line_per_tenth_with_figures_and_an_eta():
    lines: list[str] = []
    with Progress(100, "evaluation on nq", "questions", log=lines.append, terminal=False) as progress:
        for _ in range(25):
            progress.update(4, loss=0.5)
    assert len(lines) == 10
    assert [int(re.search(r": (\d+)/100 questions \((\d+)%\)", line).group(1)) for line in lines] == [
        12, 20, 32, 40, 52, 60, 72, 80, 92, 100,
    ]
    assert re.fullmatch(r"evaluation on nq: 12/100 questions \(12%\), loss 0\.5, \d\d:\d\d, ETA \d\d:\d\d", lines[0])
    assert lines[-1].startswith("evaluation on nq: 100/100 questions (100%), loss 0.5,") and "ETA" not in lines[-1]


def test_large_steps_give_one_line_each_and_empty_work_none():
    lines: list[str] = []
    progress = Progress(100, "warm-up", "steps", log=lines.append, terminal=False)
    for n in (35, 35, 30):
        progress.update(n)
    assert [line.split(" (")[0] for line in lines] == ["warm-up: 35/100 steps", "warm-up: 70/100 steps",
                                                       "warm-up: 100/100 steps"]
    Progress(0, "nothing", "questions", log=lines.append, terminal=False).close()
    assert len(lines) == 3


def test_a_terminal_gets_a_bar_and_no_lines(monkeypatch):
    stderr, lines = io.StringIO(), []
    monkeypatch.setattr(sys, "stderr", stderr)
    with Progress(10, "evaluation on nq", "questions", log=lines.append, terminal=True) as progress:
        progress.update(10, loss=1.0)
    assert lines == [] and "evaluation on nq" in stderr.getvalue() and "10/10" in stderr.getvalue()


def test_clock():
    assert (clock(0), clock(59.6), clock(61), clock(3725)) == ("00:00", "01:00", "01:01", "1:02:05")


def test_pieces_per_worker_aims_at_ten_pieces_in_all_of_at_least_the_smallest_size():
    from bridge_ray.progress import pieces_per_worker

    assert pieces_per_worker(51_000, 1) == 10 and pieces_per_worker(51_000, 3) == 4  # 12 pieces, 4 per sampler
    assert pieces_per_worker(51_000, 8) == 2
    assert pieces_per_worker(64, 1) == 1 and pieces_per_worker(1000, 1) == 3  # pieces of 256 questions at least
    assert pieces_per_worker(0, 2) == 1
