"""A training job: what ``bridge-ray train`` runs once its arguments are parsed.

A job is one run of the config (:class:`bridge_ray.train.run.Run`, which checks every input before Ray starts,
connects to Ray, checks that the cluster holds the graph, and drives one coordinator, one actor graph, through the
evaluation before training, the rounds and the evaluation after them), or the ``stages:`` schedule
(:mod:`bridge_ray.train.stages`), each stage a run of its own. Which stages a re-run skips or resumes is decided
by the pure function :func:`plan_stages`.

Why a job can start more than one graph: a graph serves one policy, and its actors load it when they start.

- The warm-up (cold-start SFT) runs as a Ray task with one policy learner rank's resources, which a live graph
  holds (on a cluster sized for the graph the task would wait forever), and the training graph's samplers and
  learner (its KL reference too) load the warmed-up policy. So the evaluation of the base policy before the
  warm-up (``eval.before_training`` with ``warmup.enabled``) has a graph of its own, ended before the warm-up
  starts. Serving the base policy from the training graph instead would need samplers started from another
  model than the learner and a version-0 weight push, which a LoRA policy (it syncs only its adapter) cannot
  do, and the warm-up tables would then come from pushed rather than loaded weights.
- Each stage of a schedule starts from another policy and adapter, trains other roles (the retriever learner
  exists only in a stage that trains the retriever) and starts fresh optimizer states and a fresh round
  counter: the coordinator and its learners are per stage, so each stage is a run with its graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from bridge_ray.checkpoint import POLICY_DIR, CheckpointManager, checkpoint_root, find_checkpoint
from bridge_ray.config import Config, derive
from bridge_ray.errors import InputError, Problems
from bridge_ray.evaluation.table import read_table
from bridge_ray.train.preflight import check_adapter
from bridge_ray.train.run import Run, report_resources
from bridge_ray.train.run_evals import EVAL_AFTER
from bridge_ray.train.run_folder import JobFlags, check_seed, previous_run, remove_run
from bridge_ray.train.stages import (
    STAGES_DIR,
    StageLog,
    StageRecord,
    StartPoint,
    checkpoint_start,
    stage_config,
    stage_outputs,
)


def run_job(config: Config, flags: JobFlags) -> None:
    """The job of ``config``: its ``stages:`` schedule, else one run."""
    if config.stages:
        run_stages(config, flags)
    else:
        run_once(config, flags)


def run_once(config: Config, flags: JobFlags) -> Path | None:
    """One run of ``config`` (:meth:`Run.execute`); returns its final checkpoint (None under ``--dry-run``)."""
    run = Run(config, flags)
    if flags.dry_run:
        run.dry_run()
        return None
    with run:
        return run.execute()


# ---- schedules -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageStep:
    """One stage of a schedule as a job takes it: skipped (``record``: it finished) or run, resumed from the
    stage's own last checkpoint when ``resume``."""

    index: int
    record: StageRecord | None
    resume: bool


def plan_stages(
    names: list[str], finished: list[StageRecord | None], checkpointed: set[int], recorded: bool, flags: JobFlags,
    log_path: Path, stages_dir: Path,
) -> list[StageStep]:
    """Which stages a job skips and which it resumes: ``finished`` holds each stage's record (None: unfinished),
    ``checkpointed`` the stages holding a checkpoint, ``recorded`` whether ``log_path`` records any stage.

    A finished stage is skipped; ``--resume`` / ``--auto-resume`` continue an unfinished one from its last
    checkpoint. ``--resume`` with nothing to continue is an error, and so is a finished stage after an unfinished
    one (the later stage did not start from the earlier one's end).
    """
    if flags.resume and not recorded and not checkpointed:
        raise InputError(f"--resume: no finished stage in {log_path} and no stage checkpoint under {stages_dir}; "
                         "pass --auto-resume to start when there is none")
    first_unfinished = next((i for i, record in enumerate(finished) if record is None), len(finished))
    if later := [r.name for r in finished[first_unfinished:] if r is not None]:
        raise InputError(f"{log_path} records {', '.join(later)} finished, but stage {names[first_unfinished]!r} "
                         "before it did not finish: pass --overwrite to run the schedule again")
    return [StageStep(i, record, record is None and flags.continues and i in checkpointed)
            for i, record in enumerate(finished)]


def stage_starts(config: Config) -> dict[int, StartPoint]:
    """The stages that start from a given checkpoint (not ``previous``), each checked whole, of ``run.seed`` and
    with a query adapter of ``retrieval.encoder``, before Ray starts (a later stage's start otherwise fails only
    once the stages before it have trained)."""
    starts = {}
    for i, stage in enumerate(config.stages):
        if stage.start != "previous":
            checkpoint, manifest = find_checkpoint(stage.start, f"stages.{i}.start", model=POLICY_DIR)
            check_seed(checkpoint, manifest, config.run.seed, f"stages.{i}.start",
                       "a stage continues the question order of the run it starts from: set that run's seed")
            starts[i] = checkpoint_start(checkpoint)
            if starts[i].adapter is not None:
                check_adapter(starts[i].adapter, config.retrieval.encoder.spec(), f"stages.{i}.start")
    return starts


