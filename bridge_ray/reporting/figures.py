"""Every benchmark's and sweep's figures: ``--out`` JSON (:func:`write_figures`) and the PNG each draws from it, in
one module so that the figures share their look (bands over seeds, axis labels) and are all saved atomically."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, whatever the machine has
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bridge_ray.atomic import replacing, write_text_atomic
from bridge_ray.evaluation.paired import QUESTION_LEVEL, TWO_LEVEL

METRICS = (("diff_em", "ci_low", "ci_high", "em", "EM"),
           ("diff_recall_at_3", "recall_ci_low", "recall_ci_high", "recall_at_3", "recall@3"))
NAMES = {"bridge": "BRIDGE", "fixed": "fixed retriever"}  # presets as a reader of the paper names them
# bench landscape's surfaces: (key in its figures, panel title, what the second direction moves)
LANDSCAPE_PANELS = (("rag_joint", "(a) L_RAG over θ × η", "η"), ("rl_joint", "(b) L_RL over θ × η", "η"),
                    ("rl_theta", "(c) L_RL over θ × θ'", "θ'"))


def write_figures(
    path: str | Path, figures: dict[str, Any], plot: Callable[[dict[str, Any], Path], None] | None = None
) -> tuple[Path, ...]:
    """The figures as one JSON document at ``path`` and, with ``plot``, its drawing as a PNG beside it (same name,
    ``.png``), each written atomically; the files written."""
    path = Path(path)
    write_text_atomic(path, json.dumps(figures, indent=2) + "\n")
    if plot is None:
        return (path,)
    plot(figures, path.with_suffix(".png"))
    return path, path.with_suffix(".png")


def wrote(paths: Sequence[Path | str]) -> None:
    """The line every bench ends on: the files it wrote."""
    print(f"wrote {' and '.join(map(str, paths))}")


def provenance(bench: str) -> dict[str, str]:
    """How the figures were made, kept beside them: the command line (``bench`` and the flags it was given) and
    the day."""
    return {"command": " ".join([f"python -m bridge_ray bench {bench}", *sys.argv[3:]]),
            "date": time.strftime("%Y-%m-%d")}


def save(fig: Figure, path: str | Path, dpi: int) -> None:
    """The figure as a PNG at ``path``, written atomically (a reader never sees half a file), then closed."""
    with replacing(Path(path)) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    plt.close(fig)


def label(ax: Axes, xlabel: str, ylabel: str, title: str | None = None) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)


def seed_band(ax: Axes, x: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> None:
    """The band from the lowest to the highest seed under a mean line."""
    ax.fill_between(x, lows, highs, alpha=0.15)


def plot_curves(results: dict[str, Any], path: Path, oracle: str) -> None:
    """``bench learn``: reward, held-out EM, two-hop EM, recall@3 and OOD EM against round: a line per preset
    (mean, with markers offset a little so that coinciding presets stay visible), a band over the seeds, the
    ``oracle`` arm's EM dashed."""
    held, curve = results["sets"][0], results["curve"]
    panels = [("reward", "training reward (mean)", results["rounds"], None),
              ("em", f"{held} held-out EM", curve, held),
              ("two_hop/em", f"{held} two-hop EM", curve, held),
              ("recall_at_3", f"{held} recall@3 (gold shown)", curve, held),
              *[("em", f"{name} EM", curve, name) for name in results["sets"][1:]]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.4))
    presets = list(results["presets"])
    span = max([r["round"] for r in curve], default=1) or 1
    for ax, (metric, title, rows, name) in zip(axes, panels, strict=True):
        for i, preset in enumerate(presets):
            picked = [r for r in rows if r["preset"] == preset and (name is None or r["set"] == name)
                      and r.get(metric) is not None]
            xs = sorted({r["round"] for r in picked})
            if not xs:
                continue
            per = [[r[metric] for r in picked if r["round"] == x] for x in xs]
            shift = 0.025 * span * (i - (len(presets) - 1) / 2)  # about a marker's width apart
            ax.plot([x + shift for x in xs], [statistics.mean(v) for v in per], marker="os^vD<>"[i % 7], label=preset)
            seed_band(ax, xs, [min(v) for v in per], [max(v) for v in per])
        found = [r[metric] for r in rows if r["preset"] == oracle and r["set"] == name and r.get(metric) is not None]
        if found and metric != "recall_at_3":
            ax.axhline(statistics.mean(found), color="gray", linestyle="--", label="oracle retrieval")
        label(ax, "round", "mean reward" if metric == "reward" else "percent", title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=110)


