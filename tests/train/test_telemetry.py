import io
import re

from bridge_ray.telemetry import WANDB_ID_FILE, Telemetry


def test_console_and_offline_wandb(tmp_path):
    out = io.StringIO()
    tel = Telemetry(tmp_path, "unit", config={"a": 1}, wandb_mode="offline", ray_metrics=False, stream=out)
    tel.log(0, {"reward": 0.25, "time/rollout": 1.5, "nan": float("nan")})
    tel.log(1, {"reward": 0.5})
    assert tel.wandb_run.summary["reward"] == 0.5 and tel.wandb_run.config["a"] == 1
    tel.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[round 0]") and "reward=0.25" in lines[0] and "nan" not in lines[0]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))


def test_each_checkpoint_logs_its_manifest_to_wandb(tmp_path):
    from bridge_ray.checkpoint import CheckpointManager, Manifest

    checkpoints = CheckpointManager(tmp_path / "checkpoints", keep=2)
    tel = Telemetry(tmp_path, "unit", wandb_mode="offline", ray_metrics=False, stream=io.StringIO())
    for round_index in (1, 2):
        path = checkpoints.save(Manifest(round_index, round_index, 0), lambda d: (d / "w.bin").write_bytes(b"x"))
        tel.log_checkpoint(path)
    tel.close()
    run = next((tmp_path / "wandb").glob("offline-run-*"))
    records = next(run.glob("run-*.wandb")).read_bytes()
    assert records.count(b"checkpoint-manifest") >= 2 and b"round-2" in records


def test_round_line_counts_rounds_and_gives_an_eta_from_the_mean_round_time():
    out = io.StringIO()
    tel = Telemetry("unused", "unit", wandb_mode="disabled", ray_metrics=False, stream=out)
    tel.log(0, {"time/round": 10.0}, total=5)
    tel.log(1, {"time/round": 30.0}, total=5)
    tel.log(4, {"time/round": 20.0}, total=5)
    tel.log(7, {"reward": 1.0})
    lines = out.getvalue().splitlines()
    assert [re.match(r"\[([^\]]*)\]", line).group(1) for line in lines] == [
        "round 0/5 ETA 00:40", "round 1/5 ETA 01:00", "round 4/5", "round 7",
    ]


def wandb_ids(run_dir) -> set[str]:
    """The run ids of the offline W&B runs in ``run_dir`` (folders ``offline-run-<date>_<time>-<id>[-<n>]``)."""
    return {re.match(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)", p.name).group(1)
            for p in (run_dir / "wandb").glob("offline-run-*")}


def test_a_resumed_run_logs_to_the_same_wandb_run_and_a_new_run_to_a_new_one(tmp_path):
    def session(resume: bool) -> str:
        tel = Telemetry(tmp_path, "unit", wandb_mode="offline", wandb_project="p", wandb_entity="team",
                        wandb_name="shown", resume=resume, ray_metrics=False, stream=io.StringIO())
        run = tel.wandb_run
        assert (run.project, run.entity, run.name) == ("p", "team", "shown")
        tel.close()
        return run.id

    first = session(resume=False)
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == first
    assert session(resume=True) == first
    fresh = session(resume=False)
    assert fresh != first and (tmp_path / WANDB_ID_FILE).read_text().strip() == fresh
    assert wandb_ids(tmp_path) == {first, fresh}
