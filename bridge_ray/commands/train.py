"""``bridge-ray train``: build the actor graph on a Ray cluster (a local one by default) and run BRIDGE rounds."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from bridge_ray.cli import add_config_arguments, config_from_args
from bridge_ray.config import Config
from bridge_ray.errors import InputError, InputErrors, Problems, refuse_existing_output, refuse_unwritable

if TYPE_CHECKING:
    from bridge_ray.checkpoint import Manifest
    from bridge_ray.train.stages import StageRecord

HELP = "train the policy and the retriever adapter with BRIDGE rounds on the Ray actor graph"

STAGES = (("eval_before", "base"), ("eval_warmup", "warm-up"), ("eval_after", "after RL"))
# The logs that mark run.output_dir as a run's, and every file a run writes there (its checkpoints aside).
RUN_LOGS = ("phases.jsonl", "eval.jsonl")
RUN_FILES = (
    *RUN_LOGS, "config.yaml", "eval_stages.md", *(f"{name}.{ext}" for name, _ in STAGES for ext in ("md", "json"))
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    start.add_argument(
        "--auto-resume", action="store_true",
        help="continue from the last complete checkpoint if there is one, else start (for resubmitted jobs)",
    )
    start.add_argument(
        "--overwrite", action="store_true",
        help="replace the run in run.output_dir: remove its checkpoints, logs, evaluations and config.yaml first "
        "(other files stay)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="validate keys, paths and the resource demand; load no model"
    )
    add_config_arguments(parser)


def connect(address: str | None) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running local cluster), else start a local instance; print where
    its dashboard is and, under Ray's token authentication, how to get the token the dashboard asks for."""
    import ray

    from bridge_ray.runtime.auth import init_ray

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


def write_table(run_dir: Path, name: str, table) -> None:
    (run_dir / f"{name}.md").write_text(table.to_markdown() + "\n")
    (run_dir / f"{name}.json").write_text(table.to_json() + "\n")
    print(f"\n## {name.replace('_', ' ')}\n\n{table.to_markdown()}\n", flush=True)


def stage_table(run_dir: Path) -> str | None:
    """EM / F1 / recall of every data set and question type at each evaluated stage of this run, side by side."""
    tables = {label: json.loads((run_dir / f"{name}.json").read_text())
              for name, label in STAGES if (run_dir / f"{name}.json").is_file()}
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


def shut_down(coordinator) -> None:
    """End the coordinator's graph. A coordinator that died took its actors with it, and the error that killed it
    is already on its way up: asking it again would only print the same traceback a second time."""
    import ray

    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(coordinator.shutdown.remote())


def evaluate_only(config, run_dir: Path, name: str, label: str) -> None:
    """Evaluate ``config``'s policy through a graph of its own (the base model, before the warm-up)."""
    import ray

    from bridge_ray.train.coordinator_actor import start_coordinator

    coordinator = start_coordinator(config)
    try:
        write_table(run_dir, name, ray.get(coordinator.evaluate.remote(label)))
    finally:
        shut_down(coordinator)


def warmed_up(config):
    """``config`` with ``policy.model`` set to the warmed-up policy, trained (or found in the cache) in a Ray task
    with one learner rank's resources, so on a cluster it runs on a GPU node."""
    import ray

    from bridge_ray.train.warmup import warmed_up_policy

    def warm_up(config) -> str:
        return str(warmed_up_policy(config))

    rank = config.roles.policy_learner
    task = ray.remote(num_cpus=rank.cpus, num_gpus=rank.gpus)(warm_up)
    path = ray.get(task.remote(config))
    return config.model_copy(update={"policy": config.policy.model_copy(update={"model": path})})


def _round_span(rounds: list[int]) -> str:
    """``round 3``, ``rounds 248-250`` or ``rounds 3, 249, 250``."""
    if len(rounds) == 1:
        return f"round {rounds[0]}"
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"rounds {rounds[0]}-{rounds[-1]}"
    return "rounds " + ", ".join(map(str, rounds))


def previous_run(config: Config) -> str | None:
    """What a run left where this one writes (its checkpoints' rounds, its logs), or None when nothing."""
    from bridge_ray.checkpoint import CheckpointManager, checkpoint_root

    held, root = [], checkpoint_root(config)
    if rounds := CheckpointManager(root, keep=1).rounds():
        held.append(f"checkpoints of {_round_span(rounds)} (in {root})")
    if logs := [name for name in RUN_LOGS if (Path(config.run.output_dir) / name).is_file()]:
        held.append(f"logs ({', '.join(logs)})")
    return " and ".join(held) or None