def plot_replay(figures: dict[str, Any], path: Path) -> None:
    """``bench replay``: probe recall per round, one line per variant (mean over seeds, markers), a band from the
    lowest to the highest seed."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    markers = "osD^vP*Xh"
    for i, v in enumerate(figures["variants"]):
        by_seed = np.array(v["recall_per_round_by_seed"])
        x = np.arange(by_seed.shape[1]) + 0.04 * (i - len(figures["variants"]) / 2)  # coinciding lines stay visible
        ax.plot(x, by_seed.mean(axis=0), marker=markers[i % len(markers)], label=v["name"])
        seed_band(ax, x, by_seed.min(axis=0), by_seed.max(axis=0))
    label(ax, "retriever update (round; 0 = frozen retriever)", "dev gold recall@m of fixed searches (%)",
          f"bench replay: {figures['questions']} questions, {len(figures['seeds'])} seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, dpi=120)


def plot_retriever_update(figures: dict[str, Any], path: Path, variants: Sequence[str]) -> None:
    """``bench retriever-update``: the η update's peak memory and time of each of ``variants`` (BRIDGE, Drop,
    two-state) as a ratio to two-state, the absolute figure on each bar."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, unit, scale in ((axes[0], "update_bytes", "MiB", 2**20), (axes[1], "seconds", "s", 1)):
        values = [figures[v][key] / scale for v in variants]
        ratios = [v / (figures["two_state"][key] / scale) for v in values]
        bars = ax.bar(["BRIDGE", "Drop", "two-state"], ratios)
        ax.bar_label(bars, [f"{v:.1f} {unit}" if unit == "MiB" else f"{v:.3f} {unit}" for v in values])
        ax.set_ylim(0, 1.2 * max(ratios))
        ax.set_ylabel("ratio to two-state (bars: absolute)")
        ax.set_title("the η update's own peak memory" if unit == "MiB" else "time per η update")
    fig.tight_layout()
    save(fig, path, dpi=110)


