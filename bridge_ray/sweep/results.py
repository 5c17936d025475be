"""What a sweep reports: its curve points, ``results.json`` (read back through :class:`SweepResults`),
``results.md`` (mean ± std over seeds, Table 3's gains, the paired rows, the rewards) and ``curves.png``.

``results.json`` holds ``final`` (a row per (preset, seed, set) at the last round, and the oracle's), ``paired``
(:func:`~bridge_ray.sweep.paired.paired_rows`), ``final_questions`` (every (preset, seed, set)'s per-question EM and
recall at the last round, from which the paired rows can be computed again), ``curve`` (every evaluation point) and
``rounds`` (every round's training figures).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from bridge_ray.atomic import write_text_atomic
from bridge_ray.evaluation.paired import QUESTION_LEVEL
from bridge_ray.records import read_record
from bridge_ray.reporting.figures import plot_curves
from bridge_ray.reporting.tables import markdown_table, mean_std
from bridge_ray.sweep.paired import BASELINE

ORACLE = "oracle"  # the warm-up policy with the gold passages shown: an arm, not a preset


def point(preset: str, seed: int | None, round_index: int, name: str, table: dict[str, Any]) -> dict[str, Any]:
    """One evaluation: overall EM / F1 / recall@3 of a set, and per question type."""
    rows = {row["name"]: row for row in table["rows"]}
    main = rows[name]
    found = {"preset": preset, "seed": seed, "round": round_index, "set": name,
             "em": main["em"], "f1": main["f1"], "recall_at_3": main["recall"]}
    for key, row in rows.items():
        if key.startswith(f"{name}/"):
            kind = key.split("/", 1)[1]
            found |= {f"{kind}/em": row["em"], f"{kind}/f1": row["f1"], f"{kind}/recall_at_3": row["recall"]}
    return found


def last_rounds(curve: list[dict[str, Any]]) -> dict[str, int]:
    """Each preset's last evaluated round (a staged preset's curve runs longer)."""
    last: dict[str, int] = {}
    for p in curve:
        last[p["preset"]] = max(last.get(p["preset"], 0), p["round"])
    return last


def write_results(out: Path, results: dict[str, Any]) -> tuple[Path, ...]:
    """``results.json``, ``results.md`` and ``curves.png`` in ``out``; the files written."""
    written = out / "results.json", out / "results.md", out / "curves.png"
    write_text_atomic(written[0], json.dumps(results, indent=2) + "\n")
    write_text_atomic(written[1], results_markdown(results) + "\n")
    plot_curves(results, written[2], ORACLE)
    return written


def results_markdown(results: dict[str, Any]) -> str:
    """Mean ± std over seeds at round 0 (the warm-up) and at the last round, per preset and set, and the oracle's;
    each preset's gain over the fixed retriever; the paired differences; the rewards of the first and last rounds."""
    curve, sets = results["curve"], results["sets"]
    last = last_rounds(curve)
    kinds = sorted({k.split("/")[0] for p in curve for k in p if "/" in k})
    metrics = ["em", "f1", "recall_at_3", *[f"{k}/em" for k in kinds], *[f"{k}/recall_at_3" for k in kinds]]
    start = "each seed's own warm-up" if results.get("warmup_per_seed") else "one warm-up checkpoint"
    rows = []
    for preset in [*results["presets"], ORACLE]:
        for round_index in sorted({0, last.get(preset, 0)}):
            for name in sets:
                found = [p for p in curve if p["preset"] == preset and p["round"] == round_index and p["set"] == name]
                if found:
                    label = f"{ORACLE} (warm-up policy, gold passages shown)" if preset == ORACLE else preset
                    rows.append([label, "warm-up" if round_index == 0 else str(round_index), name,
                                 *[mean_std([r[m] for r in found if r.get(m) is not None]) for m in metrics]])
    lines = [
        f"{len(results['seeds'])} seeds, {results['rounds_per_run']} RL rounds per run from {start}; "
        f"{results['eval_questions']} questions per set ({results.get('split', 'test')} split); mean ± std over seeds.",
        "",
        *markdown_table(["preset", "round", "set", *metrics], rows, "lrl" + "r" * len(metrics)),
    ]
    lines += _gains_over_baseline(curve, results["presets"], last, sets, results.get("baseline", BASELINE))
    lines += _paired_table(results.get("paired", []))
    return "\n".join(lines + _reward_table(results["rounds"], results["presets"]))


