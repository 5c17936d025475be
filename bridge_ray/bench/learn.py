"""``bridge-ray bench learn``: does RL over the warm-up learn, and does BRIDGE beat a fixed retriever?

Every (preset, seed) run starts from the same warm-up checkpoint (with ``--warmup-per-seed``, from its seed's own
warm-up, ``warmup.seed`` = the seed, so that the spread over seeds includes the starting policy's) and trains the
same number of rounds on the train split through the real actor graph. Its checkpoints, every ``--eval-every``
rounds, are evaluated greedily on two sets never trained on: the world's held-out test split (``world``, or ``gap``
on the gap world; ``--split dev`` takes the dev split instead, for choosing settings without looking at test) and
an out-of-distribution world (``ood``: another seed, paraphrased questions, its own corpus and index).
Round 0 is the warm-up policy with the base retriever, the same for every run of a warm-up, so it is evaluated
once per warm-up, and kept in the cache root for later bench runs asking the same
(:mod:`bridge_ray.evaluation.cache`); so is the ``oracle`` arm, the warm-up policy shown the gold passages at
every search (``eval.oracle_retrieval``): the EM a perfect retriever would buy without training the policy.

Runs of one seed share the question order and the sampler seeds of every round (common random numbers: both
come from ``run.seed``), and every evaluation asks the same questions, so presets pair up question by question:
each preset's difference from ``fixed`` (or ``--baseline``), and BRIDGE's from every other preset, is reported per
seed, with a 95% bootstrap interval over questions, and over the seeds, with a 95% interval over seeds and
questions from three seeds on (:mod:`bridge_ray.evaluation.paired`).

A preset is a schedule's config file (``jobs/configs/presets/<setting>/<name>.yaml``, paper Table 3 and Fig. 2a),
loaded on top of ``--config`` in place of the preset's own ``base:`` (``jobs/configs/local_cpu_gap.yaml`` runs every
schedule on the gap world's settings), with the bench's own settings on top. A staged preset (``stages:``, e.g.
RAG-then-RL) runs its stages one after the other, the first for ``--rounds`` and the others scaled in proportion to
the file's rounds, and its curve is its stages' rounds end to end. Runs whose configs differ only in where they
write are trained once: RAG-then-RL's and RL-then-RAG's ``baseline`` stage is the fixed preset's run of the same
seed, so the three curves branch from one run, as in Fig. 2a. Beside the paper's schedules, ``bridge_paper`` is
BRIDGE with the paper's retriever loss and ``ablate_<departure>`` BRIDGE with one departure of the gap world's
settings switched off, so that BRIDGE minus each is what that departure changes.

A bench run that stopped can be started again with the same arguments: finished runs and evaluations are
kept (each evaluation beside its checkpoint), an unfinished run resumes from its last checkpoint.

Writes ``DIR/results.json`` (``final``: a row per (preset, seed, set) at the last round, and the oracle's;
``paired``: each preset minus ``fixed``, and ``bridge`` minus every other preset, per set, per seed and over
seeds, with the interval and what it resamples; ``final_questions``: every (preset, seed, set)'s per-question EM
and recall at the last round, from which the paired rows can be computed again; ``curve``: every evaluation
point; ``rounds``: every round's training figures),
``DIR/results.md`` (mean ± std over seeds, the paired table) and ``DIR/curves.png`` (reward, EM and recall@3
against round, a line per preset, a band over the seeds, the oracle's EM dashed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import RootModel

from bridge_ray.atomic import write_text_atomic
from bridge_ray.bench.figures import plot_curves
from bridge_ray.checkpoint import LATEST, checkpoint_root
from bridge_ray.cli import add_out_argument, add_overrides_argument
from bridge_ray.cli_types import name_list, non_negative_int, positive_int, seed_list
from bridge_ray.config import derive, load_config
from bridge_ray.coordinator.inputs import configured_world, index_dir, world_set_name
from bridge_ray.engines.precision import cpu_kernels
from bridge_ray.errors import InputError, InputErrors, Problems
from bridge_ray.evaluation.cache import cached_table, settings_without_folders
from bridge_ray.evaluation.paired import QUESTION_LEVEL, paired_set_figures
from bridge_ray.evaluation.table import EvalTable, TableRecord
from bridge_ray.records import read_record
from bridge_ray.train import local_eval
from bridge_ray.train.preflight import preflight, warmup_preflight
from bridge_ray.train.run import Run
from bridge_ray.train.stages import checkpoint_start, json_gamma, stage_config
from bridge_ray.warmup import trainer as warmup

CONFIGS = {"default": "jobs/configs/local_cpu.yaml", "gap": "jobs/configs/local_cpu_gap.yaml"}  # --config by --world
PRESET_DIR = "jobs/configs/presets/local_cpu"  # one file per schedule: fixed.yaml, bridge.yaml, rag_then_rl.yaml, ...
QUICK = {"seeds": [0], "rounds": 4, "eval_every": 4, "eval_questions": 200}
BASELINE = "fixed"  # the preset every other one is paired against, unless --baseline names another
BRIDGE = "bridge"  # paired, too, against every other schedule: the paper's Table 3 claims
# The departures of jobs/configs/local_cpu_gap.yaml from the paper, each switched off by PRESET_DIR/ablate_<name>.yaml
ABLATIONS = ("trust_region", "candidates", "retriever_step", "rollouts", "dynamic_sampling", "policy_lora",
             "policy_kl", "old_logp")
ORACLE = "oracle"  # the warm-up policy with the gold passages shown: an arm, not a preset
KEPT_TABLES = "an evaluation bench learn kept (a JSON object: set -> evaluation table)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="the base of every preset (in place of its own base:), of the warm-up and the evaluations "
                        f"(default: {CONFIGS['gap']} with --world gap, else {CONFIGS['default']})")
    parser.add_argument("--world", choices=["default", "gap"],
                        help="data.world of every run and evaluation (default: the config's)")
    parser.add_argument("--presets", type=name_list(), default="fixed,bridge",
                        help="comma-separated schedules, each a file <preset-dir>/<name>.yaml: the paper's fixed, "
                        "bridge, decoupled_rl, decoupled_rag, rag_then_rl, rl_then_rag; bridge_paper (BRIDGE with the "
                        "paper's retriever loss); ablate_<departure>, BRIDGE with one departure from the paper "
                        f"switched off: {', '.join(ABLATIONS)}")
    parser.add_argument("--preset-dir", default=PRESET_DIR, metavar="DIR", help="where the preset files are")
    parser.add_argument("--seeds", type=seed_list, default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--rounds", type=positive_int, default=12, help="RL rounds per run")
    parser.add_argument("--eval-every", type=positive_int, default=4, help="evaluate every N rounds (and the last)")
    parser.add_argument("--eval-questions", type=positive_int, default=200, help="questions of each evaluation set")
    parser.add_argument("--baseline", default=BASELINE, metavar="PRESET",
                        help="the preset every other one is paired against (default: the fixed retriever)")
    parser.add_argument("--split", choices=["test", "dev"], default="test",
                        help="the held-out split every evaluation asks (dev: for choosing settings; test: to report)")
    parser.add_argument("--ood-seed", type=non_negative_int, default=1, help="seed of the out-of-distribution world")
    parser.add_argument("--warmup-per-seed", action="store_true",
                        help="each seed starts from its own warm-up (warmup.seed = the seed) instead of the config's")
    parser.add_argument("--quick", action="store_true",
                        help="seed 0; 4 rounds; evaluate at the end on 200 questions per set (fixed,bridge on the gap "
                             "world: about 50 min on 2 cores, 35 with round 0 kept in the cache)")
    add_out_argument(parser, "folder", "the runs, their evaluations and the figures; a bench stopped there resumes",
                     required=True, resumable=True)
    add_overrides_argument(parser, "applied to every run")


def base_config(args: argparse.Namespace) -> str:
    """``--config``, else the world's own settings: ``--world gap`` is the gap world as ``make demo`` trains it."""
    return args.config or CONFIGS[args.world or "default"]


