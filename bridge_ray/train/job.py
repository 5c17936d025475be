"""A training job: what ``bridge-ray train`` runs once its arguments are parsed.

A job is one run of the config, or the ``stages:`` schedule (:mod:`bridge_ray.train.stages`), each stage a run
of its own. A run checks every input before Ray starts (the folder it writes, the checkpoint it resumes or
continues, the question files; all problems at once), then connects to Ray, checks that the cluster holds the
graph, and drives one coordinator (one actor graph) through the evaluation before training, the rounds and the
evaluation after them. Which checkpoint a run resumes, what ``--overwrite`` removes and which stages a re-run
skips are decided by the pure functions :func:`claim_action`, :func:`wants_resume` and :func:`plan_stages`.

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

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

import ray

from bridge_ray.checkpoint import (
    LATEST,
    POLICY_DIR,
    CheckpointError,
    CheckpointManager,
    Manifest,
    checkpoint_root,
    find_checkpoint,
    load_manifest,
)
from bridge_ray.config import Config, derive
from bridge_ray.errors import InputError, Problems, refuse_existing_output, refuse_unwritable
from bridge_ray.evaluation.paired_report import paired_markdown, paired_rows
from bridge_ray.evaluation.table import EvalTable, combined, read_table
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.runtime.auth import init_ray
from bridge_ray.runtime.calls import ActorLost, run_task
from bridge_ray.train.capacity import report_capacity, report_machine, require_graph_capacity
from bridge_ray.train.coordinator_actor import CoordinatorHandle, start_coordinator
from bridge_ray.train.preflight import check_adapter, check_same_run, preflight
from bridge_ray.train.stages import (
    STAGES_DIR,
    StageLog,
    StageRecord,
    StartPoint,
    checkpoint_start,
    stage_config,
    stage_outputs,
)
from bridge_ray.train.timings import ROUNDS, TIMINGS_FILE, JobTimings, timings_markdown
from bridge_ray.train.warmup import warmed_up_policy


class Evaluation(NamedTuple):
    """One of a run's evaluations: its files (``<name>.md`` / ``.json``), its column in the stage table and its
    label in ``eval.jsonl``."""

    name: str
    column: str
    label: str


EVAL_BEFORE = Evaluation("eval_before", "base", "before")
EVAL_WARMUP = Evaluation("eval_warmup", "warm-up", "warmup")
EVAL_AFTER = Evaluation("eval_after", "after RL", "after")
EVALUATIONS = (EVAL_BEFORE, EVAL_WARMUP, EVAL_AFTER)
# The logs that mark run.output_dir as a run's, and every file a run writes there (its checkpoints aside).
RUN_LOGS = ("phases.jsonl", "eval.jsonl")
RUN_FILES = (
    *RUN_LOGS, "config.yaml", "eval_stages.md", TIMINGS_FILE,
    *(f"{e.name}.{ext}" for e in EVALUATIONS for ext in ("md", "json")),
)


@dataclass(frozen=True)
class JobFlags:
    """How a job treats what an earlier run left in ``run.output_dir`` (``train``'s flags; at most one of
    ``resume``, ``auto_resume`` and ``overwrite``)."""

    resume: bool = False  # continue from the last complete checkpoint; an error when there is none
    auto_resume: bool = False  # continue from it if there is one, else start
    overwrite: bool = False  # remove the earlier run first
    dry_run: bool = False  # check inputs and resources; start no actor

    @property
    def continues(self) -> bool:
        return self.resume or self.auto_resume

    @property
    def resume_flag(self) -> str:
        return "--resume" if self.resume else "--auto-resume"


# ---- decisions (pure) ----------------------------------------------------------------------------------


def claim_action(held: str | None, flags: JobFlags) -> Literal["none", "refuse", "report", "remove"]:
    """What a new run does about ``held``, what an earlier run left in its folder (None: nothing): a continued run
    or an empty folder needs nothing; another run's folder is refused unless ``--overwrite`` removes it (only
    reports it under ``--dry-run``). A new run among old checkpoints would number its rounds from 0 among them,
    prune them by round and append to their logs."""
    if flags.continues or held is None:
        return "none"
    if not flags.overwrite:
        return "refuse"
    return "report" if flags.dry_run else "remove"


def wants_resume(flags: JobFlags, latest: Path | None, root: Path) -> bool:
    """Whether the run continues from ``latest``, its last complete checkpoint under ``root`` (None: none):
    ``--resume`` without one is an error, ``--auto-resume`` without one starts."""
    if flags.resume and latest is None:
        raise InputError(
            f"--resume: no complete checkpoint under {root}; pass --auto-resume to start a new run when there is none"
        )
    return latest is not None and flags.continues


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


@dataclass(frozen=True)
class RunEvaluations:
    """The evaluations a run makes: the base policy's, through a graph of its own before the warm-up (``base``),
    and the training graph's before and after the rounds; None where it makes none."""

    base: Evaluation | None
    before: Evaluation | None
    after: Evaluation | None


