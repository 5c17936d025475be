"""A training run: the one place a run of a config is assembled, for ``train`` (each stage of a schedule too),
``bench learn`` and ``bench round``.

A :class:`Run` goes through its life in this order, each step a method of its own: :meth:`~Run.claim` checks every
input before Ray starts (the folder it writes, the checkpoint it resumes or continues, the question files; all
problems at once) and only then makes ``run.output_dir`` its own; :meth:`~Run.connect` joins or starts Ray and
:meth:`~Run.check_capacity` checks that the cluster holds the graph; :meth:`~Run.start` starts the coordinator
(one actor graph), from the run's last checkpoint when it resumes; :meth:`~Run.train` runs the rounds,
:meth:`~Run.evaluate` asks the graph for an evaluation, and :meth:`~Run.shut_down` ends the graph. Used as a
context manager, a run shuts its graph down however the block ends. :meth:`~Run.execute` is the whole run as
``train`` makes it (its evaluations, the warm-up, ``timings.json`` and the report it prints); a bench takes the
steps it needs, a bench run being a training run with other outputs. :meth:`~Run.dry_run` is ``train --dry-run``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import ray
from ray._private.authentication.authentication_utils import is_token_auth_enabled

from bridge_ray.checkpoint import LATEST, checkpoint_root
from bridge_ray.config import Config, derive
from bridge_ray.coordinator.capacity import report_capacity, report_machine, require_graph_capacity
from bridge_ray.coordinator.handle import CoordinatorHandle, start_coordinator
from bridge_ray.errors import Problems
from bridge_ray.evaluation.paired_report import paired_markdown, paired_rows
from bridge_ray.evaluation.table import EvalTable, combined
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.runtime.auth import init_ray
from bridge_ray.runtime.calls import ActorLost, run_task
from bridge_ray.train.run_evals import (
    EVAL_AFTER,
    EVAL_BEFORE,
    Evaluation,
    build_indexes,
    kept_graph_table,
    learner_rank_options,
    other_worlds,
    run_evaluations,
    stage_table,
    write_table,
)
from bridge_ray.train.run_folder import NEW_RUN, JobFlags, checked_start
from bridge_ray.train.stages import checkpoint_start
from bridge_ray.train.timings import ROUNDS, TIMINGS_FILE, JobTimings, timings_markdown
from bridge_ray.warmup.trainer import warmed_up_policy

# ---- Ray -----------------------------------------------------------------------------------------------


def connect(address: str | None, dashboard: bool = True) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running local cluster), else start a local instance (with its
    dashboard unless ``dashboard`` is false: ``run.dashboard``); print where its dashboard is and, under Ray's token
    authentication, how to get the token the dashboard asks for."""
    if ray.is_initialized():
        return
    context = init_ray(address, include_dashboard=None if dashboard else False, dashboard_host="127.0.0.1",
                       log_to_driver=True)
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
    return is_token_auth_enabled()


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
            connect(config.run.ray_address, config.run.dashboard)
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


def warmed_up(config: Config) -> Config:
    """``config`` with ``policy.model`` set to the warmed-up policy, trained (or found in the cache) in a Ray task
    with one learner rank's resources, so on a cluster it runs on a GPU node."""

    def warm_up(config: Config) -> str:
        return str(warmed_up_policy(config))

    path = run_task(warm_up, config, options=learner_rank_options(config), timeout_s=config.run.driver_timeout_s,
                    what="the warm-up task", limit="run.driver_timeout_s")
    return derive(config, {"policy.model": path}, source="the warm-up")


# ---- the run -------------------------------------------------------------------------------------------