def warmup_configs(args: argparse.Namespace, base, overrides: list[str], seeds: list[int]) -> dict[int, Any]:
    """The warm-up config each seed's runs start from: ``base`` (the config's own) for every seed, or with
    ``--warmup-per-seed`` the seed's (``warmup.seed`` = the seed: other demonstrations, in another order)."""
    if not args.warmup_per_seed:
        return dict.fromkeys(seeds, base)
    return {seed: load_config(args.config, [*overrides, f"warmup.seed={seed}"]) for seed in seeds}


def preset_files(args: argparse.Namespace) -> dict[str, Path]:
    """Each ``--presets`` name's file under ``--preset-dir``; a name without a file, or a ``--baseline`` that is
    not a preset, is refused."""
    presets = {name: Path(args.preset_dir) / f"{name}.yaml" for name in args.presets}
    if missing := [name for name, path in presets.items() if not path.is_file()]:
        known = sorted(p.stem for p in Path(args.preset_dir).glob("*.yaml"))
        raise InputError(f"--presets: no file for {', '.join(missing)} in {args.preset_dir}; known: {', '.join(known)}")
    if args.baseline not in presets and args.baseline != BASELINE:
        raise InputError(f"--baseline {args.baseline}: not one of --presets ({','.join(args.presets)})")
    return presets


