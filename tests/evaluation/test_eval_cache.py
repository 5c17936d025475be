"""The evaluation cache (bench learn's round 0, train's evaluations of the base model and the warm-up): a cached
policy's table over a cached index is computed once (a real greedy evaluation of the tiny policy on the small
world) and read after; anything it depends on, changed, is another key; a policy or an index the cache did not
build is never cached."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bridge_ray.cache import MARKER
from bridge_ray.config import load_config
from bridge_ray.evaluation import cache as eval_cache
from bridge_ray.evaluation.cache import cached_table, evaluation_file, evaluation_key
from bridge_ray.train.local_eval import evaluate_policy


def _entry(parent: Path, source: Path) -> Path:
    """A finished cache entry holding a copy of ``source``."""
    target = parent / source.name
    shutil.copytree(source, target)
    (target / MARKER).write_text("{}")
    return target


@pytest.fixture
def cached(tmp_path, monkeypatch, tiny_policy, world_index, small_world):
    """(config, files, policy): the tiny policy and the small world's index as entries of a fresh cache root."""
    root = tmp_path / "cache"
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(root))
    policy, index = _entry(root / "models", tiny_policy), _entry(root / "indexes", world_index)
    config = load_config(None, [
        f"policy.model={policy}", f"retrieval.index.dir={index}", "eval.max_questions=2", "engine.backend=hf",
        "rollout.max_turns=1", "rollout.max_action_length=8", "algorithm.grpo.kl_coef=0.0", "policy.dtype=float32",
    ])
    return config, {"world": str(small_world / "test.jsonl")}, str(policy)


def _oracle(config):
    return config.model_copy(update={"eval": config.eval.model_copy(update={"oracle_retrieval": True})})


def test_a_cached_policys_table_is_evaluated_once_then_read(cached, capsys):
    config, files, policy = cached
    calls = []

    def evaluate(c=config):
        calls.append(c.eval.oracle_retrieval)
        return json.loads(evaluate_policy(c, files, policy=policy).to_json())

    index = Path(config.retrieval.index.dir)
    first, kept = cached_table(config, files, policy, None, index, "local", evaluate)
    assert first["rows"][0]["name"] == "world" and calls == [False] and not kept
    key = evaluation_key(config, policy, index, files, "local")
    assert json.loads(evaluation_file(key).read_text()) == first
    capsys.readouterr()
    assert cached_table(config, files, policy, None, index, "local", evaluate) == (first, True)  # read
    assert calls == [False] and str(evaluation_file(key)) in capsys.readouterr().out

    def counted(c=config):  # what the key decides is whether this is called, not what it returns
        calls.append(c.eval.oracle_retrieval)
        return first

    cached_table(_oracle(config), files, policy, None, index, "local", lambda: counted(_oracle(config)))
    assert calls == [False, True]  # another config
    cached_table(config, files, policy, None, index, "graph", counted)  # on the graph's samplers
    assert calls == [False, True, False]
    adapter = Path(policy)  # any adapter: a run's output, evaluated every time
    assert not cached_table(config, files, policy, adapter, index, "local", counted)[1]
    assert not cached_table(config, files, policy, adapter, index, "local", counted)[1]
    assert calls == [False, True, False, False, False]


def test_what_the_table_depends_on_is_in_the_key(cached, tmp_path, monkeypatch):
    config, files, policy = cached
    index = Path(config.retrieval.index.dir)
    key = evaluation_key(config, policy, index, files, "local")
    assert key is not None and key == evaluation_key(config, policy, index, dict(files), "local")
    assert evaluation_key(_oracle(config), policy, index, files, "local") != key
    assert evaluation_key(config, policy, index, files, "graph") != key
    elsewhere = tmp_path / "elsewhere"  # the config's output folders are not in it
    moved = config.model_copy(update={"run": config.run.model_copy(update={"output_dir": str(elsewhere)})})
    assert evaluation_key(moved, policy, index, files, "local") == key
    questions = tmp_path / "test.jsonl"
    questions.write_text(Path(files["world"]).read_text().splitlines()[0] + "\n")
    assert evaluation_key(config, policy, index, {"world": str(questions)}, "local") != key  # the questions' bytes
    monkeypatch.setattr(eval_cache, "platform_identity", lambda: {"cpu": "another CPU model"})
    other_cpu = evaluation_key(config, policy, index, files, "local")
    monkeypatch.setattr(eval_cache, "source_digest", lambda: "another version of the code")
    assert len({key, other_cpu, evaluation_key(config, policy, index, files, "local")}) == 3


def test_a_policy_or_index_the_cache_did_not_build_is_never_cached(cached, tiny_policy, world_index):
    config, files, policy = cached
    index = Path(config.retrieval.index.dir)
    assert evaluation_key(config, str(tiny_policy), index, files, "local") is None  # outside the cache root
    assert evaluation_key(config, policy, world_index, files, "local") is None
    (Path(policy) / MARKER).unlink()  # an unfinished build
    assert evaluation_key(config, policy, index, files, "local") is None


TABLE = {"rows": [{"name": "world", "count": 2, "em": 50.0, "f1": 50.0, "cover_em": 50.0, "recall": None,
                   "multi_hop": False}],
         "m_avg": None, "avg": 50.0, "questions": {"world": {"uid": ["q0", "q1"], "em": [0.0, 1.0],
                                                              "recall": [None, None]}}}


@pytest.mark.parametrize("damage", ['{"rows": [', '{"rows": [], "m_avg": null, "avg": 50.0}', "[]"])
def test_a_damaged_kept_table_is_a_miss_computed_again_with_a_warning(cached, capsys, damage):
    """A kept table that is not JSON, lacks a field or is not an object is read through the evaluation file's
    schema: a warning naming the file, then the table is computed again and replaces it."""
    config, files, policy = cached
    index = Path(config.retrieval.index.dir)
    calls = []

    def evaluate():
        calls.append(1)
        return TABLE

    path = evaluation_file(evaluation_key(config, policy, index, files, "local"))
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    capsys.readouterr()
    assert cached_table(config, files, policy, None, index, "local", evaluate) == (TABLE, False)
    err = capsys.readouterr().err
    assert err.startswith(f"warning: a kept evaluation is damaged, computing it again: {path}"), err
    assert calls == [1] and json.loads(path.read_text()) == TABLE
    assert cached_table(config, files, policy, None, index, "local", evaluate) == (TABLE, True)  # kept again
    assert calls == [1] and capsys.readouterr().err == ""
