"""The folder a run writes and the checkpoint it starts from, checked before Ray starts.

Which checkpoint a run resumes and what ``--overwrite`` removes are decided by the pure functions
:func:`claim_action` and :func:`wants_resume`; :func:`checked_start` makes every check of a run's inputs, all
problems at once, and only then claims ``run.output_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bridge_ray.checkpoint import (
    CheckpointError,
    CheckpointManager,
    Manifest,
    checkpoint_root,
    find_checkpoint,
    load_manifest,
)
from bridge_ray.config import Config
from bridge_ray.errors import InputError, Problems, refuse_existing_output, refuse_unwritable
from bridge_ray.train.preflight import check_same_run, preflight
from bridge_ray.train.run_evals import EVALUATIONS
from bridge_ray.train.timings import TIMINGS_FILE

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


NEW_RUN = JobFlags()  # no flag: a new run, in a folder that holds no other run


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