def remove_run(config: Config) -> None:
    """The artifacts of the run in ``run.output_dir``: its checkpoints and the files of ``RUN_FILES``; files that
    no run writes stay."""
    from bridge_ray.checkpoint import CheckpointManager, checkpoint_root

    CheckpointManager(checkpoint_root(config), keep=1).clear()
    for name in RUN_FILES:
        (Path(config.run.output_dir) / name).unlink(missing_ok=True)


def claim_output(config: Config, args: argparse.Namespace) -> None:
    """Make ``run.output_dir`` this run's before Ray starts.

    A new run in a folder holding another run's checkpoints or logs would number its rounds from 0 among the
    old ones, prune them by round and append to their logs, so it is refused unless ``--resume`` or
    ``--auto-resume`` continue that run or ``--overwrite`` removes it (not under ``--dry-run``).
    """
    if args.resume or args.auto_resume or (held := previous_run(config)) is None:
        return
    if not args.overwrite:
        raise refuse_existing_output(
            config.run.output_dir, f"another run's {held}", "pass --resume to continue it, or --overwrite to replace it"
        )
    if args.dry_run:
        print(f"--overwrite: would remove {held}")
        return
    remove_run(config)
    print(f"--overwrite: removed {held}")


def check_seed(checkpoint: Path, manifest: Manifest, seed: int, flag: str, advice: str) -> None:
    """An error naming ``flag`` when ``checkpoint``'s question order was drawn from another ``run.seed``."""
    saved_seed = manifest.data_cursor.get("seed", seed)
    if saved_seed != seed:
        raise InputError(f"{flag}: {checkpoint} was trained with run.seed={saved_seed}, the config says {seed}; "
                         + advice)


def continued(config: Config) -> None:
    """Check ``run.continue_from`` before Ray starts: a checkpoint, whole, of this run's ``run.seed``."""
    from bridge_ray.checkpoint import find_checkpoint

    if config.run.continue_from is not None:
        checkpoint, manifest = find_checkpoint(config.run.continue_from, "run.continue_from")
        check_seed(checkpoint, manifest, config.run.seed, "run.continue_from",
                   "a run continues the question order of a run of its own seed")


def resuming(config: Config, args: argparse.Namespace) -> bool:
    """Whether the run continues from its latest checkpoint, checked whole before Ray starts: ``--resume``
    without one, or a damaged one, is an error naming the folder or the file."""
    from bridge_ray.checkpoint import CheckpointError, CheckpointManager, checkpoint_root, load_manifest
    from bridge_ray.train.preflight import check_same_run

    root = checkpoint_root(config)
    latest = CheckpointManager(root, keep=1).latest()
    if args.resume and latest is None:
        raise InputError(
            f"--resume: no complete checkpoint under {root}; pass --auto-resume to start a new run when there is none"
        )
    if latest is None or not (args.resume or args.auto_resume):
        return False
    flag = f"--{'resume' if args.resume else 'auto-resume'}"
    try:
        manifest = load_manifest(latest)
    except CheckpointError as exc:
        raise InputError(f"{flag}: {exc}") from None
    check_seed(latest, manifest, config.run.seed, flag, "resume with the run's own seed, or start a new run")
    check_same_run(latest, config, flag)
    return True


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.stages:
        run_stages(config, args)
    else:
        run_once(config, args)
    return 0


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items()) if amount) or "nothing"