class Run:
    """One run of ``config`` (the module's docstring lists its steps in order). ``flags`` are ``train``'s, which
    :meth:`claim` reads; ``resume`` says whether the graph starts from the run's last checkpoint where
    :meth:`claim` does not decide it (a bench's run, which makes none of ``train``'s checks)."""

    def __init__(self, config: Config, flags: JobFlags = NEW_RUN, *, resume: bool = False) -> None:
        self.config, self.flags, self.resume = config, flags, resume
        self.run_dir = Path(config.run.output_dir)
        self.timings = JobTimings(self.run_dir)  # written as steps end: a run refused before any leaves no file
        self.coordinator: CoordinatorHandle | None = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shut_down()

    # ---- before Ray

    def claim(self) -> bool:
        """Every check of the run's inputs before Ray starts, all problems at once, then ``run.output_dir`` made
        this run's (:func:`~bridge_ray.train.run_folder.checked_start`). Returns whether the run resumes."""
        self.resume = checked_start(self.config, self.flags)
        return self.resume

    def dry_run(self) -> None:
        """``--dry-run``: the checks of :meth:`claim` (what ``--overwrite`` would remove is only reported) and the
        graph's resource report, every problem at once; no actor starts."""
        problems = Problems()
        with problems.check():
            self.claim()
        report_resources(self.config, problems, {"": self.config})
        problems.raise_any()

    # ---- Ray and the graph

    def connect(self) -> None:
        """Join the cluster ``run.ray_address`` names (:func:`connect`), unless this process already has."""
        connect(self.config.run.ray_address, self.config.run.dashboard)

    def check_capacity(self) -> None:
        """Before the warm-up and before any actor starts: the cluster holds the whole graph, else an error naming
        the roles that are short."""
        require_graph_capacity(self.config)

    def start(self) -> CoordinatorHandle:
        """Start the coordinator of the run's graph, from its last checkpoint when the run resumes, and wait until
        the graph is up; the run shuts it down (:meth:`shut_down`). One graph at a time."""
        if self.coordinator is not None:
            raise RuntimeError(f"{self.run_dir}: a graph is already up; shut it down first")
        self.coordinator = start_coordinator(self.config, resume=self.resume)
        self.coordinator.ready()
        return self.coordinator

    def train(self, rounds: int | None = None) -> int:
        """The rounds until ``rounds`` (default ``run.rounds``) are complete, on the graph :meth:`start` started."""
        return self._graph().run(rounds)

    def evaluate(self, evaluation: Evaluation) -> EvalTable:
        """One of the run's evaluations by its graph."""
        return self._graph().evaluate(evaluation.label)

    def shut_down(self) -> None:
        """End the graph, if one is up. A coordinator that died took its actors with it, and the error that killed
        it is already on its way up: asking it again would only print the same traceback a second time."""
        coordinator, self.coordinator = self.coordinator, None
        if coordinator is not None:
            with contextlib.suppress(ActorLost):
                coordinator.shutdown()

    def _graph(self) -> CoordinatorHandle:
        if self.coordinator is None:
            raise RuntimeError(f"{self.run_dir}: no graph is up; start one first")
        return self.coordinator

    # ---- the whole run, as train makes it

    def execute(self) -> Path:
        """The whole run, inside a ``with`` block; returns its final checkpoint.

        In order: the checks, the policy's conversion and the indexes (each found in the cache once built), the
        base policy's evaluation (with the warm-up, through a graph of its own), the warm-up, then one graph for
        the evaluation before training, the rounds and the evaluation after them. ``eval.worlds`` join the
        evaluations from tasks run between graphs. A resumed run evaluates only after training. Each step's wall
        time goes to ``timings.json`` (:mod:`bridge_ray.train.timings`), printed as the run ends with the paired
        difference after − before training.
        """
        with self.timings.step("checks, worlds and Ray start"):  # written once they pass: a refused run leaves no file
            self.claim()
            self.connect()
            self.check_capacity()
        with self.timings.step("model conversion"):
            resolve_model_path(self.config.policy.model)
        with self.timings.step("indexes"):
            build_indexes(self.config)
        evaluations = run_evaluations(self.config, self.resume)
        if evaluations.base is not None:
            with self.timings.step(evaluations.base.name):
                self.evaluate_base()
        if self.config.warmup.enabled:
            with self.timings.step("warm-up"):
                self.config = warmed_up(self.config)
        before: EvalTable | None = None
        if evaluations.before is not None and self.config.eval.worlds:
            # eval.worlds are evaluated in a task between graphs: the policy the rounds start from before the graph
            with self.timings.step(f"{evaluations.before.name}: eval.worlds"):
                before = combined(other_worlds(self.config, self.config.policy.model,
                                               self.config.retrieval.encoder.adapter))
        with self.timings.step("graph start"):
            self.start()  # its graph started: the evaluation's step holds the evaluation alone
        if evaluations.before is not None:
            with self.timings.step(evaluations.before.name):
                first = kept_graph_table(self.config, self.run_dir, evaluations.before,
                                         lambda: self.evaluate(evaluations.before))
            before = combined([first, *([before] if before else [])])
            write_table(self.run_dir, evaluations.before.name, before)
        with self.timings.step(ROUNDS):
            self.train()
        self.timings.add_round_phases(self._graph().phase_seconds())
        after = None
        if evaluations.after is not None:
            with self.timings.step(evaluations.after.name):
                after = self.evaluate(evaluations.after)
        state = self._graph().state()
        self.shut_down()
        checkpoint = checkpoint_root(self.config)
        latest = checkpoint / (checkpoint / LATEST).read_text().strip()
        if after is not None:
            after = self._after_on_worlds(after, latest)
            write_table(self.run_dir, EVAL_AFTER.name, after)
        self._report(before, after, evaluations.before)
        versions = f"policy v{state['policy_version']}, retriever v{state['retriever_version']}"
        print(
            f"done: {state['round']} rounds, {versions}\n"
            f"checkpoints: {checkpoint.resolve()} (latest: {latest.name})\n"
            f"logs: {self.run_dir.resolve()} (phases.jsonl, timings.json, config.yaml, wandb/)"
        )
        return latest

    def evaluate_base(self) -> None:
        """The evaluation before the warm-up, through a graph of its own serving the base policy (why:
        :mod:`bridge_ray.train.job`; none starts when the table is kept), and on ``eval.worlds`` once that graph
        has ended."""

        def on_its_graph() -> EvalTable:
            self.start()
            table = self.evaluate(EVAL_BEFORE)
            self.shut_down()
            return table

        table = kept_graph_table(self.config, self.run_dir, EVAL_BEFORE, on_its_graph)
        write_table(self.run_dir, EVAL_BEFORE.name, combined([table, *other_worlds(
            self.config, self.config.policy.model, self.config.retrieval.encoder.adapter)]))

    def _after_on_worlds(self, after: EvalTable, latest: Path) -> EvalTable:
        """The graph's evaluation after training, joined by ``eval.worlds``' of the policy it ended with."""
        if not self.config.eval.worlds:
            return after
        ending = checkpoint_start(latest)
        with self.timings.step(f"{EVAL_AFTER.name}: eval.worlds"):
            return combined([after, *other_worlds(self.config, ending.policy, ending.adapter)])

    def _report(self, before: EvalTable | None, after: EvalTable | None, first: Evaluation | None) -> None:
        """What ``train`` prints as the run ends: the table by stage, the paired difference after − ``first``
        (the evaluation before training) and where the time went, written to ``timings.json``."""
        if (stages := stage_table(self.run_dir)) is not None:
            (self.run_dir / "eval_stages.md").write_text(stages + "\n")
            print(f"\n## evaluation by stage\n\n{stages}\n", flush=True)
        if before is not None and after is not None and first is not None:
            print(f"\n## after RL − {first.column} on the same questions (95% paired bootstrap "
                  f"intervals)\n\n{paired_markdown(paired_rows([before.questions], [after.questions]))}\n", flush=True)
        self.timings.write()
        where = self.run_dir / TIMINGS_FILE
        print(f"\n## where the time went ({where})\n\n{timings_markdown(self.timings.record())}\n")