def preset_config(args: argparse.Namespace, path: Path, overrides: list[str], seed: int, run_dir: Path):
    """The config of one (preset, seed) run: the preset file over ``--config``, ``overrides``, then the bench's own
    settings (its rounds, checkpoints every ``--eval-every``, no evaluations of its own)."""
    return scaled_stages(load_config(path, base=args.config, overrides=[
        *overrides, "warmup.enabled=false", f"run.seed={seed}", f"run.rounds={args.rounds}",
        f"run.output_dir={run_dir}", "eval.before_training=false", "eval.after_training=false",
        "eval.every_rounds=0", f"checkpoint.every_rounds={args.eval_every}", "telemetry.wandb_mode=disabled",
    ]), args.rounds)


def check_runs(args: argparse.Namespace, presets: dict[str, Path], overrides: list[str]) -> None:
    """Load every preset's config and run ``train``'s checks on it (question files, index, encoder, engine) before
    the warm-up trains: a bad preset, key or file fails in seconds, and every problem is listed once. The warm-up
    a run starts from does not exist yet, so each is checked with the config's own policy; the warm-up's own inputs
    are checked as ``warmup`` checks them."""
    problems = Problems()
    with problems.check():
        warmup_preflight(load_config(args.config, overrides))  # the warm-up every run starts from
    for path in presets.values():
        with problems.check():
            preflight(preset_config(args, path, overrides, args.seeds[0], Path(args.out) / "runs" / "check"))
    if problems.found:
        raise InputErrors(list(dict.fromkeys(problems.found)))  # presets over one base share most problems


class KeptTables(RootModel[dict[str, TableRecord]]):
    """An evaluation this bench keeps (``*-<tag>`` in ``--out``, ``<tag>`` beside a checkpoint): each set's table."""


def kept_tables(path: Path) -> dict[str, dict[str, Any]]:
    """Each set's table kept at ``path``, read through the evaluation file's schema."""
    return {name: json.loads(EvalTable.from_record(table).to_json())
            for name, table in read_record(path, KeptTables, KEPT_TABLES).root.items()}