def _summed(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for name, amount in b.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def resource_table(config: Config) -> str:
    """What each role asks of the cluster (count, one actor's bundle, in all), the graph's sum and the cluster's
    resources, as ``--dry-run`` prints it."""
    import ray

    from bridge_ray.train.graph import graph_bundles

    rows = [("role", "count", "each", "in all")]
    everything = []
    for role, bundles in graph_bundles(config).items():
        rows.append((role, str(len(bundles)), _amounts(bundles[0]) if bundles else "-", _amounts(_summed(bundles))))
        everything += bundles
    rows.append(("graph", "", "", _amounts(_summed(everything))))
    cluster = ray.cluster_resources()
    rows.append(("cluster", "", "", f"{_amounts({k: cluster.get(k, 0.0) for k in ('CPU', 'GPU')})} "
                 f"(free: {_amounts({k: ray.available_resources().get(k, 0.0) for k in ('CPU', 'GPU')})})"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def resource_problems(config: Config, graph: Exception) -> InputErrors:
    """The error for a graph the cluster cannot hold: each role that cannot be placed even alone, named with the
    keys that size it; else the graph as a whole (``graph``, the error of the whole graph's check)."""
    from bridge_ray.runtime.placement import PlacementError, check_resources
    from bridge_ray.train.graph import graph_bundles

    sizing = {"shard_holder": "rebuild the index with fewer shards (build-index --shards K) or lower "
                              "roles.shard_holder.cpus/gpus"}
    problems = []
    for role, bundles in graph_bundles(config).items():
        try:
            check_resources(role, bundles)
        except PlacementError as exc:
            fix = sizing.get(role, f"lower roles.{role}.count or roles.{role}.cpus/gpus")
            problems.append(f"{exc}; {fix}, or run on a larger cluster (run.ray_address)")
    whole = (f"the cluster cannot hold the whole graph at once: {graph}; lower the roles' counts, cpus or gpus "
             "(roles.*), or run on a larger cluster (run.ray_address)")
    return InputErrors(problems or [whole])


def check_resources(config: Config) -> bool:
    """``--dry-run``'s check that the cluster can hold the graph, with its per-role table; False when it cannot yet
    but the autoscaler will be asked (``run.autoscale_timeout_s``)."""
    from bridge_ray.runtime.placement import PlacementError
    from bridge_ray.train.graph import check_graph_resources

    print(resource_table(config))
    try:
        check_graph_resources(config, scale_up=False)
    except PlacementError as exc:
        if not config.run.autoscale_timeout_s:
            raise resource_problems(config, exc) from None
        print(f"{exc}\nthe run will ask the autoscaler for it (run.autoscale_timeout_s)")
        return False
    print("the cluster can hold the graph")
    return True


def checked_start(config: Config, args: argparse.Namespace) -> bool:
    """Every check of the run's inputs, before Ray starts, all problems reported at once; then ``run.output_dir``
    is claimed (``--overwrite`` removes the old run only once nothing else is wrong). Returns whether it resumes."""
    from bridge_ray.train.preflight import preflight

    problems, resume = Problems(), False
    with problems.check():
        for line in preflight(config):
            print(line)
    with problems.check():
        refuse_unwritable(Path(config.run.output_dir), "run.output_dir")
    with problems.check():
        continued(config)
    with problems.check():
        resume = resuming(config, args)
    if not args.overwrite:  # only a refusal: taking over the folder waits for the other checks
        with problems.check():
            claim_output(config, args)
    problems.raise_any()
    if args.overwrite:
        claim_output(config, args)
    return resume


def run_once(config: Config, args: argparse.Namespace) -> Path | None:
    """One run of ``config`` (``--resume``, ``--overwrite`` and ``--dry-run`` as ``args`` say); returns its final
    checkpoint (None under ``--dry-run``)."""
    resume = checked_start(config, args)
    connect(config.run.ray_address)
    if args.dry_run:
        check_resources(config)
        return None
    from bridge_ray.runtime.placement import PlacementError
    from bridge_ray.train.graph import check_graph_resources

    try:
        check_graph_resources(config)
    except PlacementError as exc:
        raise resource_problems(config, exc) from None

    import ray

    from bridge_ray.checkpoint import LATEST, checkpoint_root
    from bridge_ray.train.coordinator_actor import start_coordinator

    run_dir = Path(config.run.output_dir)
    if config.warmup.enabled:
        if config.eval.before_training and not resume:
            evaluate_only(config, run_dir, "eval_before", "before")
        config = warmed_up(config)
    coordinator = start_coordinator(config, resume=resume)
    try:
        if config.eval.before_training and not resume:
            name, label = ("eval_warmup", "warmup") if config.warmup.enabled else ("eval_before", "before")
            write_table(run_dir, name, ray.get(coordinator.evaluate.remote(label)))
        ray.get(coordinator.run.remote())
        if config.eval.after_training:
            write_table(run_dir, "eval_after", ray.get(coordinator.evaluate.remote("after")))
        state = ray.get(coordinator.state.remote())
    finally:
        shut_down(coordinator)
    if (stages := stage_table(run_dir)) is not None:
        (run_dir / "eval_stages.md").write_text(stages + "\n")
        print(f"\n## evaluation by stage\n\n{stages}\n", flush=True)
    checkpoint = checkpoint_root(config)
    latest = checkpoint / (checkpoint / LATEST).read_text().strip()
    print(
        f"done: {state['round']} rounds, policy v{state['policy_version']}, retriever v{state['retriever_version']}\n"
        f"checkpoints: {checkpoint.resolve()} (latest: {latest.name})\n"
        f"logs: {run_dir.resolve()} (phases.jsonl, config.yaml, wandb/)"
    )
    return latest


def run_stages(config: Config, args: argparse.Namespace) -> None:
    """The ``stages:`` schedule: each stage a run of its own under ``<run.output_dir>/stages/<name>``, from the
    previous stage's final policy and adapter, continuing its question order (``bridge_ray/train/stages.py``).
    A stage recorded in ``stages.json`` is skipped; ``--resume`` / ``--auto-resume`` continue the first unfinished
    one from its last checkpoint, ``--overwrite`` starts the whole schedule over."""
    from bridge_ray.checkpoint import POLICY_DIR, CheckpointManager, checkpoint_root, find_checkpoint
    from bridge_ray.train.preflight import preflight
    from bridge_ray.train.stages import StageLog, StageRecord, StartPoint, checkpoint_start, stage_config, stage_outputs

    starts = {}
    for i, stage in enumerate(config.stages):
        if stage.start != "previous":
            checkpoint, manifest = find_checkpoint(stage.start, f"stages.{i}.start", model=POLICY_DIR)
            check_seed(checkpoint, manifest, config.run.seed, f"stages.{i}.start",
                       "a stage continues the question order of the run it starts from: set that run's seed")
            starts[i] = checkpoint_start(checkpoint)
    log = StageLog(config.run.output_dir)
    outputs = [stage_outputs(config, stage) for stage in config.stages]
    if args.dry_run:
        for line in preflight(config):
            print(line)
        connect(config.run.ray_address)
        for stage in config.stages:
            print(f"stage {stage.name} (train {stage.train}):", end=" ")
            check_resources(config.model_copy(update={"algorithm": stage.algorithm(config.algorithm)}))
        return
    if args.overwrite:
        held = [f"stage {out.run.output_dir}: {h}" for out in outputs if (h := previous_run(out)) is not None]
        for out in outputs:
            remove_run(out)
        if log.records:
            held.append(str(log.path))
        log.remove()
        print(f"--overwrite: removed {'; '.join(held) or 'nothing'}")
    checkpointed = {i for i, out in enumerate(outputs) if CheckpointManager(checkpoint_root(out), keep=1).latest()}
    if args.resume and not log.records and not checkpointed:
        raise InputError(f"--resume: no finished stage in {log.path} and no stage checkpoint under "
                         f"{Path(config.run.output_dir) / 'stages'}; pass --auto-resume to start when there is none")
    order, start = [stage.name for stage in config.stages], None
    finished = [log.finished(stage) for stage in config.stages]
    first_unfinished = next((i for i, record in enumerate(finished) if record is None), len(finished))
    if later := [r.name for r in finished[first_unfinished:] if r is not None]:
        raise InputError(f"{log.path} records {', '.join(later)} finished, but stage {order[first_unfinished]!r} "
                         "before it did not finish: pass --overwrite to run the schedule again")
    for i, (stage, record) in enumerate(zip(config.stages, finished, strict=True)):
        start = starts.get(i, start)
        if record is None:
            stage_run = stage_config(config, i, start)
            resume = (args.resume or args.auto_resume) and i in checkpointed
            print(f"\n== stage {i + 1}/{len(order)} {stage.name}: train {stage.train}, {stage.rounds} rounds, from "
                  f"{start.policy if start else 'the configured policy'}", flush=True)
            checkpoint = run_once(stage_run, argparse.Namespace(
                **{**vars(args), "resume": resume, "auto_resume": False, "overwrite": False}))
            after = Path(stage_run.run.output_dir) / "eval_after.json"
            record = StageRecord.of(stage, checkpoint, json.loads(after.read_text()) if after.is_file() else None)
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
