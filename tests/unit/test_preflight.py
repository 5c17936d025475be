"""``train`` (and ``--dry-run``) parses every configured question file before Ray starts."""

import pytest

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.errors import InputError
from bridge_ray.train import run
from bridge_ray.train.preflight import check_engine, check_wandb, preflight

ROW = '{{"id": "{}", "question": "q", "golden_answers": ["a"]}}\n'


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    def connect(address):
        raise AssertionError("Ray started before the question files were checked")

    monkeypatch.setattr(run, "connect", connect)


@pytest.mark.parametrize("key", ["data.train=[{}]", "data.eval.nq={}"])
def test_malformed_question_file_fails_the_dry_run(tmp_path, capsys, key):
    path = tmp_path / "q.jsonl"
    path.write_text(ROW.format(0) + '{"id": "1", "question": "q"}\n')
    assert main(["train", "--dry-run", key.format(path)]) == 2
    assert f"error: {path}:2: missing key 'golden_answers'" in capsys.readouterr().err


def test_non_utf8_question_file_fails_the_run(tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    path.write_bytes(ROW.format(0).encode() + b'{"id": "1", "question": "\xff", "golden_answers": ["a"]}\n')
    assert main(["train", f"data.eval.nq={path}"]) == 2
    assert f"error: {path}:2: not UTF-8 text" in capsys.readouterr().err


def test_preflight_counts_the_questions(tmp_path):
    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train_file.write_text(ROW.format(0) + ROW.format(1) + "\n")
    eval_file.write_text(ROW.format(0))
    batch = ["rollout.questions_per_batch=2", "optim.mini_batch_size=1"]
    config = load_config(None, [f"data.train=[{train_file}]", f"data.eval.nq={eval_file}", *batch])
    assert preflight(config)[0] == f"data: train [{str(train_file)!r}] (2 questions); eval nq {eval_file} (1 questions)"



def test_preflight_names_the_bundled_worlds_it_trains_and_evaluates_on():
    config = load_config(None, ["data.world=gap", "data.world_size=small", "eval.worlds=[default]",
                                "rollout.questions_per_batch=2", "optim.mini_batch_size=1"])
    data, index = preflight(config)[:2]
    assert data.startswith("data: train the bundled gap world (")
    assert data.endswith("; eval the bundled gap world, the bundled world (eval.worlds)")
    assert index == "index: the bundled gap world's, built into the cache on first use"


@pytest.mark.parametrize("key", ["env", "netrc"])
def test_an_online_wandb_run_finds_its_key(tmp_path, monkeypatch, key):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config(None, ["telemetry.wandb_mode=online"])
    with pytest.raises(InputError, match="no W&B key"):
        check_wandb(config)
    if key == "env":
        monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    else:
        (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
        (tmp_path / ".netrc").chmod(0o600)
    check_wandb(config)


def test_the_vllm_backend_without_vllm_installed_is_a_warning(monkeypatch):
    """Without vLLM here, the vLLM backend gets a warning naming the fix (a cluster's image may still have it)."""
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else object())
    warning = check_engine(load_config(None, ["engine.backend=vllm"]))
    assert warning.startswith("warning: engine.backend: vllm, but vLLM is not installed here")
    assert check_engine(load_config(None, ["engine.backend=hf"])) is None
