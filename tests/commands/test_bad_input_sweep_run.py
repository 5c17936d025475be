"""The bad-input sweep of the checks before the work: what ``train`` checks before Ray, ``train --dry-run`` checks
too (a staged config's first stage included), and ``eval`` / ``build-index`` check their encoder, data names and
files before a model loads.

Same pattern as :mod:`test_bad_input_sweep`: ``bridge_ray.cli.main`` runs in-process; each case asserts the exit
code, the ``error:`` line naming the culprit, no traceback, and that the workspace is exactly as it was. Ray, the
server, the model loaders and the index builder are replaced by functions that fail the test if reached.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_bad_input_sweep import (
    LOCAL_CPU,
    UNKNOWN_ENCODER,
    Case,
    adapter,
    checkpoint_of,
    config_file,
    policy_config,
    question,
    snapshot,
    train,
    write_lines,
)

from bridge_ray.cli import main

E5 = "intfloat/e5-base-v2"


def questions(ws: Path, name: str = "qa.jsonl", first: int = 0, count: int = 4) -> str:
    return str(write_lines(ws / name, [question(i) for i in range(first, first + count)]))


def one_source(ws: Path, folder: str) -> str:
    """``ws/<folder>/nq/train.jsonl``: its questions' uids are ``nq/train/<id>`` whichever the folder."""
    (ws / folder / "nq").mkdir(parents=True)
    return questions(ws / folder / "nq", "train.jsonl")


def demonstrations(ws: Path, lines: list[str]) -> list[str]:
    """``train --dry-run`` warming up on the demonstration file ``lines``."""
    return train(ws, "--dry-run", "warmup.enabled=true", f"warmup.data={write_lines(ws / 'demos.jsonl', lines)}")


TURNS = json.dumps({"question": "q?", "turns": [{"action": "<answer> a </answer>"}]})


def other_encoders_checkpoint(ws: Path) -> Path:
    """A checkpoint (under ``ws/other``) of a run that retrieved with e5: its config says so and its retriever
    adapter is an e5 adapter (768 wide)."""
    parts = {"policy": policy_config,
             "retriever_adapter": lambda p: shutil.move(adapter(ws, width=768, base=E5), p)}
    return checkpoint_of(ws / "other", parts, **{"retrieval.encoder.name": E5})


def staged(ws: Path, *stages: dict, flags: tuple[str, ...] = ("--dry-run",)) -> list[str]:
    """``train`` of a ``stages:`` schedule into ``ws/run``."""
    return train(ws, *flags, f"stages={json.dumps(list(stages))}", "warmup.enabled=false")


def recorded_stage(ws: Path, rounds: int) -> list[str]:
    """A schedule whose one stage ``stages.json`` records as finished with ``rounds`` rounds; the config says 2."""
    (ws / "run").mkdir()
    record = {"name": "a", "train": "retriever", "gamma": None, "rounds": rounds, "start": "previous",
              "checkpoint": str(ws / "ck"), "policy": str(ws / "ck/policy"), "adapter": None, "eval": None}
    (ws / "run/stages.json").write_text(json.dumps({"stages": [record]}))
    return staged(ws, {"name": "a", "train": "retriever", "rounds": 2})


