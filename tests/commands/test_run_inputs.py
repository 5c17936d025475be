"""``train`` and ``eval`` check their folders, checkpoints, data files and flags before Ray starts or a model
loads: the real commands, in-process, on real bad input (Ray's start and the policy's load are replaced by
sentinels that fail the test if reached too early)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bridge_ray.cli import main

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")
RUN_FILES = ("phases.jsonl", "eval.jsonl", "config.yaml", "eval_before.md", "eval_before.json", "eval_stages.md")


class RayStarted(Exception):
    """Raised where ``train`` starts Ray: the command got past every input check."""


class ModelLoaded(Exception):
    """Raised where ``eval`` loads the policy: the command got past every input check."""


@pytest.fixture(autouse=True)
def sentinels(monkeypatch):
    def start_ray(address):
        raise RayStarted(address)

    def load_model(*args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr("bridge_ray.commands.train.connect", start_ray)
    monkeypatch.setattr("bridge_ray.rollout.sampler.Sampler", load_model)


def old_run(folder: Path, rounds: tuple[int, ...] = (248, 249, 250)) -> Path:
    """A run folder as ``train`` leaves it: checkpoints and ``latest``, logs, evaluation tables, config.yaml."""
    checkpoints = folder / "checkpoints"
    for r in rounds:
        checkpoint = checkpoints / f"round-{r:08d}"
        (checkpoint / "policy").mkdir(parents=True)
        (checkpoint / "policy" / "config.json").write_text("{}\n")
        manifest = {"round": r, "policy_version": r, "retriever_version": r, "files": {"policy/config.json": 3}}
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    (checkpoints / "latest").write_text(f"round-{rounds[-1]:08d}")
    for name in RUN_FILES:
        (folder / name).write_text("{}\n")
    return folder


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


@pytest.mark.parametrize(
    ("rounds", "span"), [((248, 249, 250), "rounds 248-250"), ((3, 249, 250), "rounds 3, 249, 250")]
)
def test_train_refuses_a_folder_holding_another_run(tmp_path, capsys, rounds, span):
    out = old_run(tmp_path / "run", rounds)
    before = snapshot(out)
    err = refused(train(out), capsys)
    assert f"{out} already holds another run's checkpoints of {span} (in {out / 'checkpoints'})" in err
    assert "logs (phases.jsonl, eval.jsonl)" in err and "--resume" in err and "--overwrite" in err
    assert snapshot(out) == before


def test_train_refuses_a_folder_holding_another_runs_logs(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "phases.jsonl").write_text("{}\n")
    assert f"{out} already holds another run's logs (phases.jsonl)" in refused(train(out), capsys)


def test_train_starts_in_a_folder_without_a_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("{}\n")  # a run that failed before its first round: nothing to mix with
    with pytest.raises(RayStarted):
        main(train(out))


def test_overwrite_removes_the_old_run_and_nothing_else(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    (out / "notes.md").write_text("mine\n")
    (out / "checkpoints" / "README").write_text("mine too\n")
    (out / "wandb" / "offline-run-1").mkdir(parents=True)
    (out / "wandb" / "offline-run-1" / "run.wandb").write_text("w\n")
    with pytest.raises(RayStarted):
        main(train(out, "--overwrite"))
    assert sorted(snapshot(out)) == ["checkpoints/README", "notes.md", "wandb/offline-run-1/run.wandb"]
    assert "--overwrite: removed checkpoints of rounds 248-250" in capsys.readouterr().out


def test_overwrite_under_dry_run_removes_nothing(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    with pytest.raises(RayStarted):
        main(train(out, "--overwrite", "--dry-run"))
    assert snapshot(out) == before
    assert "--overwrite: would remove checkpoints of rounds 248-250" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--resume", "--auto-resume"])
def test_resume_flags_continue_the_run_in_the_folder(tmp_path, flag):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    with pytest.raises(RayStarted):
        main(train(out, flag))
    assert snapshot(out) == before


def test_resume_without_a_checkpoint_fails_before_ray(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "phases.jsonl").write_text("{}\n")  # a run that died before its first checkpoint
    err = refused(train(out, "--resume"), capsys)
    assert f"error: --resume: no complete checkpoint under {out / 'checkpoints'}" in err


def test_resume_from_a_damaged_checkpoint_names_the_missing_file(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    missing = out / "checkpoints" / "round-00000250" / "policy" / "config.json"
    missing.unlink()
    assert f"--resume: {missing}: listed in" in refused(train(out, "--resume"), capsys)


def test_resume_with_another_seed_fails_before_ray(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    checkpoint = out / "checkpoints" / "round-00000250"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "manifest.json").write_text(json.dumps({**manifest, "data_cursor": {"seed": 7}}))
    err = refused(train(out, "--resume"), capsys)
    assert f"--resume: {checkpoint} was trained with run.seed=7, the config says 0" in err


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