def run_evaluations(config: Config, resume: bool) -> RunEvaluations:
    """``eval.before_training`` evaluates the policy the rounds start from (the warmed-up one with the warm-up,
    and the base policy first unless ``eval.base_policy`` is false) unless the run resumes;
    ``eval.after_training`` the policy they end with."""
    before, warmup = config.eval.before_training and not resume, config.warmup.enabled
    return RunEvaluations(
        base=EVAL_BEFORE if before and warmup and config.eval.base_policy else None,
        before=(EVAL_WARMUP if warmup else EVAL_BEFORE) if before else None,
        after=EVAL_AFTER if config.eval.after_training else None,
    )


def round_span(rounds: list[int]) -> str:
    """``round 3``, ``rounds 248-250`` or ``rounds 3, 249, 250``."""
    if len(rounds) == 1:
        return f"round {rounds[0]}"
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"rounds {rounds[0]}-{rounds[-1]}"
    return "rounds " + ", ".join(map(str, rounds))


# ---- the folder and the checkpoint a run starts from ---------------------------------------------------


def previous_run(config: Config) -> str | None:
    """What a run left where this one writes (its checkpoints' rounds, its logs), or None when nothing."""
    held, root = [], checkpoint_root(config)
    if rounds := CheckpointManager(root, keep=1).rounds():
        held.append(f"checkpoints of {round_span(rounds)} (in {root})")
    if logs := [name for name in RUN_LOGS if (Path(config.run.output_dir) / name).is_file()]:
        held.append(f"logs ({', '.join(logs)})")
    return " and ".join(held) or None


def remove_run(config: Config) -> None:
    """The artifacts of the run in ``run.output_dir``: its checkpoints and the files of ``RUN_FILES``; files that
    no run writes stay."""
    CheckpointManager(checkpoint_root(config), keep=1).clear()
    for name in RUN_FILES:
        (Path(config.run.output_dir) / name).unlink(missing_ok=True)


def claim_output(config: Config, flags: JobFlags) -> None:
    """Make ``run.output_dir`` this run's before Ray starts (:func:`claim_action`)."""
    held = previous_run(config)
    action = claim_action(held, flags)
    if action == "refuse":
        raise refuse_existing_output(
            config.run.output_dir, f"another run's {held}", "pass --resume to continue it, or --overwrite to replace it"
        )
    if action == "report":
        print(f"--overwrite: would remove {held}")
    elif action == "remove":
        remove_run(config)
        print(f"--overwrite: removed {held}")


def check_seed(checkpoint: Path, manifest: Manifest, seed: int, flag: str, advice: str) -> None:
    """An error naming ``flag`` when ``checkpoint``'s question order was drawn from another ``run.seed``."""
    saved_seed = manifest.data_cursor.get("seed", seed)
    if saved_seed != seed:
        raise InputError(f"{flag}: {checkpoint} was trained with run.seed={saved_seed}, the config says {seed}; "
                         + advice)


