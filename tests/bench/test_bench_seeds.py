"""``bench seeds`` redraws the headline figure from the kept results files, and refuses a bad file before drawing."""

import json
from pathlib import Path

from bridge_ray.cli import main
from bridge_ray.reporting.figures import pooled_name, seed_rows

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "table3-gap-world"


def test_draws_every_seed_and_the_pooled_row_from_kept_results(tmp_path, capsys):
    out = tmp_path / "seeds.png"
    assert main(["bench", "seeds", f"one warm-up={RESULTS / 'one-warmup' / 'results.json'}",
                 f"warm-up seeds={RESULTS / 'warmup-seeds' / 'results.json'}", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG") and f"wrote {out}" in capsys.readouterr().out


def test_a_missing_pair_or_file_is_one_error_line(tmp_path, capsys):
    out = tmp_path / "seeds.png"
    assert main(["bench", "seeds", f"a={RESULTS / 'one-warmup' / 'results.json'}", "--treated", "nope",
                 "--out", str(out)]) == 2
    assert "no paired rows nope" in capsys.readouterr().err
    assert main(["bench", "seeds", f"a={tmp_path / 'none.json'}", "--out", str(out)]) == 2
    assert f"error: {tmp_path / 'none.json'}: no such file" in capsys.readouterr().err
    results = json.loads((RESULTS / "one-warmup" / "results.json").read_text())
    results["paired"][1]["diff_em"] = "large"
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["bench", "seeds", f"a={tmp_path / 'results.json'}", "--out", str(out)]) == 2
    assert f"error: {tmp_path / 'results.json'}: paired[1].diff_em: Input should be a valid number" in (
        capsys.readouterr().err)
    assert not out.exists()


def test_the_pooled_label_says_what_its_interval_resamples():
    """A results file written before two-level intervals holds question-level ones: read so, and labelled so; a
    newer file's pooled row keeps the interval it was computed with."""
    old = json.loads((RESULTS / "one-warmup" / "results.json").read_text())
    rows = seed_rows(old, "bridge", "fixed", "gap")
    assert [r["seed"] for r in rows] == [0, 1, 2, "all"] and {r["interval"] for r in rows} == {"questions"}
    assert pooled_name(rows[-1], 3) == "3 seeds pooled\n(interval over questions only)"
    new = {**old, "paired": [{**r, "interval": "seeds+questions" if r["seed"] == "all" else "questions"}
                             for r in old["paired"]]}
    pooled = seed_rows(new, "bridge", "fixed", "gap")[-1]
    assert pooled_name(pooled, 3) == "3 seeds pooled\n(interval over seeds + questions)"