def plot_estimators(figures: dict[str, Any], path: Path, estimators: Sequence[tuple[str, str]]) -> None:
    """``bench estimators``, four panels: (a) and (b) the per-batch cosines and relative errors as unit-peak
    densities, one ridge per γ (the paper's Fig. 4a), each batch a tick under its ridge; (c) and (d) their means
    over batches with the 95% interval against γ (Fig. 4b), the batches as faint dots. Relative errors span
    decades (BRIDGE ~0.1, Drop up to ~100): their axes are logarithmic. The estimators' markers are offset along γ
    so that neither hides the other."""
    rows, summary, gammas = figures["rows"], figures["summary"], figures["gammas"]
    colors = {"bridge": "C0", "drop": "C3"}
    offsets = {"bridge": 0.92, "drop": 1.08}  # multiplicative, on the log γ axis
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, measure, log_x, xlabel in (
            (axes[0, 0], "cosine", False, "cosine similarity to two-state"),
            (axes[0, 1], "relative_error", True, "relative error ‖g − g_two-state‖ / ‖g_two-state‖")):
        for level, gamma in enumerate(gammas):
            for name, legend in estimators:
                values = np.array([r[f"{name}_{measure}"] for r in rows if r["gamma"] == gamma])
                if values.size == 0:
                    continue
                grid, density = _unit_peak_density(np.log10(values) if log_x else values)
                x = 10 ** grid if log_x else grid
                ax.fill_between(x, level, level + 0.85 * density, color=colors[name], alpha=0.25, lw=0)
                ax.plot(x, level + 0.85 * density, color=colors[name], lw=1.2, label=legend if level == 0 else None)
                ax.plot(values, np.full(values.size, level + 0.04), "|", color=colors[name], ms=8, mew=1.2)
        ax.set_yticks(range(len(gammas)), [f"γ = {g:g}" for g in gammas])
        ax.set_ylim(-0.1, len(gammas) + 0.3)  # room above the top ridge for the legend
        if log_x:
            ax.set_xscale("log")
        else:  # a cosine lies in [-1, 1]; the kernels' tails need not
            low, high = ax.get_xlim()
            ax.set_xlim(max(low, -1.02), min(high, 1.02))
        label(ax, xlabel, "density per γ (unit peak); ticks: batches")
        ax.grid(alpha=0.3, axis="x", which="both")
        ax.legend(loc="upper center", ncol=2)
    n = max((s["batches"] for s in summary), default=0)
    for ax, measure, ylabel in ((axes[1, 0], "cosine", "cosine similarity to two-state"),
                                (axes[1, 1], "relative_error", "relative error to two-state")):
        for name, legend in estimators:
            key = f"{name}_{measure}"
            xs = np.array([s["gamma"] for s in summary]) * offsets[name]
            means = np.array([s[key]["mean"] for s in summary])
            spread = np.array([[m - s[key]["ci_low"] for m, s in zip(means, summary, strict=True)],
                               [s[key]["ci_high"] - m for m, s in zip(means, summary, strict=True)]])
            ax.errorbar(xs, means, yerr=spread, color=colors[name], marker="o", capsize=3, label=f"{legend}, mean")
            ax.plot([r["gamma"] * offsets[name] for r in rows], [r[key] for r in rows], ".", color=colors[name],
                    alpha=0.3, ms=4)
        ax.set_xscale("log")
        if measure == "relative_error":
            ax.set_yscale("log")
        ax.set_xticks(gammas, [f"{g:g}" for g in gammas])
        label(ax, "γ", ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(title=f"95% interval over {n} batches; dots: batches", fontsize=8, title_fontsize=8)
    for ax, letter in zip(axes.flat, "abcd", strict=True):
        ax.set_title(f"({letter})", loc="left")
    questions = figures["questions_per_batch"]
    fig.suptitle(f"BRIDGE and Drop θ-gradients against two-state ({n} batches of {questions} train "
                 f"question{'s' if questions > 1 else ''})")
    fig.tight_layout()
    save(fig, path, dpi=110)


def _unit_peak_density(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(grid, density) of a Gaussian kernel density estimate of ``values`` scaled to peak 1 (Silverman's
    bandwidth; a narrow floor where the values agree or there is one, so it draws as a spike)."""
    spread = float(values.std(ddof=1)) if values.size > 1 else 0.0
    bandwidth = max(1.06 * spread * values.size ** -0.2, 1e-3 * max(1.0, float(np.abs(values).max())))
    grid = np.linspace(values.min() - 4 * bandwidth, values.max() + 4 * bandwidth, 400)
    density = np.exp(-0.5 * ((grid[:, None] - values[None, :]) / bandwidth) ** 2).sum(axis=1)
    return grid, density / density.max()


def plot_round(results: dict[str, dict[str, float]], path: Path, phases: Sequence[str]) -> None:
    """``bench round``: one stacked bar per value: where its round's seconds go, phase by phase (overlapped work
    shows as 0)."""
    names = list(results)
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.5 * len(names)))
    left = [0.0] * len(names)
    for phase in phases:
        widths = [results[n][phase] for n in names]
        ax.barh(names, widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.scatter([results[n]["round"] for n in names], names, marker="|", s=400, color="black", label="round (wall)")
    ax.set_xlabel("seconds per round")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    save(fig, path, dpi=110)


def plot_landscape(figures: dict[str, Any], path: Path) -> None:
    """``bench landscape``: contours in the paper's layout: one column per surface, one row per checkpoint,
    levels shared down a column."""
    axis, rows = np.array(figures["axis"]), list(figures["checkpoints"].items())
    panels = LANDSCAPE_PANELS
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.2 * len(panels), 3.6 * len(rows)), squeeze=False)
    for col, (name, title, beta_label) in enumerate(panels):
        grids = [np.array(checkpoint[name]["values"]) for _, checkpoint in rows]
        finite = np.concatenate([g[np.isfinite(g)] for g in grids])
        levels = np.linspace(finite.min(), finite.max(), 16) if np.ptp(finite) > 0 else 16
        for row, ((checkpoint_label, checkpoint), grid) in enumerate(zip(rows, grids, strict=True)):
            ax = axes[row][col]
            filled = ax.contourf(axis, axis, grid.T, levels=levels, cmap="viridis")
            ax.contour(axis, axis, grid.T, levels=levels, colors="k", linewidths=0.3)
            ax.plot(0, 0, "w+", markersize=9)
            ax.plot(*checkpoint[name]["argmin"], "r*", markersize=9)
            label(ax, "α (θ direction)", f"β ({beta_label} direction)")
            ax.set_title(f"{title}, {checkpoint_label}", fontsize=10)
            fig.colorbar(filled, ax=ax)
    fig.suptitle("+: the checkpoint, ★: the grid's minimum", fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=100)


def seed_rows(results: dict[str, Any], treated: str, baseline: str, set_name: str) -> list[dict[str, Any]]:
    """One row per seed, then the pooled row (``seed`` "all"): the paired difference with its interval, what the
    interval resamples (``interval``; a file written before two-level intervals holds question-level ones) and
    both arms' final scores, so that a reader sees whether one seed carries the mean."""
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
    over = "seeds + questions" if row["interval"] == TWO_LEVEL else "questions only"
    return f"{seeds} seeds pooled\n(interval over {over})"


def plot_paired_seeds(groups: Sequence[tuple[str, dict[str, Any]]], path: str | Path, *, treated: str = "bridge",
                      baseline: str = "fixed", set_name: str = "gap") -> None:
    """``bench seeds``: a forest plot per metric: each seed's treated − baseline with its 95% interval over
    questions, and the pooled difference in bold, its label saying what its interval resamples: seeds and
    questions (three seeds or more), or questions alone with the seeds averaged first (leaving out the spread
    between seeds)."""
    blocks = [(name, seed_rows(results, treated, baseline, set_name)) for name, results in groups]
    height = sum(len(rows) + 1 for _, rows in blocks)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(6.4 * len(METRICS), 0.42 * height + 1.4), sharey=True)
    for ax, level in zip(axes, METRICS, strict=True):
        y, ticks, names = height, [], []
        for g, (name, rows) in enumerate(blocks):
            color = f"C{g}"
            ax.text(0.01, y - 0.35, name, transform=ax.get_yaxis_transform(), fontsize=9, weight="bold", va="center")
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
        label(ax, f"{NAMES.get(treated, treated)} − {NAMES.get(baseline, baseline)}, {level[4]} (points)", "",
              f"{level[4]} on the {set_name} world's held-out questions")
        ax.grid(axis="x", alpha=0.3)
    fig.text(0.01, 0.01, "Bars: 95% bootstrap intervals; a seed's over its questions. In brackets after each seed: "
             "both arms' scores.\nPooled, over seeds + questions: seeds and questions resampled; over questions "
             "only: seeds averaged per question first, so the spread between seeds is left out.",
             fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, path, dpi=100)