def check_continued(config: Config) -> None:
    """``run.continue_from``, before Ray starts: a checkpoint, whole, of this run's ``run.seed``."""
    if config.run.continue_from is not None:
        checkpoint, manifest = find_checkpoint(config.run.continue_from, "run.continue_from")
        check_seed(checkpoint, manifest, config.run.seed, "run.continue_from",
                   "a run continues the question order of a run of its own seed")


def resuming(config: Config, flags: JobFlags) -> bool:
    """Whether the run continues from its latest checkpoint (:func:`wants_resume`), checked whole before Ray
    starts: a damaged one, or one of another seed or model, is an error naming the folder or the file."""
    root = checkpoint_root(config)
    latest = CheckpointManager(root, keep=1).latest()
    if not wants_resume(flags, latest, root):
        return False
    try:
        manifest = load_manifest(latest)
    except CheckpointError as exc:
        raise InputError(f"{flags.resume_flag}: {exc}") from None
    check_seed(latest, manifest, config.run.seed, flags.resume_flag,
               "resume with the run's own seed, or start a new run")
    check_same_run(latest, config, flags.resume_flag)
    return True


def checked_start(config: Config, flags: JobFlags) -> bool:
    """Every check of the run's inputs, before Ray starts, all problems reported at once; then ``run.output_dir``
    is claimed (``--overwrite`` removes the old run only once nothing else is wrong). Returns whether it resumes."""
    problems, resume = Problems(), False
    with problems.check():
        for line in preflight(config):
            print(line)
    with problems.check():
        refuse_unwritable(Path(config.run.output_dir), "run.output_dir")
    with problems.check():
        check_continued(config)
    with problems.check():
        resume = resuming(config, flags)
    if not flags.overwrite:  # only a refusal: taking over the folder waits for the other checks
        with problems.check():
            claim_output(config, flags)
    problems.raise_any()
    if flags.overwrite:
        claim_output(config, flags)
    return resume


# ---- Ray -----------------------------------------------------------------------------------------------

def connect(address: str | None) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running local cluster), else start a local instance; print where
    its dashboard is and, under Ray's token authentication, how to get the token the dashboard asks for."""
    if ray.is_initialized():
        return
    context = init_ray(address, dashboard_host="127.0.0.1", log_to_driver=True)
    info = getattr(context, "address_info", None)  # a Ray Client (ray://) context has none
    for line in ray_lines(info["gcs_address"] if info else str(address), context.dashboard_url, token_auth_enabled()):
        print(line, flush=True)


def ray_lines(gcs_address: str, dashboard_url: str | None, token_auth: bool) -> list[str]:
    """The lines ``connect`` prints: the cluster, its dashboard, and where its token comes from."""
    dashboard = f"http://{dashboard_url}" if dashboard_url and "://" not in dashboard_url else dashboard_url
    lines = [f"Ray: {gcs_address}; dashboard: {dashboard or 'none (Ray started without it)'}"]
    if token_auth:
        lines.append("  token authentication is on: the dashboard asks for the token that `ray get-auth-token` "
                     "prints (on the head node, or wherever RAY_AUTH_TOKEN / ~/.ray/auth_token holds it)")
    return lines


def token_auth_enabled() -> bool:
    """Whether this Ray connection uses token authentication (``RAY_AUTH_MODE=token``, or Ray 2.60's default
    where a token exists)."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    return is_token_auth_enabled()


def shut_down(coordinator: CoordinatorHandle) -> None:
    """End the coordinator's graph. A coordinator that died took its actors with it, and the error that killed it
    is already on its way up: asking it again would only print the same traceback a second time."""
    with contextlib.suppress(ActorLost):
        coordinator.shutdown()


def warmed_up(config: Config) -> Config:
    """``config`` with ``policy.model`` set to the warmed-up policy, trained (or found in the cache) in a Ray task
    with one learner rank's resources, so on a cluster it runs on a GPU node."""

    def warm_up(config: Config) -> str:
        return str(warmed_up_policy(config))

    path = run_task(warm_up, config, options=learner_rank_options(config), timeout_s=config.run.driver_timeout_s,
                    what="the warm-up task", limit="run.driver_timeout_s")
    return derive(config, {"policy.model": path}, source="the warm-up")