def _reward_table(rewards: list[dict[str, Any]], presets: dict[str, Any]) -> list[str]:
    """Each preset's mean training reward in its first and last rounds, and its zero-variance groups."""
    if not rewards:
        return []
    rows = []
    for preset in presets:
        mine = [r for r in rewards if r["preset"] == preset]
        if not mine:
            continue
        first = [r["reward"] for r in mine if r["round"] == 1]
        final = [r["reward"] for r in mine if r["round"] == max(x["round"] for x in mine)]
        zero = [r.get("zero_variance_groups") for r in mine if r.get("zero_variance_groups") is not None]
        rows.append([preset, f"{statistics.mean(first):.3f}", f"{statistics.mean(final):.3f}",
                     f"{statistics.mean(zero) if zero else float('nan'):.2f}"])
    return ["", *markdown_table(["preset", "mean reward, first round", "mean reward, last round",
                                 "zero-variance groups"], rows, "lrrr")]


def _paired_table(paired: list[dict[str, Any]]) -> list[str]:
    """The paired rows: preset − baseline per set and seed, EM and recall@3 with their 95% intervals and what each
    interval resamples (a file written before two-level intervals holds question-level ones)."""
    if not paired:
        return []
    rows = []
    for r in paired:
        recall = "–" if r.get("diff_recall_at_3") is None else (
            f"{r['diff_recall_at_3']:+.1f} [{r['recall_ci_low']:+.1f}, {r['recall_ci_high']:+.1f}]")
        rows.append([f"{r['preset']} − {r['baseline']}", r["set"], r["seed"], r["questions"],
                     f"{r['diff_em']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]", recall,
                     r.get("interval", QUESTION_LEVEL)])
    return ["", *markdown_table(["preset − baseline", "set", "seed", "questions", "EM diff [95% CI]",
                                 "recall@3 diff [95% CI]", "interval over"], rows, "lllrrrl")]


def _gains_over_baseline(
    curve: list[dict[str, Any]], presets: dict[str, Any], last: dict[str, int], sets: list[str], baseline: str
) -> list[str]:
    """Paper Table 3's view: each preset's mean EM at its last round and its gain over the baseline's (the fixed
    retriever's), in points, overall and on two-hop questions (the paper's multi-hop average), on every set."""
    if baseline not in presets:
        return []
    columns = [(name, metric) for name in sets for metric in ("em", "two_hop/em")]

    def mean(preset: str, name: str, metric: str) -> float | None:
        values = [p[metric] for p in curve if p["preset"] == preset and p["round"] == last.get(preset)
                  and p["set"] == name and p.get(metric) is not None]
        return statistics.mean(values) if values else None

    rows = []
    for preset in presets:
        cells = []
        for name, metric in columns:
            value, base = mean(preset, name, metric), mean(baseline, name, metric)
            gain = "" if preset == baseline or value is None or base is None else f" ({value - base:+.1f})"
            cells.append("–" if value is None else f"{value:.1f}{gain}")
        rows.append([f"{preset} ({last.get(preset, 0)})", *cells])
    return ["", *markdown_table(["preset (its last round)", *(f"{name} {metric}" for name, metric in columns)], rows,
                                "l" + "r" * len(columns))]


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow")  # the figures a reader of results.json does not use


class PairedRow(_Row):
    """A ``paired`` row of results.json: one preset minus its baseline on a set, for a seed or over them."""

    preset: str
    baseline: str
    set: str
    seed: int | Literal["all"]
    diff_em: float
    ci_low: float
    ci_high: float
    diff_recall_at_3: float | None
    recall_ci_low: float | None
    recall_ci_high: float | None


class FinalRow(_Row):
    """A ``final`` row: a preset's (or the oracle's, seed null) scores on a set at its last round."""

    preset: str
    seed: int | None
    set: str
    em: float
    recall_at_3: float | None


class SweepResults(_Row):
    """What is read back of a sweep's results.json: its paired and final rows."""

    paired: list[PairedRow]
    final: list[FinalRow]


def read_results(path: str | Path) -> dict[str, Any]:
    """A sweep's results.json, checked against :class:`SweepResults` (a damaged file names itself and the field)."""
    return read_record(path, SweepResults, "a bench learn results.json").model_dump()