def stage_flags(flags: JobFlags, step: StageStep) -> JobFlags:
    """The flags of a stage's run: it resumes its own checkpoint or starts; ``--overwrite`` removed the schedule's
    runs before the first stage (a dry run only reports what it would remove, stage by stage)."""
    return replace(flags, resume=step.resume, auto_resume=False, overwrite=flags.overwrite and flags.dry_run)


def planned_stages(config: Config, flags: JobFlags, log: StageLog, outputs: list[Config]) -> list[StageStep]:
    """:func:`plan_stages` over what the schedule's folders hold; under ``--overwrite``, over nothing (the real
    run has removed it all by then)."""
    order, stages_dir = [stage.name for stage in config.stages], Path(config.run.output_dir) / STAGES_DIR
    if flags.overwrite:
        return plan_stages(order, [None] * len(order), set(), False, flags, log.path, stages_dir)
    checkpointed = {i for i, out in enumerate(outputs) if CheckpointManager(checkpoint_root(out), keep=1).latest()}
    return plan_stages(order, [log.finished(stage) for stage in config.stages], checkpointed, bool(log.records),
                       flags, log.path, stages_dir)


def dry_run_stages(config: Config, flags: JobFlags, starts: dict[int, StartPoint], steps: list[StageStep]) -> None:
    """``--dry-run`` of a schedule: the checks the first stage to run makes before Ray (:meth:`Run.claim` of its
    config, as :func:`run_once` makes them) and every stage's resource report, every problem at once."""
    problems = Problems()
    if step := next((step for step in steps if step.record is None), None):
        before = steps[step.index - 1].record if step.index else None
        start = starts.get(step.index) or (before and StartPoint(before.policy, before.adapter, before.checkpoint))
        print(f"stage {config.stages[step.index].name}, the first to run:")
        with problems.check():
            Run(stage_config(config, step.index, start), stage_flags(flags, step)).claim()
    report_resources(config, problems, {
        f"stage {stage.name} (train {stage.train}):": derive(
            config, {"algorithm": stage.algorithm(config.algorithm).model_dump()}, source=f"stage {stage.name}")
        for stage in config.stages
    })
    problems.raise_any()


def remove_stages(log: StageLog, outputs: list[Config]) -> None:
    """``--overwrite`` of a schedule: every stage's run and the stages record."""
    held = [f"stage {out.run.output_dir}: {h}" for out in outputs if (h := previous_run(out)) is not None]
    for out in outputs:
        remove_run(out)
    if log.records:
        held.append(str(log.path))
    log.remove()
    print(f"--overwrite: removed {'; '.join(held) or 'nothing'}")


def run_stages(config: Config, flags: JobFlags) -> None:
    """The ``stages:`` schedule: each stage a run of its own under ``<run.output_dir>/stages/<name>``, from the
    previous stage's final policy and adapter, continuing its question order (:mod:`bridge_ray.train.stages`).
    A stage recorded in ``stages.json`` is skipped; ``--resume`` / ``--auto-resume`` continue the first unfinished
    one from its last checkpoint, ``--overwrite`` starts the whole schedule over (:func:`plan_stages`)."""
    starts = stage_starts(config)
    log = StageLog(config.run.output_dir)
    outputs = [stage_outputs(config, stage) for stage in config.stages]
    steps = planned_stages(config, flags, log, outputs)
    if flags.dry_run:
        dry_run_stages(config, flags, starts, steps)
        return
    if flags.overwrite:
        remove_stages(log, outputs)
    order = [stage.name for stage in config.stages]
    start = None
    for step in steps:
        stage, record = config.stages[step.index], step.record
        start = starts.get(step.index, start)
        if record is None:
            stage_run = stage_config(config, step.index, start)
            print(f"\n== stage {step.index + 1}/{len(order)} {stage.name}: train {stage.train}, {stage.rounds} rounds, "
                  f"from {start.policy if start else 'the configured policy'}", flush=True)
            checkpoint = run_once(stage_run, stage_flags(flags, step))
            after = Path(stage_run.run.output_dir) / f"{EVAL_AFTER.name}.json"
            table = json.loads(read_table(after).to_json()) if after.is_file() else None  # through its schema
            record = StageRecord.of(stage, checkpoint, table)
            log.add(record, order)
        else:
            print(f"== stage {stage.name}: finished ({record.rounds} rounds, {record.checkpoint}); skipped")
        start = StartPoint(record.policy, record.adapter, record.checkpoint)
    records = [log.records[name] for name in order]
    print(f"\n## stages ({log.path})\n\n{stages_markdown(records)}\n", flush=True)


def stages_markdown(records: list[StageRecord]) -> str:
    """One row per finished stage: what trained, γ, rounds, the final checkpoint and, when evaluated, its EM."""
    lines = ["| stage | train | γ | rounds | final checkpoint | EM (avg) |", "|---|---|---:|---:|---|---:|"]
    for r in records:
        em = "–" if not r.eval or r.eval.get("avg") is None else f"{r.eval['avg']:.1f}"
        gamma = "config" if r.gamma is None and r.train != "policy" else ("–" if r.gamma is None else r.gamma)
        lines.append(f"| {r.name} | {r.train} | {gamma} | {r.rounds} | {r.checkpoint} | {em} |")
    return "\n".join(lines)
