"""A sweep's presets compared question by question: every run of one seed asks the same questions in the same order
with the same sampler seeds (common random numbers: both come from ``run.seed``), so the presets' last evaluations
pair up, and each difference gets a bootstrap interval (:mod:`bridge_ray.evaluation.paired`)."""

from __future__ import annotations

from typing import Any

from bridge_ray.evaluation.paired import QUESTION_LEVEL, paired_set_figures

BASELINE = "fixed"  # the preset every other one is paired against, unless a sweep names another
BRIDGE = "bridge"  # paired, too, against every other schedule: the paper's Table 3 claims
LastTables = dict[tuple[str, int], dict[str, Any]]  # (preset, seed) -> its last evaluation: set -> table


def paired_rows(last_tables: LastTables, sets: list[str], baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Each preset minus ``baseline`` (the fixed retriever), and BRIDGE minus every other schedule (the paper's
    claims), at their last evaluations, per set: EM and recall@3 differences in points, for each seed both ran
    (a 95% bootstrap interval over its questions) and over those seeds (``seed`` "all": over seeds and questions
    from three seeds on, else over questions with the seeds averaged first; ``interval`` says which)."""
    rows = []
    presets = list(dict.fromkeys(preset for preset, _ in last_tables))
    pairs = [(preset, baseline) for preset in presets if preset != baseline]
    if BRIDGE in presets:
        pairs += [(BRIDGE, other) for other in presets if other not in (baseline, BRIDGE)]
    for preset, baseline_arm in pairs:
        seeds = [s for p, s in last_tables if p == preset and (baseline_arm, s) in last_tables]
        if not seeds:
            continue
        for name in sets:
            treated, base = ([last_tables[arm, s][name]["questions"][name] for s in seeds]
                             for arm in (preset, baseline_arm))
            try:
                figures = paired_set_figures(treated, base)
            except ValueError as e:
                raise ValueError(f"{preset} and {baseline_arm} on {name}: {e}") from None
            row = {"preset": preset, "baseline": baseline_arm, "set": name, "questions": len(treated[0]["uid"])}
            if len(seeds) == 1:
                rows.append({**row, "seed": seeds[0], **figures})
                continue
            rows += [{**row, "seed": s, **own, "interval": QUESTION_LEVEL}
                     for s, own in zip(seeds, figures.pop("per_seed"), strict=True)]
            rows.append({**row, "seed": "all", **figures})
    return rows


def final_questions(last_tables: LastTables, sets: list[str]) -> list[dict[str, Any]]:
    """Each (preset, seed, set)'s per-question ``uid``, ``em`` and ``recall`` at its last evaluation: what
    :func:`paired_rows` pairs, kept so that its intervals can be computed again from ``results.json``."""
    return [{"preset": preset, "seed": seed, "set": name,
             **{key: tables[name]["questions"][name][key] for key in ("uid", "em", "recall")}}
            for (preset, seed), tables in last_tables.items() for name in sets]