# ---- evaluations ---------------------------------------------------------------------------------------


def write_table(run_dir: Path, name: str, table: EvalTable) -> None:
    (run_dir / f"{name}.md").write_text(table.to_markdown() + "\n")
    (run_dir / f"{name}.json").write_text(table.to_json() + "\n")
    print(f"\n## {name.replace('_', ' ')}\n\n{table.to_markdown()}\n", flush=True)


def learner_rank_options(config: Config) -> dict[str, Any]:
    """The Ray options of a task that takes one policy learner rank's resources (and node pool)."""
    rank = config.roles.policy_learner
    return {"num_cpus": rank.cpus, "num_gpus": rank.gpus, "resources": rank.resources}


def graph_table(coordinator: CoordinatorHandle, evaluation: Evaluation) -> EvalTable:
    """One of the run's evaluations by ``coordinator``'s graph."""
    return coordinator.evaluate(evaluation.label)


def kept_graph_table(
    config: Config, run_dir: Path, evaluation: Evaluation, evaluate: Callable[[], EvalTable]
) -> EvalTable:
    """``evaluate()``: the graph's evaluation of ``config``'s policy before any round, or the table an earlier run
    kept where the policy and index are cache entries (:mod:`bridge_ray.evaluation.cache`; the base model and the
    warm-up, 7 of the warm demo's 25 minutes). A kept table is appended to ``eval.jsonl`` as the graph appends
    its own: a key exists only for a run's start, round 0 with both versions 0."""
    from bridge_ray.evaluation.cache import cached_table
    from bridge_ray.train.graph_eval import append_eval_record
    from bridge_ray.train.inputs import eval_files, index_dir

    table, kept = cached_table(config, eval_files(config), config.policy.model, config.retrieval.encoder.adapter,
                               index_dir(config), "graph", lambda: json.loads(evaluate().to_json()))
    if kept:
        append_eval_record(run_dir, EvalTable.from_json(table), label=evaluation.label, round=0, policy_version=0,
                           retriever_version=0)
    return EvalTable.from_json(table)


def world_config(config: Config, world: str) -> Config:
    """``config`` on the bundled ``world``: its held-out split over its own index, the first
    ``eval.worlds_max_questions`` of it (else ``eval.max_questions``). Its ``eval.worlds`` is empty (``world`` is
    its own) and its holders one per shard the world's index is built with."""
    limit = config.eval.worlds_max_questions or config.eval.max_questions
    return derive(config, {
        "data.world": world, "data.eval": {}, "eval.worlds": [], "eval.max_questions": limit,
        "retrieval.index.dir": None, "roles.shard_holder.count": None,
    }, source=f"eval.worlds: {world}")


def build_indexes(config: Config) -> None:
    """The run's index and those of ``eval.worlds``, built into the cache where they are not yet (else found),
    so that the run's timings show the build as a step of its own."""
    from bridge_ray.train.inputs import index_dir

    for each in (config, *(world_config(config, world) for world in config.eval.worlds)):
        index_dir(each)


def other_worlds(config: Config, policy: str, adapter: str | None) -> list[EvalTable]:
    """The held-out splits of ``eval.worlds``, each over its own index, greedily by ``policy`` with the query
    ``adapter``, in a Ray task with one learner rank's resources (so it runs while no graph holds them); a cached
    policy's with the base retriever kept in the cache root (:mod:`bridge_ray.evaluation.cache`)."""
    if not config.eval.worlds:
        return []

    def evaluate_worlds(config: Config, policy: str, adapter: str | None) -> list[EvalTable]:
        from bridge_ray.evaluation.cache import cached_table
        from bridge_ray.train.inputs import eval_files, index_dir
        from bridge_ray.train.local_eval import evaluate_policy

        tables = []
        for world in config.eval.worlds:
            on_world = world_config(config, world)
            files = eval_files(on_world)
            table, _ = cached_table(on_world, files, policy, adapter, index_dir(on_world), "local",
                                    lambda c=on_world, f=files: json.loads(evaluate_policy(
                                        c, f, policy=policy, adapter=Path(adapter) if adapter else None).to_json()))
            tables.append(EvalTable.from_json(table))
        return tables

    return run_task(evaluate_worlds, config, policy, adapter, options=learner_rank_options(config),
                    timeout_s=config.run.driver_timeout_s, what="the eval.worlds task", limit="run.driver_timeout_s")


