"""Per-round figures to three places users watch: the console, W&B, and Ray's metrics (dashboard / Prometheus)."""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import ray
from ray.util.metrics import Gauge

from bridge_ray.atomic import write_text_atomic
from bridge_ray.checkpoint import CONFIG, MANIFEST
from bridge_ray.progress import clock

METRIC_PREFIX = "bridge_ray_"
WANDB_ID_FILE = "wandb_id"  # in the run folder: the W&B run a resumed training run goes on logging to


def _metric_name(key: str) -> str:
    return METRIC_PREFIX + "".join(c if c.isalnum() else "_" for c in key)


class Telemetry:
    """``log(round, figures)`` prints one console line, logs to W&B and sets Ray gauges.

    W&B runs offline unless ``wandb_mode`` says otherwise (the run directory keeps the files). Its run id is
    kept in ``run_dir/wandb_id``: a resumed training run (``resume``) goes on logging to the same W&B run, a new
    one starts a new W&B run. Ray gauges exist only inside a running Ray job (they need ``ray[default]``) and
    carry the run name as a tag.
    """

    def __init__(
        self,
        run_dir: str | Path,
        run_name: str,
        *,
        config: Mapping[str, Any] | None = None,
        wandb_mode: str = "offline",
        wandb_project: str = "bridge-ray",
        wandb_entity: str | None = None,
        wandb_name: str | None = None,
        resume: bool = False,
        ray_metrics: bool = True,
        stream: TextIO | None = None,
    ):
        # sys.stdout as it is now, not as it was when this module was imported (a default argument would keep
        # the stream of whoever imported it first: a closed one in a driver that swapped its stdout since)
        self.run_name, self.stream = run_name, stream if stream is not None else sys.stdout
        self.wandb_run = None
        if wandb_mode != "disabled":
            import wandb  # only with telemetry.wandb on: seconds to import

            self.wandb_run = wandb.init(
                project=wandb_project, entity=wandb_entity, name=wandb_name or run_name, dir=str(run_dir),
                mode=wandb_mode, config=dict(config or {}), id=wandb_run_id(Path(run_dir), resume), resume="allow",
                reinit="create_new",
            )
            self.wandb_run.define_metric("*", step_metric="round")
        self._gauges: dict[str, Any] = {}
        self._ray_metrics = ray_metrics
        self._round_seconds: list[float] = []

    def _gauge(self, key: str):
        if key not in self._gauges:
            self._gauges[key] = Gauge(_metric_name(key), description=f"bridge-ray {key}", tag_keys=("run",))
        return self._gauges[key]

    def log(self, round_index: int, figures: Mapping[str, float], *, total: int | None = None) -> None:
        """The console line reads ``[round r/N ETA mm:ss]`` when ``total`` (the run's rounds) is given: r counts
        from 0 as everywhere else (phases.jsonl, W&B's ``round``), the ETA is the mean ``time/round`` of this
        process's rounds times the rounds left."""
        finite = {k: float(v) for k, v in figures.items() if v is not None and math.isfinite(float(v))}
        shown = "  ".join(f"{k}={v:.4g}" for k, v in finite.items())
        print(f"[{self._round_label(round_index, finite.get('time/round'), total)}] {shown}", file=self.stream,
              flush=True)
        if self.wandb_run is not None:
            self.wandb_run.log({**finite, "round": round_index})
        if self._ray_metrics and ray.is_initialized():
            for key, value in finite.items():
                self._gauge(key).set(value, tags={"run": self.run_name})

    def _round_label(self, round_index: int, seconds: float | None, total: int | None) -> str:
        if total is None:
            return f"round {round_index}"
        if seconds is not None:
            self._round_seconds.append(seconds)
        left = max(total - round_index - 1, 0)
        eta = (f" ETA {clock(left * sum(self._round_seconds) / len(self._round_seconds))}"
               if self._round_seconds and left else "")
        return f"round {round_index}/{total}{eta}"

    def log_checkpoint(self, directory: str | Path) -> None:
        """Attach a saved checkpoint's manifest and config to the W&B run: one artifact version per save.

        Only the small files travel; the artifact's metadata says where the weights are.
        """
        if self.wandb_run is None:
            return
        import wandb  # only with telemetry.wandb on: seconds to import

        directory = Path(directory)
        manifest = json.loads((directory / MANIFEST).read_text())
        keys = ("round", "policy_version", "retriever_version")
        artifact = wandb.Artifact(
            re.sub(r"[^\w.-]", "_", f"{self.run_name}-checkpoint"), type="checkpoint-manifest",
            metadata={"path": str(directory.resolve()), **{k: manifest[k] for k in keys}},
        )
        for name in (MANIFEST, CONFIG):
            if (directory / name).is_file():
                artifact.add_file(str(directory / name))
        self.wandb_run.log_artifact(artifact, aliases=["latest", f"round-{manifest['round']}"])

    def close(self) -> None:
        """Finish the W&B run and stop its service now, while the actor's process is still whole."""
        if self.wandb_run is not None:
            import wandb  # only with telemetry.wandb on: seconds to import

            self.wandb_run.finish()
            self.wandb_run = None
            wandb.teardown()


def wandb_run_id(run_dir: Path, resume: bool) -> str:
    """The W&B run id of the training run in ``run_dir``: the kept one when it resumes, else a new one, kept."""
    path = run_dir / WANDB_ID_FILE
    if resume and path.is_file() and (kept := path.read_text().strip()):
        return kept
    run_id = secrets.token_hex(4)  # W&B ids: 8 characters of [a-z0-9]
    write_text_atomic(path, run_id + "\n")
    return run_id

