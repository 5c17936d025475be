"""``--out``: where every benchmark's figures go; and the paired-seeds figure drawn from ``bench learn`` results
(``bench seeds``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge_ray.atomic import write_text_atomic

METRICS = (("diff_em", "ci_low", "ci_high", "em", "EM"),
           ("diff_recall_at_3", "recall_ci_low", "recall_ci_high", "recall_at_3", "recall@3"))
NAMES = {"bridge": "BRIDGE", "fixed": "fixed retriever"}  # presets as a reader of the paper names them


def write_figures(path: str | Path, figures: dict[str, Any]) -> None:
    """Every benchmark's figures as one JSON document, written atomically."""
    write_text_atomic(Path(path), json.dumps(figures, indent=2) + "\n")


def seed_rows(results: dict[str, Any], treated: str, baseline: str, set_name: str) -> list[dict[str, Any]]:
    """One row per seed, then the pooled row (``seed`` "all"): the paired difference with its interval, what the
    interval resamples (``interval``; a file written before two-level intervals holds question-level ones) and
    both arms' final scores, so that a reader sees whether one seed carries the mean."""
    from bridge_ray.evaluation.paired import QUESTION_LEVEL

    paired = [r for r in results["paired"] if (r["preset"], r["baseline"], r["set"]) == (treated, baseline, set_name)]
    if not paired:
        raise ValueError(f"no paired rows {treated} − {baseline} on {set_name!r}")
    final = {(r["preset"], r["seed"]): r for r in results["final"] if r["set"] == set_name}
    rows = []
    for p in sorted(paired, key=lambda r: (r["seed"] == "all", str(r["seed"]))):
        arms = {arm: final.get((arm, p["seed"])) for arm in (baseline, treated)}
        rows.append({"interval": QUESTION_LEVEL, **p, "arms": arms})
    return rows


def _row_label(row: dict[str, Any], level: tuple[str, ...], baseline: str, treated: str) -> str:
    """The value beside a row: difference [interval], and baseline → treated where one seed has both."""
    diff, low, high = (row[k] for k in level[:3])
    metric = level[3]
    text = f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]"
    before, after = row["arms"][baseline], row["arms"][treated]
    if before and after:
        text += f"  ({before[metric]:.1f} → {after[metric]:.1f})"
    return text


def pooled_name(row: dict[str, Any], seeds: int) -> str:
    """The pooled row's label, saying what its interval resamples."""
    from bridge_ray.evaluation.paired import TWO_LEVEL

    over = "seeds + questions" if row["interval"] == TWO_LEVEL else "questions only"
    return f"{seeds} seeds pooled\n(interval over {over})"


def plot_paired_seeds(groups: Sequence[tuple[str, dict[str, Any]]], path: str | Path, *, treated: str = "bridge",
                      baseline: str = "fixed", set_name: str = "gap") -> None:
    """A forest plot per metric: each seed's treated − baseline with its 95% interval over questions, and the
    pooled difference in bold, its label saying what its interval resamples: seeds and questions (three seeds or
    more), or questions alone with the seeds averaged first (leaving out the spread between seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = [(label, seed_rows(results, treated, baseline, set_name)) for label, results in groups]
    height = sum(len(rows) + 1 for _, rows in blocks)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(6.4 * len(METRICS), 0.42 * height + 1.4), sharey=True)
    for ax, level in zip(axes, METRICS, strict=True):
        y, ticks, names = height, [], []
        for g, (label, rows) in enumerate(blocks):
            color = f"C{g}"
            ax.text(0.01, y - 0.35, label, transform=ax.get_yaxis_transform(), fontsize=9, weight="bold", va="center")
            y -= 1
            for row in rows:
                pooled = row["seed"] == "all"
                diff, low, high = (row[k] for k in level[:3])
                ax.errorbar(diff, y, xerr=[[diff - low], [high - diff]], fmt="D" if pooled else "o", color=color,
                            markersize=8 if pooled else 6, capsize=3, linewidth=2.2 if pooled else 1.2)
                ax.annotate(_row_label(row, level, baseline, treated), (high, y), xytext=(6, 0),
                            textcoords="offset points", va="center", fontsize=8,
                            weight="bold" if pooled else "normal")
                ticks.append(y)
                names.append(pooled_name(row, len(rows) - 1) if pooled else f"seed {row['seed']}")
                y -= 1
        ax.axvline(0, color="gray", linewidth=1)
        ax.set_yticks(ticks, names)
        ax.set_ylim(0.3, height + 0.2)
        lows = [r[level[1]] for _, rows in blocks for r in rows]
        highs = [r[level[2]] for _, rows in blocks for r in rows]
        ax.set_xlim(min(0.0, min(lows)) - 3, max(highs) + 0.55 * (max(highs) - min(0.0, min(lows))))
        ax.set_xlabel(f"{NAMES.get(treated, treated)} − {NAMES.get(baseline, baseline)}, {level[4]} (points)")
        ax.set_title(f"{level[4]} on the {set_name} world's held-out questions")
        ax.grid(axis="x", alpha=0.3)
    fig.text(0.01, 0.01, "Bars: 95% bootstrap intervals; a seed's over its questions. In brackets after each seed: "
             "both arms' scores.\nPooled, over seeds + questions: seeds and questions resampled; over questions "
             "only: seeds averaged per question first, so the spread between seeds is left out.",
             fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)

