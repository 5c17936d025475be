"""What a sweep runs: a grid of (preset, seed) training runs over one base config, each from its seed's warm-up, and
the config of every run and evaluation it derives from that."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bridge_ray.config import Config, derive, load_config
from bridge_ray.coordinator.inputs import world_set_name
from bridge_ray.errors import InputErrors, Problems
from bridge_ray.sweep.paired import BASELINE
from bridge_ray.train.preflight import preflight, warmup_preflight


@dataclass(frozen=True)
class Sweep:
    """A grid of runs: every preset file (``presets``: name -> file, loaded over ``config`` in place of its own
    ``base:``) for every seed, ``rounds`` rounds each, checkpointed and evaluated every ``eval_every`` rounds on
    ``eval_questions`` questions of the world's ``split`` and of an out-of-distribution world (``ood_seed``).
    ``overrides`` apply to every run and evaluation; ``out`` holds them all, so that a stopped sweep resumes there;
    ``command`` is how it was asked for, recorded with its results."""

    config: str
    presets: dict[str, Path]
    seeds: list[int]
    rounds: int
    eval_every: int
    eval_questions: int
    out: Path
    overrides: list[str] = field(default_factory=list)
    split: str = "test"
    ood_seed: int = 1
    warmup_per_seed: bool = False
    baseline: str = BASELINE
    command: str = ""

    @property
    def tag(self) -> str:
        """The name of a kept evaluation, beside its checkpoint or in ``out``: what it asked (test's tag as it was
        before dev could be asked, so that archived sweeps resume)."""
        split = "" if self.split == "test" else f"-{self.split}"
        return f"bench-eval{split}-q{self.eval_questions}-ood{self.ood_seed}.json"

    def base(self) -> Config:
        return load_config(self.config, self.overrides)

    def warmup_configs(self) -> dict[int, Config]:
        """The warm-up config each seed's runs start from: the base config's for every seed, or with
        ``warmup_per_seed`` the seed's (``warmup.seed`` = the seed: other demonstrations, in another order), so
        that the spread over seeds includes the starting policy's."""
        if not self.warmup_per_seed:
            return dict.fromkeys(self.seeds, self.base())
        return {seed: load_config(self.config, [*self.overrides, f"warmup.seed={seed}"]) for seed in self.seeds}

    def run_config(self, preset: Path, seed: int, run_dir: Path, policy: str | None = None) -> Config:
        """The config of one (preset, seed) run: the preset file over ``config``, the overrides, then the sweep's
        own settings (its rounds, a checkpoint every ``eval_every``, no evaluations of its own; ``policy``: the
        warm-up it starts from, else the config's own)."""
        started = [f"policy.model={policy}"] if policy else []
        return scaled_stages(load_config(preset, base=self.config, overrides=[
            *self.overrides, *started, "warmup.enabled=false", f"run.seed={seed}", f"run.rounds={self.rounds}",
            f"run.output_dir={run_dir}", "eval.before_training=false", "eval.after_training=false",
            "eval.every_rounds=0", f"checkpoint.every_rounds={self.eval_every}", "telemetry.wandb_mode=disabled",
        ]), self.rounds)

    def eval_sets(self) -> dict[str, Config]:
        """The config of each held-out set: the world's own (named as the world names it) and the
        out-of-distribution world (``ood``: another seed, paraphrased questions, its own corpus and index)."""
        common = [*self.overrides, f"eval.max_questions={self.eval_questions}", "warmup.enabled=false"]
        return {
            world_set_name(self.base()): load_config(self.config, common),
            "ood": load_config(self.config, [*common, f"data.world_seed={self.ood_seed}",
                                             "data.world_phrasing=paraphrase"]),
        }

    def check_runs(self) -> None:
        """Load every preset's config and run ``train``'s checks on it (question files, index, encoder, engine)
        before the warm-up trains: a bad preset, key or file fails in seconds, and every problem is listed once.
        The warm-up a run starts from does not exist yet, so each is checked with the config's own policy; the
        warm-up's own inputs are checked as ``warmup`` checks them."""
        problems = Problems()
        with problems.check():
            warmup_preflight(self.base())  # the warm-up every run starts from
        for path in self.presets.values():
            with problems.check():
                preflight(self.run_config(path, self.seeds[0], self.out / "runs" / "check"))
        if problems.found:
            raise InputErrors(list(dict.fromkeys(problems.found)))  # presets over one base share most problems


def scaled_stages(config: Config, rounds: int) -> Config:
    """A staged preset with its first stage ``rounds`` long and the others scaled in proportion to the file's
    rounds (at least 1 each), so every preset's first run is as long; a preset without stages as it is."""
    if not config.stages:
        return config
    scale = rounds / config.stages[0].rounds
    return derive(config, {f"stages.{i}.rounds": max(1, round(stage.rounds * scale))
                           for i, stage in enumerate(config.stages)}, source="bench learn --rounds")
