"""The README and the guide speak to a user: short, and free of a lab notebook's dates, CPU models, commit hashes
and words about our own work. Raw run files under docs/results/<report>/ are records, not prose, and are left out."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 15 * 1024
NOTEBOOK = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"                        # a date
    r"|\b(?:EPYC|Xeon|Ryzen|Zen ?\d|Sapphire Rapids|Ice Lake)\b"  # a CPU model
    r"|\b(?:commit|at) [0-9a-f]{7,40}\b"            # a commit hash
    r"|\bissue ?#?\d+|\bsession\b|\btoday\b|\bour machines?\b",  # work words
    re.IGNORECASE,
)


def prose_pages(root: Path) -> list[Path]:
    results = root / "docs" / "results"
    pages = [p for p in (root / "docs").rglob("*.md") if p.parent == results or not p.is_relative_to(results)]
    return [root / "README.md", *sorted(pages)]


def notebook_words(root: Path) -> list[str]:
    return [f"{page.relative_to(root)}:{n}: {match.group(0)!r}"
            for page in prose_pages(root)
            for n, line in enumerate(page.read_text().splitlines(), 1)
            for match in NOTEBOOK.finditer(line)]


def test_readme_is_short():
    assert (ROOT / "README.md").stat().st_size <= README_LIMIT


def test_readme_and_guide_hold_no_notebook_words():
    assert notebook_words(ROOT) == []


def test_a_planted_date_model_and_work_word_are_caught(tmp_path):
    (tmp_path / "docs" / "results" / "run").mkdir(parents=True)
    (tmp_path / "README.md").write_text("Measured on 2026-12-03 on an AMD EPYC.\n")
    (tmp_path / "docs" / "guide.md").write_text("As issue 28 asked, at 3c050b9.\n")
    (tmp_path / "docs" / "results" / "run" / "raw.md").write_text("2026-12-03, raw records are exempt\n")
    assert len(notebook_words(tmp_path)) == 4
