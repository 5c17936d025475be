"""``train`` and ``eval`` check their folders, checkpoints, data files and flags before Ray starts or a model
loads: the real commands, in-process, on real bad input (Ray's start and the policy's load are replaced by
sentinels that fail the test if reached too early). The job's own checks are tested in tests/train/test_job.py;
here, that ``train`` reaches them with its flags and reports a refusal as one ``error:`` line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from job_fixtures import old_run

from bridge_ray.cli import main

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")


class RayStarted(Exception):
    """Raised where ``train`` starts Ray: the command got past every input check."""


class ModelLoaded(Exception):
    """Raised where ``eval`` loads the policy: the command got past every input check."""


@pytest.fixture(autouse=True)
def sentinels(monkeypatch):
    def start_ray(address, dashboard=True):
        raise RayStarted(address)

    def load_model(*args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr("bridge_ray.train.run.connect", start_ray)
    monkeypatch.setattr("bridge_ray.sampler.sampler.Sampler", load_model)


def train(out: Path, *flags: str) -> list[str]:
    return ["train", *flags, "--config", LOCAL_CPU, f"run.output_dir={out}", "data.world_size=small",
            "warmup.enabled=false"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys) -> str:
    """stderr of ``argv``, which must exit 2 with one ``error:`` line and no traceback."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_train_refuses_a_folder_holding_another_run(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    assert f"{out} already holds another run's checkpoints of rounds 248-250" in refused(train(out), capsys)
    assert snapshot(out) == before


def test_train_passes_its_flags_to_the_job(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    with pytest.raises(RayStarted):
        main(train(out, "--overwrite", "--dry-run"))
    assert snapshot(out) == before
    assert "--overwrite: would remove checkpoints of rounds 248-250" in capsys.readouterr().out
    with pytest.raises(RayStarted):
        main(train(out, "--auto-resume"))
    assert f"--resume: no complete checkpoint under {tmp_path / 'none'}" in refused(
        train(tmp_path / "none", "--resume"), capsys)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_eval_max_questions_must_be_positive(capsys, value):
    assert f"error: --max-questions {value}: must be at least 1" in refused(
        ["eval", "--max-questions", value, "data.world_size=small"], capsys
    )


def test_eval_names_a_missing_data_file_before_loading_a_model(tmp_path, capsys):
    gone = tmp_path / "gone.jsonl"
    assert f"data.eval.dev: {gone} is not a file" in refused(["eval", "--data", f"dev={gone}"], capsys)


def test_eval_names_the_bad_line_of_a_data_file_before_loading_a_model(tmp_path, capsys):
    bad = tmp_path / "dev.jsonl"
    bad.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n{oops\n")
    assert f"{bad}:2" in refused(["eval", "--data", f"dev={bad}"], capsys)


def test_eval_refuses_a_checkpoint_without_a_policy(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    policy = out / "checkpoints" / "round-00000250" / "policy"
    (policy / "config.json").unlink()
    policy.rmdir()
    err = refused(["eval", "--checkpoint", str(out / "checkpoints")], capsys)
    assert f"--checkpoint {out / 'checkpoints'}: {policy} holds no model" in err


def test_eval_refuses_a_checkpoint_missing_a_file_its_manifest_lists(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    checkpoint = out / "checkpoints" / "round-00000249"
    (checkpoint / "manifest.json").write_text(json.dumps(
        {"round": 249, "policy_version": 1, "retriever_version": 0, "files": {"policy/config.json": 3, "policy/w": 9}}
    ))
    assert f"{checkpoint / 'policy' / 'w'}: listed in" in refused(["eval", "--checkpoint", str(checkpoint)], capsys)