def check_kept_tables(out: Path, tag: str) -> None:
    """Every evaluation a stopped run of this bench kept in ``out`` and this run would reuse, read before the
    warm-up trains: a damaged or hand-made one is an error naming the file and the field."""
    found: list[str] = []
    for path in sorted(out.rglob(f"*{tag}")) if out.is_dir() else []:
        try:
            kept_tables(path)
        except InputError as e:
            found += [f"{problem}; remove it to evaluate again" for problem in e.problems]
    if found:
        raise InputErrors(found)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.config = base_config(args)
    presets = preset_files(args)
    seeds = args.seeds
    overrides = [*args.overrides, *([f"data.world={args.world}"] if args.world else [])]
    common = [*overrides, f"eval.max_questions={args.eval_questions}", "warmup.enabled=false"]
    base = load_config(args.config, overrides)
    split = "" if args.split == "test" else f"-{args.split}"  # test's tag as before: archived runs resume
    tag = f"bench-eval{split}-q{args.eval_questions}-ood{args.ood_seed}.json"
    check_kept_tables(Path(args.out), tag)
    check_runs(args, presets, overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    warm = {seed: str(warmup.warmed_up_policy(config))
            for seed, config in warmup_configs(args, base, overrides, seeds).items()}
    sets = {
        world_set_name(base): load_config(args.config, common),
        "ood": load_config(
            args.config, [*common, f"data.world_seed={args.ood_seed}", "data.world_phrasing=paraphrase"]
        ),
    }

    def evaluate(policy: str, adapter: Path | None, cache: Path, oracle: bool = False) -> dict[str, dict[str, Any]]:
        """Every set's table, kept in ``cache`` so that a bench run that stopped resumes where it was, and a
        cached policy's (the warm-up's) in the cache root too, for every bench run after
        (:mod:`bridge_ray.evaluation.cache`)."""
        if cache.is_file():
            return kept_tables(cache)
        tables = {}
        for name, config in sets.items():
            if oracle:
                config = derive(config, {"eval.oracle_retrieval": True}, source="bench learn's oracle evaluation")
            held_out = {name: str(configured_world(config) / f"{args.split}.jsonl")}
            tables[name], _ = cached_table(
                config, held_out, policy, adapter, index_dir(config), "local",
                lambda c=config, h=held_out: json.loads(
                    local_eval.evaluate_policy(c, h, policy=policy, adapter=adapter).to_json()))
        write_text_atomic(cache, json.dumps(tables))
        return tables

    start_points, curve = {}, []
    for seed, policy in warm.items():
        if policy in start_points:  # the seeds share it
            continue
        print(f"round 0: evaluating the warm-up policy {policy}, with the frozen retriever and with the oracle",
              flush=True)
        start_points[policy] = evaluate(policy, None, out / f"{Path(policy).name}-{tag}")
        oracle = evaluate(policy, None, out / f"{Path(policy).name}-oracle-{tag}", oracle=True)
        oracle_seed = seed if args.warmup_per_seed else None  # a shared warm-up's oracle belongs to no seed
        curve += [_point(ORACLE, oracle_seed, 0, name, table) for name, table in oracle.items()]
    rounds, plans, last_tables = [], {}, {}
    trained: dict[str, Any] = {}  # a run's config without its output folders -> the first config that ran it
    for preset, path in presets.items():
        for seed in seeds:
            run_dir = out / "runs" / f"{preset}-seed{seed}"
            config = preset_config(args, path, [*overrides, f"policy.model={warm[seed]}"], seed, run_dir)
            plans[preset] = {"file": str(path), "stages": [
                {**stage.model_dump(), "gamma": json_gamma(stage.gamma)} for stage in config.stages]}
            lengths = [stage.rounds for stage in config.stages] or [config.run.rounds]
            print(f"== {preset} seed {seed}: {' + '.join(map(str, lengths))} rounds "
                  f"({time.time() - started:.0f} s)", flush=True)
            points, start, offset = {0: start_points[warm[seed]]}, None, 0
            for index in range(len(lengths)):  # a staged preset's stages end to end, each from the one before
                run_config = stage_config(config, index, start) if config.stages else config
                run_config = derive(run_config, {"checkpoint.keep": run_config.run.rounds // args.eval_every + 1},
                                    source="bench learn --eval-every")  # every evaluated checkpoint
                same = trained.setdefault(_run_key(run_config), run_config)
                if same is not run_config:
                    print(f"   {run_config.run.output_dir}: the same run as {same.run.output_dir}", flush=True)
                    run_config = same
                start = checkpoint_start(_train(run_config))
                rounds += [{"preset": preset, "seed": seed, **r, "round": r["round"] + offset}
                           for r in _round_figures(Path(run_config.run.output_dir) / "phases.jsonl")]
                for checkpoint in sorted(checkpoint_root(run_config).glob("round-*")):
                    ending = checkpoint_start(checkpoint)
                    points[offset + int(checkpoint.name.split("-")[1])] = evaluate(
                        ending.policy, Path(ending.adapter) if ending.adapter else None, checkpoint / tag
                    )
                offset += run_config.run.rounds
            curve += [_point(preset, seed, r, name, table) for r, tables in sorted(points.items())
                      for name, table in tables.items()]
            last_tables[preset, seed] = points[max(points)]
    last = _last_rounds(curve)
    final = [p for p in curve if p["round"] == last[p["preset"]]]
    results = {
        "command": " ".join(["python -m bridge_ray bench learn", *sys.argv[3:]]),
        "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - started),
        "warmup_policy": warm[seeds[0]] if len(set(warm.values())) == 1 else warm,
        "warmup_per_seed": args.warmup_per_seed, "presets": plans, "seeds": seeds, "sets": list(sets),
        "rounds_per_run": args.rounds, "eval_questions": args.eval_questions, "split": args.split,
        "baseline": args.baseline, "cpu_kernels": cpu_kernels(),
        "final": final, "paired": paired_rows(last_tables, list(sets), args.baseline),
        "final_questions": final_questions(last_tables, list(sets)), "curve": curve, "rounds": rounds,
    }
    write_text_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_text_atomic(out / "results.md", results_markdown(results) + "\n")
    plot_curves(results, out / "curves.png", ORACLE)
    print(results_markdown(results), flush=True)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'curves.png'} ({time.time() - started:.0f} s)")
    return 0


def paired_rows(
    last_tables: dict[tuple[str, int], dict[str, Any]], sets: list[str], baseline: str = BASELINE
) -> list[dict[str, Any]]:
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


def final_questions(last_tables: dict[tuple[str, int], dict[str, Any]], sets: list[str]) -> list[dict[str, Any]]:
    """Each (preset, seed, set)'s per-question ``uid``, ``em`` and ``recall`` at its last evaluation: what
    :func:`paired_rows` pairs, kept so that its intervals can be computed again from ``results.json``."""
    return [{"preset": preset, "seed": seed, "set": name,
             **{key: tables[name]["questions"][name][key] for key in ("uid", "em", "recall")}}
            for (preset, seed), tables in last_tables.items() for name in sets]


def scaled_stages(config, rounds: int):
    """A staged preset with its first stage ``rounds`` long and the others scaled in proportion to the file's
    rounds (at least 1 each), so every preset's first run is as long; a preset without stages as it is."""
    if not config.stages:
        return config
    scale = rounds / config.stages[0].rounds
    return derive(config, {f"stages.{i}.rounds": max(1, round(stage.rounds * scale))
                           for i, stage in enumerate(config.stages)}, source="bench learn --rounds")


def _run_key(config) -> str:
    """``config`` without the folders it writes to: two runs with the same key train the same thing."""
    return json.dumps(settings_without_folders(config), sort_keys=True)


def _train(config) -> Path:
    """Run ``config``'s rounds (a :class:`Run` without ``train``'s checks and evaluations: the bench made its own
    checks and evaluates every checkpoint) unless a previous bench run finished it, resuming an unfinished one; its
    final checkpoint."""
    checkpoints = checkpoint_root(config)
    final = checkpoints / f"round-{config.run.rounds:08d}"
    if not final.is_dir():
        with Run(config, resume=(checkpoints / LATEST).is_file()) as run:
            run.connect()
            run.start()
            run.train()
    return final


def _round_figures(phases: Path) -> list[dict[str, Any]]:
    """Each round's rollout figures, from the reward phase of ``phases.jsonl`` (the last attempt of a redone round)."""
    rows = {}
    for line in phases.read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") == "reward":
            info = record.get("info", {})
            rows[record["round"]] = {k: v for k, v in info.items() if isinstance(v, int | float)}
    return [{"round": r + 1, **figures} for r, figures in sorted(rows.items())]


def _point(preset: str, seed: int, round_index: int, name: str, table: dict) -> dict[str, Any]:
    """One evaluation: overall EM / F1 / recall@3 of a set, and per question type."""
    rows = {row["name"]: row for row in table["rows"]}
    main = rows[name]
    point = {"preset": preset, "seed": seed, "round": round_index, "set": name,
             "em": main["em"], "f1": main["f1"], "recall_at_3": main["recall"]}
    for key, row in rows.items():
        if key.startswith(f"{name}/"):
            kind = key.split("/", 1)[1]
            point |= {f"{kind}/em": row["em"], f"{kind}/f1": row["f1"], f"{kind}/recall_at_3": row["recall"]}
    return point


def _last_rounds(curve: list[dict[str, Any]]) -> dict[str, int]:
    """Each preset's last evaluated round (a staged preset's curve runs longer)."""
    last: dict[str, int] = {}
    for p in curve:
        last[p["preset"]] = max(last.get(p["preset"], 0), p["round"])
    return last


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {std:.1f}"


def results_markdown(results: dict[str, Any]) -> str:
    """Mean ± std over seeds at round 0 (the warm-up) and at the last round, per preset and set, and the oracle's;
    each preset's gain over the fixed retriever; the paired differences; the rewards of the first and last rounds."""
    curve, sets = results["curve"], results["sets"]
    last = _last_rounds(curve)
    kinds = sorted({k.split("/")[0] for p in curve for k in p if "/" in k})
    metrics = ["em", "f1", "recall_at_3", *[f"{k}/em" for k in kinds], *[f"{k}/recall_at_3" for k in kinds]]
    start = "each seed's own warm-up" if results.get("warmup_per_seed") else "one warm-up checkpoint"
    lines = [
        f"{len(results['seeds'])} seeds, {results['rounds_per_run']} RL rounds per run from {start}; "
        f"{results['eval_questions']} questions per set ({results.get('split', 'test')} split); mean ± std over seeds.",
        "",
        "| preset | round | set | " + " | ".join(metrics) + " |",
        "|---|---:|---|" + "---:|" * len(metrics),
    ]
    for preset in [*results["presets"], ORACLE]:
        for round_index in sorted({0, last.get(preset, 0)}):
            for name in sets:
                rows = [p for p in curve if p["preset"] == preset and p["round"] == round_index and p["set"] == name]
                if rows:
                    cells = [_mean_std([r[m] for r in rows if r.get(m) is not None]) for m in metrics]
                    shown = "warm-up" if round_index == 0 else str(round_index)
                    label = f"{ORACLE} (warm-up policy, gold passages shown)" if preset == ORACLE else preset
                    lines.append(f"| {label} | {shown} | {name} | " + " | ".join(cells) + " |")
    lines += _gains_over_baseline(curve, results["presets"], last, sets, results.get("baseline", BASELINE))
    lines += _paired_table(results.get("paired", []))
    rewards = results["rounds"]
    if rewards:
        lines += ["", "| preset | mean reward, first round | mean reward, last round | zero-variance groups |",
                  "|---|---:|---:|---:|"]
        for preset in results["presets"]:
            rows = [r for r in rewards if r["preset"] == preset]
            if not rows:
                continue
            first = [r["reward"] for r in rows if r["round"] == 1]
            final = [r["reward"] for r in rows if r["round"] == max(x["round"] for x in rows)]
            zero = [r.get("zero_variance_groups") for r in rows if r.get("zero_variance_groups") is not None]
            lines.append(f"| {preset} | {statistics.mean(first):.3f} | {statistics.mean(final):.3f} | "
                         f"{statistics.mean(zero) if zero else float('nan'):.2f} |")
    return "\n".join(lines)


def _paired_table(paired: list[dict[str, Any]]) -> list[str]:
    """The paired rows: preset − baseline per set and seed, EM and recall@3 with their 95% intervals and what each
    interval resamples (a file written before two-level intervals holds question-level ones)."""
    if not paired:
        return []
    lines = ["", "| preset − baseline | set | seed | questions | EM diff [95% CI] | recall@3 diff [95% CI] | "
             "interval over |", "|---|---|---|---:|---:|---:|---|"]
    for r in paired:
        recall = "–" if r.get("diff_recall_at_3") is None else (
            f"{r['diff_recall_at_3']:+.1f} [{r['recall_ci_low']:+.1f}, {r['recall_ci_high']:+.1f}]")
        lines.append(f"| {r['preset']} − {r['baseline']} | {r['set']} | {r['seed']} | {r['questions']} | "
                     f"{r['diff_em']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}] | {recall} | "
                     f"{r.get('interval', QUESTION_LEVEL)} |")
    return lines


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

    lines = ["", "| preset (its last round) | " + " | ".join(f"{name} {metric}" for name, metric in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for preset in presets:
        cells = []
        for name, metric in columns:
            value, base = mean(preset, name, metric), mean(baseline, name, metric)
            gain = "" if preset == baseline or value is None or base is None else f" ({value - base:+.1f})"
            cells.append("–" if value is None else f"{value:.1f}{gain}")
        lines.append(f"| {preset} ({last.get(preset, 0)}) | " + " | ".join(cells) + " |")
    return lines