def held(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` with ``folder`` holding another run's log."""
    folder.mkdir(parents=True)
    (folder / "phases.jsonl").write_text("{}\n")
    return argv


def evaluate(ws: Path, *data: str) -> list[str]:
    return ["eval", "--config", LOCAL_CPU, *(arg for item in data for arg in ("--data", item))]


def build_index(ws: Path, *args: str) -> list[str]:
    corpus = write_lines(ws / "c.jsonl", [json.dumps({"id": "d0", "contents": "x"})])
    return ["build-index", "--corpus", str(corpus), "--out", str(ws / "out"), "--no-progress", *args]


SEED_CASES = [
    Case("train --dry-run with a negative run.seed", lambda ws, a: train(ws, "--dry-run", "run.seed=-1"),
         "run.seed: Input should be greater than or equal to 0"),
    Case("train with a negative run.seed", lambda ws, a: train(ws, "run.seed=-3"), "run.seed"),
    Case("train with a run.seed numpy cannot take", lambda ws, a: train(ws, "--dry-run", f"run.seed={2**32}"),
         "run.seed: Input should be less than or equal to 4294967295"),
]

ENCODER_CASES = [
    Case("train --dry-run with a passage encoder that does not exist",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.passage_name={ws / 'no-passage'}"),
         "retrieval.encoder.passage_name: {ws}/no-passage does not exist"),
    Case("eval with a passage encoder that does not exist",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, f"retrieval.encoder.passage_name={ws / 'no-passage'}"],
         "retrieval.encoder.passage_name: {ws}/no-passage does not exist"),
    Case("eval with a passage encoder neither a folder nor cached, offline",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, "retrieval.encoder.passage_name=nobody/no-such-encoder"],
         "retrieval.encoder.passage_name: nobody/no-such-encoder is not in the Hugging Face cache"),
    Case("build-index --passage-encoder that does not exist",
         lambda ws, a: build_index(ws, "--passage-encoder", str(ws / "no-passage")),
         "--passage-encoder: {ws}/no-passage does not exist"),
    Case("build-index --encoder that does not exist",
         lambda ws, a: [*build_index(ws, "--encoder", str(ws / "no-encoder")), *UNKNOWN_ENCODER],
         "--encoder: {ws}/no-encoder does not exist"),
    Case("build-index --encoder that is not a model folder",
         lambda ws, a: [*build_index(ws, "--encoder", str(ws)), *UNKNOWN_ENCODER],
         "--encoder: {ws} is not a Hugging Face model directory"),
]

WARMUP_CASES = [
    Case("warmup.data record with neither turns nor messages",
         lambda ws, a: demonstrations(ws, [TURNS, json.dumps({"question": "q?", "answer": "a"})]),
         "warmup.data: {ws}/demos.jsonl:2: expected a 'turns' (trajectory) or 'messages' (chat) record"),
    Case("warmup.data line that is not JSON", lambda ws, a: demonstrations(ws, [TURNS, "{oops"]),
         "warmup.data: {ws}/demos.jsonl:2"),
    Case("warmup.data chat record without an assistant message",
         lambda ws, a: demonstrations(ws, [json.dumps({"messages": [{"role": "user", "content": "q?"}]})]),
         "{ws}/demos.jsonl:1: no assistant message to learn from"),
    Case("warmup.data turn without an action",
         lambda ws, a: demonstrations(ws, [json.dumps({"question": "q?", "turns": [{"observation": "x"}]})]),
         "{ws}/demos.jsonl:1: turns[0].action must be a non-empty string"),
    Case("warmup.data holding no record", lambda ws, a: demonstrations(ws, [""]),
         "warmup.data: {ws}/demos.jsonl: no demonstrations"),
]

TRAIN_DATA_CASES = [
    Case("the same file twice in data.train",
         lambda ws, a: train(ws, "--dry-run", f"data.train=[{questions(ws)},{ws / 'qa.jsonl'}]"),
         "data.train[1]: {ws}/qa.jsonl is data.train[0] again"),
    Case("two data.train files of one source sharing question ids",
         lambda ws, a: train(ws, "--dry-run", f"data.train=[{one_source(ws, 'x')},{one_source(ws, 'y')}]"),
         "data.train: duplicate question uid 'nq/train/0' at {ws}/y/nq/train.jsonl:1 (first at {ws}/x/nq/"),
    Case("a data.eval name with a slash",
         lambda ws, a: ["train", "--dry-run", "--config",
                        config_file(ws, f"run:\n  output_dir: {ws / 'run'}\ndata:\n  eval:\n    nq/dev: x.jsonl\n")],
         "data.eval: the name 'nq/dev'"),
]

OTHER_ADAPTER = "stages.{i}.start {{ws}}/other/run/checkpoints/round-000002/retriever_adapter: an adapter of " + E5

STAGE_CASES = [
    Case("train --dry-run of a first stage from a checkpoint of another encoder",
         lambda ws, a: staged(ws, {"name": "a", "train": "retriever", "rounds": 1,
                                   "start": str(other_encoders_checkpoint(ws))}),
         OTHER_ADAPTER.format(i=0)),
    Case("train of a first stage from a checkpoint of another encoder",
         lambda ws, a: staged(ws, {"name": "a", "train": "retriever", "rounds": 1,
                                   "start": str(other_encoders_checkpoint(ws))}, flags=()),
         OTHER_ADAPTER.format(i=0)),
    Case("train --dry-run of a later stage from a checkpoint of another encoder",
         lambda ws, a: staged(ws, {"name": "a", "train": "retriever", "rounds": 1}, {
             "name": "b", "train": "policy", "rounds": 1, "start": str(other_encoders_checkpoint(ws))}),
         OTHER_ADAPTER.format(i=1)),
    Case("train --dry-run of a stage recorded finished with other rounds", lambda ws, a: recorded_stage(ws, rounds=1),
         "stage 'a' finished as"),
    Case("train --dry-run --resume of a schedule with nothing to resume",
         lambda ws, a: staged(ws, {"name": "a", "train": "retriever", "rounds": 1}, flags=("--dry-run", "--resume")),
         "--resume: no finished stage in {ws}/run/stages.json"),
    Case("train --dry-run of a schedule whose first stage's folder holds another run",
         lambda ws, a: held(ws / "run/stages/a", staged(ws, {"name": "a", "train": "retriever", "rounds": 1})),
         "{ws}/run/stages/a already holds another run's logs (phases.jsonl)"),
    Case("train --dry-run of a schedule whose first stage has too few questions",
         lambda ws, a: [*staged(ws, {"name": "a", "train": "both", "rounds": 1}),
                        f"data.train=[{questions(ws, count=1)}]"],
         "data.train: 1 training questions, fewer than one batch"),
]

EVAL_DATA_CASES = [
    Case("eval --data name with a dot", lambda ws, a: evaluate(ws, f"nq.dev={questions(ws)}"),
         "--data 'nq.dev={ws}/qa.jsonl': the name 'nq.dev'"),
    Case("eval --data name with a slash", lambda ws, a: evaluate(ws, f"nq/dev={questions(ws)}"),
         "--data 'nq/dev={ws}/qa.jsonl': the name 'nq/dev'"),
    Case("eval --data of one name twice",
         lambda ws, a: evaluate(ws, f"dev={questions(ws)}", f"dev={questions(ws, 'b.jsonl')}"),
         "--data: the name 'dev' is given twice"),
    Case("eval --data of a file that does not exist", lambda ws, a: evaluate(ws, f"dev={ws / 'gone.jsonl'}"),
         "data.eval.dev: {ws}/gone.jsonl is not a file"),
    Case("eval --data of a broken question file",
         lambda ws, a: evaluate(ws, f"dev={write_lines(ws / 'qa.jsonl', [question(0), '{oops'])}"), "qa.jsonl:2"),
]

CASES = SEED_CASES + ENCODER_CASES + WARMUP_CASES + TRAIN_DATA_CASES + STAGE_CASES + EVAL_DATA_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_checked_before_any_model_loads_or_ray_starts(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ray.init", _reached("Ray started"))
    monkeypatch.setattr("bridge_ray.train.local_eval.evaluate_policy", _reached("the evaluation started"))
    monkeypatch.setattr("bridge_ray.retrieval.build.build_configured_index", _reached("the index build started"))
    monkeypatch.setattr("bridge_ray.retrieval.encoder.load_backbone", _reached("an encoder loaded"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = case.setup(ws, None)
    capsys.readouterr()
    before, paths = snapshot(ws), sorted(ws.rglob("*"))
    assert main(argv) == case.rc
    err = capsys.readouterr().err
    assert case.culprit.format(ws=ws) in err, err
    assert err.startswith("error: ") or "\nerror: " in err, err
    assert "Traceback" not in err
    assert snapshot(ws) == before, "the failed command changed its inputs or left output behind"
    assert sorted(ws.rglob("*")) == paths, "the failed command left a folder behind"


def _reached(what: str):
    def fail(*args, **kwargs):
        raise AssertionError(f"a bad-input check must fail before {what}")

    return fail


def test_dry_run_and_train_check_a_stage_start_with_one_function(tmp_path, monkeypatch):
    """A schedule's stage starts are checked by the one function both paths call before Ray."""
    from bridge_ray.config import load_config
    from bridge_ray.errors import InputError
    from bridge_ray.train.job import stage_starts

    start = other_encoders_checkpoint(tmp_path)
    config = load_config(LOCAL_CPU, [f"run.output_dir={tmp_path / 'run'}", "warmup.enabled=false",
                                     f"stages=[{{name: a, train: retriever, rounds: 1, start: {start}}}]"])
    with pytest.raises(InputError, match=r"stages\.0\.start .*retriever_adapter: an adapter of intfloat/e5"):
        stage_starts(config)


GOOD_SCHEDULES = {
    "a schedule from the config's own start": lambda ws: staged(ws, {"name": "a", "train": "retriever", "rounds": 1}),
    "--overwrite of a schedule whose stage folder holds a run": lambda ws: held(
        ws / "run/stages/a", staged(ws, {"name": "a", "train": "retriever", "rounds": 1},
                                    flags=("--dry-run", "--overwrite"))),
}


@pytest.mark.parametrize("setup", GOOD_SCHEDULES.values(), ids=GOOD_SCHEDULES.keys())
def test_a_good_schedule_passes_its_first_stage_checks_and_reaches_ray(setup, tmp_path, monkeypatch):
    """The first stage's checks refuse only what is wrong: under --overwrite its folder is reported, not refused."""
    monkeypatch.setattr("ray.init", _reached("Ray started"))
    with pytest.raises(AssertionError, match="before Ray started"):
        main(setup(tmp_path))
