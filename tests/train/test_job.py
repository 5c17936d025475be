"""The job's decisions without Ray: which checkpoint a run resumes, what it does about an earlier run in its folder,
which stages a re-run skips or resumes; then the real checks of a run's folder and checkpoint on real bad input
(Ray's start is replaced by a sentinel that fails the test if reached too early); and the tables a job prints."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from job_fixtures import old_run

from bridge_ray.cache import MARKER
from bridge_ray.config import load_config
from bridge_ray.errors import InputError
from bridge_ray.evaluation.table import QuestionOutcome, summarize
from bridge_ray.train.job import plan_stages, run_job, stages_markdown
from bridge_ray.train.run import ray_lines
from bridge_ray.train.run_evals import (
    EVAL_AFTER,
    EVAL_WARMUP,
    kept_graph_table,
    run_evaluations,
    stage_table,
    world_config,
)
from bridge_ray.train.run_folder import JobFlags, claim_action, round_span, wants_resume
from bridge_ray.train.stages import StageRecord

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")
GAP_DEMO = str(REPO / "jobs/configs/local_cpu_gap.yaml")
NEW, RESUME, AUTO, OVERWRITE = JobFlags(), JobFlags(resume=True), JobFlags(auto_resume=True), JobFlags(overwrite=True)


# ---- decisions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "flags", "action"),
    [
        (None, NEW, "none"),
        (None, OVERWRITE, "none"),
        ("logs", NEW, "refuse"),
        ("logs", RESUME, "none"),
        ("logs", AUTO, "none"),
        ("logs", OVERWRITE, "remove"),
        ("logs", JobFlags(overwrite=True, dry_run=True), "report"),
        ("logs", JobFlags(dry_run=True), "refuse"),
    ],
)
def test_claim_action(held, flags, action):
    assert claim_action(held, flags) == action


def test_wants_resume(tmp_path):
    latest = tmp_path / "round-00000003"
    assert wants_resume(RESUME, latest, tmp_path) and wants_resume(AUTO, latest, tmp_path)
    assert not wants_resume(NEW, latest, tmp_path) and not wants_resume(OVERWRITE, latest, tmp_path)
    assert not wants_resume(AUTO, None, tmp_path) and not wants_resume(NEW, None, tmp_path)
    with pytest.raises(InputError, match=re.escape(f"--resume: no complete checkpoint under {tmp_path}; pass")):
        wants_resume(RESUME, None, tmp_path)


def record(name: str) -> StageRecord:
    return StageRecord(name, "policy", None, 1, "previous", f"/ck/{name}", f"/ck/{name}/policy", None, None)


NAMES = ["rag", "rl", "both"]


def plan(finished, checkpointed=frozenset(), flags=NEW, recorded=None):
    recorded = any(finished) if recorded is None else recorded
    steps = plan_stages(NAMES, finished, set(checkpointed), recorded, flags, Path("/run/stages.json"),
                        Path("/run/stages"))
    assert [s.index for s in steps] == list(range(len(NAMES)))
    return [("skip" if s.record else "resume" if s.resume else "run") for s in steps]


def test_a_new_schedule_runs_every_stage():
    assert plan([None, None, None]) == ["run", "run", "run"]
    assert plan([None, None, None], flags=AUTO) == ["run", "run", "run"]


def test_a_rerun_skips_finished_stages_and_resumes_a_checkpointed_one_only_when_asked():
    finished = [record("rag"), None, None]
    assert plan(finished, {1}) == ["skip", "run", "run"]  # without a flag the stage's own run refuses its folder
    assert plan(finished, {1}, RESUME) == ["skip", "resume", "run"]
    assert plan(finished, {1}, AUTO) == ["skip", "resume", "run"]
    assert plan([record("rag"), record("rl"), record("both")], flags=RESUME) == ["skip", "skip", "skip"]


def test_resume_needs_a_finished_stage_or_a_stage_checkpoint():
    assert plan([None, None, None], {0}, RESUME) == ["resume", "run", "run"]
    with pytest.raises(InputError, match=re.escape("--resume: no finished stage in /run/stages.json and no stage "
                                                   "checkpoint under /run/stages; pass --auto-resume")):
        plan([None, None, None], flags=RESUME)


def test_a_finished_stage_after_an_unfinished_one_is_an_error():
    with pytest.raises(InputError, match="records both finished, but stage 'rl' before it did not finish"):
        plan([record("rag"), None, record("both")])


@pytest.mark.parametrize(
    ("warmup", "before", "after", "resume", "expected"),
    [
        (True, True, True, False, ("eval_before", "eval_warmup", "eval_after")),
        (False, True, True, False, (None, "eval_before", "eval_after")),
        (True, True, False, True, (None, None, None)),  # a resumed run evaluated its start already
        (True, False, True, False, (None, None, "eval_after")),
    ],
)
def test_run_evaluations(warmup, before, after, resume, expected):
    config = load_config(None, [f"warmup.enabled={str(warmup).lower()}", f"eval.before_training={str(before).lower()}",
                                f"eval.after_training={str(after).lower()}"])
    evaluations = run_evaluations(config, resume)
    names = tuple(e and e.name for e in (evaluations.base, evaluations.before, evaluations.after))
    assert names == expected
    labels = {e.name: e.label for e in (evaluations.base, evaluations.before, evaluations.after) if e}
    assert {"eval_before": "before", "eval_warmup": "warmup", "eval_after": "after"}.items() >= labels.items()


def test_the_base_policy_evaluation_can_be_left_out_and_the_warm_up_stays_the_baseline():
    config = load_config(GAP_DEMO, [])
    assert not config.eval.base_policy
    evaluations = run_evaluations(config, resume=False)
    assert (evaluations.base, evaluations.before, evaluations.after) == (None, EVAL_WARMUP, EVAL_AFTER)


def test_eval_worlds_take_their_own_question_count():
    config = load_config(GAP_DEMO, [])
    first = world_config(config, "default")
    assert (first.data.world, first.eval.max_questions, first.retrieval.index.dir) == ("default", 64, None)
    assert (config.data.world, config.eval.max_questions) == ("gap", 200)
    assert world_config(load_config(None, ["eval.max_questions=5"]), "gap").eval.max_questions == 5


def test_round_span():
    assert round_span([3]) == "round 3"
    assert round_span([248, 249, 250]) == "rounds 248-250"
    assert round_span([3, 249, 250]) == "rounds 3, 249, 250"


# ---- the checks of a run's folder and checkpoint, before Ray starts -------------------------------------


class RayStarted(Exception):
    """Raised where the job starts Ray: the run got past every input check."""


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    def start_ray(address, dashboard=True):
        raise RayStarted(address)

    monkeypatch.setattr("bridge_ray.train.run.connect", start_ray)


def job(out: Path, flags: JobFlags = NEW) -> None:
    run_job(load_config(LOCAL_CPU, [f"run.output_dir={out}", "data.world_size=small", "warmup.enabled=false"]), flags)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(out: Path, flags: JobFlags = NEW) -> str:
    """The one problem the job reports for ``out``."""
    with pytest.raises(InputError) as caught:
        job(out, flags)
    [problem] = caught.value.problems
    return problem


@pytest.mark.parametrize(
    ("rounds", "span"), [((248, 249, 250), "rounds 248-250"), ((3, 249, 250), "rounds 3, 249, 250")]
)
def test_a_new_run_refuses_a_folder_holding_another_run(tmp_path, rounds, span):
    out = old_run(tmp_path / "run", rounds)
    before = snapshot(out)
    problem = refused(out)
    assert f"{out} already holds another run's checkpoints of {span} (in {out / 'checkpoints'})" in problem
    assert "logs (phases.jsonl, eval.jsonl)" in problem and "--resume" in problem and "--overwrite" in problem
    assert snapshot(out) == before


def test_a_new_run_refuses_a_folder_holding_another_runs_logs(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "phases.jsonl").write_text("{}\n")
    assert f"{out} already holds another run's logs (phases.jsonl)" in refused(out)


def test_a_new_run_starts_in_a_folder_without_a_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("{}\n")  # a run that failed before its first round: nothing to mix with
    with pytest.raises(RayStarted):
        job(out)


def test_overwrite_removes_the_old_run_and_nothing_else(tmp_path, capsys):
    out = old_run(tmp_path / "run")
    (out / "notes.md").write_text("mine\n")
    (out / "checkpoints" / "README").write_text("mine too\n")
    (out / "wandb" / "offline-run-1").mkdir(parents=True)
    (out / "wandb" / "offline-run-1" / "run.wandb").write_text("w\n")
    with pytest.raises(RayStarted):
        job(out, OVERWRITE)
    assert sorted(snapshot(out)) == ["checkpoints/README", "notes.md", "wandb/offline-run-1/run.wandb"]
    assert "--overwrite: removed checkpoints of rounds 248-250" in capsys.readouterr().out


@pytest.mark.parametrize("flags", [RESUME, AUTO], ids=["--resume", "--auto-resume"])
def test_resume_flags_continue_the_run_in_the_folder(tmp_path, flags):
    out = old_run(tmp_path / "run")
    before = snapshot(out)
    with pytest.raises(RayStarted):
        job(out, flags)
    assert snapshot(out) == before


def test_resume_without_a_checkpoint_fails_before_ray(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "phases.jsonl").write_text("{}\n")  # a run that died before its first checkpoint
    assert refused(out, RESUME).startswith(f"--resume: no complete checkpoint under {out / 'checkpoints'}")


def test_resume_from_a_damaged_checkpoint_names_the_missing_file(tmp_path):
    out = old_run(tmp_path / "run")
    missing = out / "checkpoints" / "round-00000250" / "policy" / "config.json"
    missing.unlink()
    assert f"--resume: {missing}: listed in" in refused(out, RESUME)


def test_resume_with_another_seed_fails_before_ray(tmp_path):
    out = old_run(tmp_path / "run")
    checkpoint = out / "checkpoints" / "round-00000250"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "manifest.json").write_text(json.dumps({**manifest, "data_cursor": {"seed": 7}}))
    assert f"--auto-resume: {checkpoint} was trained with run.seed=7, the config says 0" in refused(out, AUTO)


@pytest.mark.parametrize(("saved", "named"), [
    (["learner.lora.enabled=false"], "learner.lora.enabled: checkpoint False, config True"),
    (["retrieval.lora.rank=8"], "retrieval.lora.rank: checkpoint 8, config 16"),
])
def test_resume_with_other_adapters_fails_before_ray(tmp_path, saved, named):
    """DeepSpeed would fail deep in its optimizer-state load (or a query adapter of another shape would not load)."""
    from bridge_ray.checkpoint import CONFIG
    from bridge_ray.config import dump_config

    out = old_run(tmp_path / "run")
    checkpoint = out / "checkpoints" / "round-00000250"
    trained = load_config(LOCAL_CPU, [f"run.output_dir={out}", "data.world_size=small", "warmup.enabled=false", *saved])
    (checkpoint / CONFIG).write_text(dump_config(trained))
    problem = refused(out, RESUME)
    assert problem.startswith(f"--resume: {checkpoint} was trained with other adapters ({named})"), problem


# ---- what a job prints ---------------------------------------------------------------------------------


def _table(em: float, recall: float | None) -> dict:
    return {"rows": [{"name": "world", "count": 4, "em": em, "f1": em + 1, "cover_em": em, "recall": recall,
                      "multi_hop": False}], "m_avg": None, "avg": em, "questions": {}}


def test_stage_table_puts_the_evaluations_side_by_side(tmp_path):
    assert stage_table(tmp_path) is None
    (tmp_path / "eval_before.json").write_text(json.dumps(_table(0.0, 50.0)))
    assert stage_table(tmp_path) is None  # one stage: nothing to compare
    (tmp_path / "eval_warmup.json").write_text(json.dumps(_table(40.0, None)))
    (tmp_path / "eval_after.json").write_text(json.dumps(_table(45.5, 60.0)))
    lines = stage_table(tmp_path).splitlines()
    assert lines[0] == "| data set | base EM / F1 / recall | warm-up EM / F1 / recall | after RL EM / F1 / recall |"
    assert lines[2] == "| world | 0.0 / 1.0 / 50.0 | 40.0 / 41.0 / – | 45.5 / 46.5 / 60.0 |"


def test_a_kept_evaluation_starts_no_graph_and_still_joins_the_learning_curve(
    tmp_path, monkeypatch, tiny_policy, world_index, small_world
):
    root = tmp_path / "cache"  # the tiny policy and the index as finished cache entries
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(root))
    for parent, source in ((root / "models", tiny_policy), (root / "indexes", world_index)):
        shutil.copytree(source, parent / source.name)
        (parent / source.name / MARKER).write_text("{}")
    config = load_config(LOCAL_CPU, [f"policy.model={root / 'models' / tiny_policy.name}",
                                     f"retrieval.index.dir={root / 'indexes' / world_index.name}",
                                     f"data.eval.world={small_world / 'test.jsonl'}"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    graphs = []

    def on_a_graph():  # what the graph's evaluation returns (and appends to eval.jsonl itself)
        graphs.append(1)
        return summarize({"world": [QuestionOutcome(1.0, 1.0, 1.0, 0.5, "single", "q1", "x", ("x",))]})

    first = kept_graph_table(config, run_dir, EVAL_WARMUP, on_a_graph)
    assert graphs == [1] and not (run_dir / "eval.jsonl").exists()
    again = kept_graph_table(config, run_dir, EVAL_WARMUP, on_a_graph)
    assert graphs == [1] and again.to_json() == first.to_json()  # kept: no graph evaluated it
    [record] = map(json.loads, (run_dir / "eval.jsonl").read_text().splitlines())
    assert (record["label"], record["round"], record["policy_version"], record["retriever_version"]) == (
        "warmup", 0, 0, 0)
    assert record["table"] == json.loads(first.to_json())
    moved = config.model_copy(update={"policy": config.policy.model_copy(update={"model": str(tiny_policy)})})
    kept_graph_table(moved, run_dir, EVAL_WARMUP, on_a_graph)  # a policy the cache did not build: evaluated
    assert graphs == [1, 1]


def test_stages_markdown_names_gamma_and_em():
    rag = StageRecord("rag", "retriever", "inf", 2, "previous", "/ck/rag", "/p", "/a", {"avg": 12.345})
    rl = StageRecord("rl", "policy", None, 1, "previous", "/ck/rl", "/p", None, None)
    both = StageRecord("both", "both", None, 3, "previous", "/ck/both", "/p", "/a", {"avg": None})
    assert stages_markdown([rag, rl, both]).splitlines()[2:] == [
        "| rag | retriever | inf | 2 | /ck/rag | 12.3 |",
        "| rl | policy | – | 1 | /ck/rl | – |",
        "| both | both | config | 3 | /ck/both | – |",
    ]


def test_the_dashboard_and_the_token_command_are_named():
    lines = ray_lines("10.0.0.1:6379", "127.0.0.1:8265", token_auth=True)
    assert lines[0] == "Ray: 10.0.0.1:6379; dashboard: http://127.0.0.1:8265"
    assert len(lines) == 2 and "`ray get-auth-token`" in lines[1]


def test_without_token_auth_or_dashboard_nothing_is_promised():
    assert ray_lines("10.0.0.1:6379", "https://ray.example.org", token_auth=False) == [
        "Ray: 10.0.0.1:6379; dashboard: https://ray.example.org"
    ]
    assert ray_lines("10.0.0.1:6379", None, token_auth=False) == [
        "Ray: 10.0.0.1:6379; dashboard: none (Ray started without it)"
    ]
