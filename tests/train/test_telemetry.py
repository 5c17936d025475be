import io

from bridge_ray.telemetry import Telemetry


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
