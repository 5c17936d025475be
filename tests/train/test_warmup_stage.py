"""``train`` with the warm-up stage: base evaluation, cold-start SFT in a Ray task, then RL from its weights
(with dynamic sampling), every evaluation also on another bundled world (``eval.worlds``).

The tiny policy keeps it cheap; the stage runs through the real command, the real graph (twice: one to
evaluate the base policy, one to train) and the real index.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from job_fixtures import LOCAL_CPU, SMALL_JOB, tiny_policy_overrides

from bridge_ray.cli import main

pytestmark = pytest.mark.slow


def test_train_warms_up_then_trains_from_the_warm_policy(local_ray, tiny_policy, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--config", str(LOCAL_CPU), f"run.output_dir={out}", *SMALL_JOB,
               *tiny_policy_overrides(tiny_policy), "run.rounds=1", "warmup.enabled=true", "warmup.examples=4",
               "warmup.epochs=1", "warmup.batch_size=2", "eval.before_training=true", "eval.after_training=true",
               "telemetry.wandb_mode=disabled", "rollout.dynamic_sampling=true", "rollout.oversample=2.0",
               "algorithm.grpo.kl_coef=1e-3",  # a KL term: a round without a mixed group still trains
               "eval.worlds=[gap]"])  # the small gap world's split too, over its own index
    assert rc == 0
    printed = capsys.readouterr().out
    warm = Path(yaml.safe_load((out / "config.yaml").read_text())["policy"]["model"])
    try:
        summary = json.loads((warm / "warmup.json").read_text())
        assert summary["demonstrations"] == 4 and summary["base_model"] == str(tiny_policy)
        assert [json.loads(line)["label"] for line in (out / "eval.jsonl").read_text().splitlines()] == [
            "before", "warmup", "after"]
        for name in ("eval_before", "eval_warmup", "eval_after"):
            assert (out / f"{name}.json").is_file()
        assert "## evaluation by stage" in printed and "| world |" in (out / "eval_stages.md").read_text()
        for name in ("eval_before", "eval_warmup", "eval_after"):  # eval.worlds: each evaluation, 2 questions
            table = json.loads((out / f"{name}.json").read_text())
            assert {r["name"]: r["count"] for r in table["rows"]}.keys() >= {"world", "gap"}
            assert len(table["questions"]["gap"]["uid"]) == 2 and table["avg"] is not None
        phases = {r["phase"]: r["info"] for r in map(json.loads, (out / "phases.jsonl").read_text().splitlines())}
        assert "reward_positive" in phases["reward"], "the round's diagnostics"
        # dynamic sampling: 2 x 2 questions drawn; the policy trains on the mixed groups (at most 2), or on
        # every group (their KL term) when none is mixed
        assert phases["rollout"]["questions"] == 4
        mixed = round(4 * (1 - phases["reward"]["zero_variance_groups"]))
        assert phases["policy_update"]["groups"] == (min(mixed, 2) if mixed else 4)
        # one micro-batch per mini-batch of 2 questions: π_old of the first from its own training forward
        steps = 1 if mixed else 2
        assert phases["policy_update"]["forwards"] == {"old_logp": steps - 1, "train": steps, "reference": steps}
    finally:
        shutil.rmtree(warm, ignore_errors=True)  # keyed by this test's temporary policy: never reused