def evaluate_base(config: Config, run_dir: Path) -> None:
    """The evaluation before the warm-up, through a graph of its own serving ``config``'s base policy (why: the
    module's docstring; none starts when the table is kept), and on ``eval.worlds`` once that graph has ended."""

    def on_its_graph() -> EvalTable:
        coordinator = start_coordinator(config)
        try:
            return graph_table(coordinator, EVAL_BEFORE)
        finally:
            shut_down(coordinator)

    table = kept_graph_table(config, run_dir, EVAL_BEFORE, on_its_graph)
    write_table(run_dir, EVAL_BEFORE.name, combined([table, *other_worlds(config, config.policy.model,
                                                                             config.retrieval.encoder.adapter)]))


def stage_table(run_dir: Path) -> str | None:
    """EM / F1 / recall of every data set and question type at each evaluated stage of this run, side by side."""
    tables = {e.column: json.loads(read_table(run_dir / f"{e.name}.json").to_json())
              for e in EVALUATIONS if (run_dir / f"{e.name}.json").is_file()}
    if len(tables) < 2:
        return None
    rows = [row["name"] for row in next(iter(tables.values()))["rows"]]
    lines = ["| data set | " + " | ".join(f"{label} EM / F1 / recall" for label in tables) + " |",
             "|---|" + "---:|" * len(tables)]
    for name in rows:
        cells = []
        for table in tables.values():
            row = next((r for r in table["rows"] if r["name"] == name), None)
            recall = "–" if row is None or row["recall"] is None else f"{row['recall']:.1f}"
            cells.append("–" if row is None else f"{row['em']:.1f} / {row['f1']:.1f} / {recall}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- runs ----------------------------------------------------------------------------------------------


def dry_run(config: Config, flags: JobFlags) -> None:
    """``--dry-run``: every check of the inputs and the graph's resource report, every problem at once."""
    problems = Problems()
    with problems.check():
        checked_start(config, flags)
    report_resources(config, problems, {"": config})
    problems.raise_any()


def report_resources(config: Config, problems: Problems, graphs: dict[str, Config]) -> None:
    """The resource report of each graph (a label to print before it, and its config), its shortfalls added to
    ``problems``. Ray is joined, or started, once the inputs passed or where a cluster is named (run.ray_address,
    RAY_ADDRESS other than ``local``); after failed inputs with none named, this machine's CPUs and GPUs stand in
    for a local Ray's, so a missing index still shows the GPUs the graph needs and the machine lacks, without
    starting Ray."""
    named = config.run.ray_address or os.environ.get("RAY_ADDRESS") not in (None, "", "local")
    joins = not problems.found or ray.is_initialized() or bool(named)
    if joins:
        with problems.check():
            connect(config.run.ray_address)
        if not ray.is_initialized():
            return
    for label, graph in graphs.items():
        if label:
            print(label)
        with problems.check():
            if joins:
                report_capacity(graph)
            else:
                report_machine(graph)


def run_job(config: Config, flags: JobFlags) -> None:
    """The job of ``config``: its ``stages:`` schedule, else one run."""
    if config.stages:
        run_stages(config, flags)
    else:
        run_once(config, flags)


def run_once(config: Config, flags: JobFlags) -> Path | None:
    """One run of ``config``; returns its final checkpoint (None under ``--dry-run``).

    In order: the checks, the policy's conversion and the indexes (each found in the cache once built), the base
    policy's evaluation (with the warm-up, through a graph of its own), the warm-up, then one graph for the
    evaluation before training, the rounds and the evaluation after them. ``eval.worlds`` join the evaluations
    from tasks run between graphs. A resumed run evaluates only after training. Each step's wall time goes to
    ``timings.json`` (:mod:`bridge_ray.train.timings`), printed as the run ends with the paired difference
    after − before training.
    """
    if flags.dry_run:
        dry_run(config, flags)
        return None
    run_dir = Path(config.run.output_dir)
    timings = JobTimings(run_dir)
    with timings.step("checks, worlds and Ray start"):  # written once they pass: a refused run leaves no file
        resume = checked_start(config, flags)
        connect(config.run.ray_address)
        require_graph_capacity(config)
    with timings.step("model conversion"):
        resolve_model_path(config.policy.model)
    with timings.step("indexes"):
        build_indexes(config)
    evaluations = run_evaluations(config, resume)
    if evaluations.base is not None:
        with timings.step(evaluations.base.name):
            evaluate_base(config, run_dir)
    if config.warmup.enabled:
        with timings.step("warm-up"):
            config = warmed_up(config)
    before: EvalTable | None = None
    if evaluations.before is not None and config.eval.worlds:
        # eval.worlds are evaluated in a task between graphs: the policy the rounds start from before the graph
        with timings.step(f"{evaluations.before.name}: eval.worlds"):
            before = combined(other_worlds(config, config.policy.model, config.retrieval.encoder.adapter))
    with timings.step("graph start"):
        coordinator = start_coordinator(config, resume=resume)
        coordinator.ready()  # its graph started: the evaluation's step holds the evaluation alone
    try:
        if evaluations.before is not None:
            with timings.step(evaluations.before.name):
                first = kept_graph_table(config, run_dir, evaluations.before,
                                         lambda: graph_table(coordinator, evaluations.before))
            before = combined([first, *([before] if before else [])])
            write_table(run_dir, evaluations.before.name, before)
        with timings.step(ROUNDS):
            coordinator.run()
        timings.add_round_phases(coordinator.phase_seconds())
        after = None
        if evaluations.after is not None:
            with timings.step(evaluations.after.name):
                after = graph_table(coordinator, evaluations.after)
        state = coordinator.state()
    finally:
        shut_down(coordinator)
    checkpoint = checkpoint_root(config)
    latest = checkpoint / (checkpoint / LATEST).read_text().strip()
    if after is not None:
        ending = checkpoint_start(latest)
        if config.eval.worlds:
            with timings.step(f"{EVAL_AFTER.name}: eval.worlds"):
                after = combined([after, *other_worlds(config, ending.policy, ending.adapter)])
        write_table(run_dir, EVAL_AFTER.name, after)
    if (stages := stage_table(run_dir)) is not None:
        (run_dir / "eval_stages.md").write_text(stages + "\n")
        print(f"\n## evaluation by stage\n\n{stages}\n", flush=True)
    if before is not None and after is not None and evaluations.before is not None:
        print(f"\n## after RL − {evaluations.before.column} on the same questions (95% paired bootstrap "
              f"intervals)\n\n{paired_markdown(paired_rows([before.questions], [after.questions]))}\n", flush=True)
    timings.write()
    print(f"\n## where the time went ({run_dir / TIMINGS_FILE})\n\n{timings_markdown(timings.record())}\n")
    print(
        f"done: {state['round']} rounds, policy v{state['policy_version']}, retriever v{state['retriever_version']}\n"
        f"checkpoints: {checkpoint.resolve()} (latest: {latest.name})\n"
        f"logs: {run_dir.resolve()} (phases.jsonl, timings.json, config.yaml, wandb/)"
    )
    return latest


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
    """``--dry-run`` of a schedule: the checks the first stage to run makes before Ray (:func:`checked_start` of
    its config, as :func:`run_once` makes them) and every stage's resource report, every problem at once."""
    problems = Problems()
    if step := next((step for step in steps if step.record is None), None):
        before = steps[step.index - 1].record if step.index else None
        start = starts.get(step.index) or (before and StartPoint(before.policy, before.adapter, before.checkpoint))
        print(f"stage {config.stages[step.index].name}, the first to run:")
        with problems.check():
            checked_start(stage_config(config, step.index, start), stage_flags(flags, step))
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
