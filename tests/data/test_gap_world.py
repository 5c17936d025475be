"""The gap world: deterministic, its mechanism (relation jargon no passage states) holds, and adding it left the
bundled world's bytes and cache keys as they were."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import pytest

from bridge_ray.cli import main
from bridge_ray.config import load_config
from bridge_ray.coordinator.inputs import configured_world, eval_files
from bridge_ray.data.gap_world import GAP_WORLD, RELATIONS, question_facts
from bridge_ray.data.world import (
    DEFAULT_WORLD,
    SMALL_SIZE,
    generate_world,
    load_split,
    world_dir,
    world_key,
    write_world,
)

SMALL = GAP_WORLD.sizes["small"]


@pytest.fixture(scope="module")
def world():
    return generate_world(0, GAP_WORLD.sizes["default"], kind=GAP_WORLD)


def _file_digest(directory) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_the_same_seed_writes_the_same_files_and_another_seed_other_ones(tmp_path):
    first = write_world(tmp_path / "a", 0, SMALL, kind=GAP_WORLD)
    again = write_world(tmp_path / "b", 0, SMALL, kind=GAP_WORLD)
    other = write_world(tmp_path / "c", 1, SMALL, kind=GAP_WORLD)
    assert _file_digest(first) == _file_digest(again) != _file_digest(other)
    assert json.loads((first / "world.json").read_text())["kind"] == "gap"
    # Cached worlds and indexes key on GAP_VERSION: a change of these bytes must bump it (and this digest).
    assert _file_digest(first) == "26773411eb3b4503c02268447c85a20333258543f8239a222190d8a10723f7d0"


def test_the_bundled_world_is_unchanged(tmp_path):
    """Bytes of the default kind's files as computed before the gap world existed, and its cache directory names
    (every cached index and question uid keys on them: a change here rebuilds every cache)."""
    assert _file_digest(write_world(tmp_path / "w", 0, SMALL_SIZE)) == (
        "a424342b7635cbb63c30c93081152f0a4a1e706e467f3784ed4e74ee12ee16df"
    )
    assert _file_digest(write_world(tmp_path / "p", 0, SMALL_SIZE, "paraphrase")) == (
        "e9e38a366f015a9f5a687a9862c8abdd4396fcb71e20c781fd97738b3c791c5d"
    )
    assert world_dir(0, SMALL_SIZE, root=tmp_path).name == "world-default-v1-seed0-718d297d1d7164df"
    assert world_key(0, DEFAULT_WORLD.sizes["default"], "default", DEFAULT_WORLD) == (
        "world-default-v1-seed0-29d2d4dce88b2408"
    )


def test_the_gap_world_has_its_own_cache_directory(tmp_path):
    gap = world_dir(0, SMALL, root=tmp_path, kind=GAP_WORLD)
    paraphrase = world_dir(0, SMALL, root=tmp_path, phrasing="paraphrase", kind=GAP_WORLD)
    assert len({gap, paraphrase, world_dir(0, SMALL, root=tmp_path)}) == 3
    assert load_split(gap, "test") == generate_world(0, SMALL, kind=GAP_WORLD).splits["test"]


def test_no_passage_states_a_jargon_word(world):
    """The only word a question has for the asked fact appears in no passage: a frozen encoder cannot match it."""
    corpus = "\n".join(row["contents"].lower() for row in world.corpus)
    assert len({r.jargon for r in RELATIONS}) == len(RELATIONS)
    assert [r.jargon for r in RELATIONS if r.jargon in corpus] == []
    questions = [q for rows in world.splits.values() for q in rows]
    for q in questions[:300]:
        assert any(re.search(rf"\b{r.jargon}\b", q["question"]) for r in RELATIONS), q["question"]


def test_the_gold_passage_shares_its_title_with_the_entitys_other_facts(world):
    """Each hop's search names the entity, whose every fact is a passage of that title (five or six): the name
    makes the gold passage reachable but not which of them it is; the gold passage states the answer."""
    titles = Counter(row["contents"].split("\n")[0] for row in world.corpus)
    assert min(titles.values()) >= 4 and Counter(titles.values()).most_common(1)[0][0] >= 5
    contents = {row["id"]: row["contents"] for row in world.corpus}
    for q in world.splits["train"]:
        meta = q["metadata"]
        assert len(meta["gold_queries"]) == len(meta["gold_doc_ids"]) == (1 if meta["type"] == "single" else 2)
        for doc, query in zip(meta["gold_doc_ids"], meta["gold_queries"], strict=True):
            title = contents[doc].split("\n")[0].strip('"')
            entity, jargon = query.rsplit(" ", 1)
            assert entity == title and jargon in q["question"]
            assert titles[f'"{title}"'] >= 4
        if meta["type"] != "comparison":  # the last hop's passage states the answer
            assert q["golden_answers"][0] in contents[meta["gold_doc_ids"][-1]]


def test_the_other_wordings_reword_the_questions_only_and_differ_from_each_other(world):
    other = {p: generate_world(0, GAP_WORLD.sizes["default"], p, GAP_WORLD) for p in ("paraphrase", "alternate")}
    for reworded in other.values():
        assert reworded.corpus == world.corpus
        for a, b in zip(world.splits["test"], reworded.splits["test"], strict=True):
            assert (a["id"], a["golden_answers"], a["metadata"]) == (b["id"], b["golden_answers"], b["metadata"])
            assert a["question"] != b["question"]
    # the alternate wording is trained on (warmup.phrasings), the paraphrase never: no question is in both
    texts = [{q["question"] for q in other[p].splits["train"]} for p in ("paraphrase", "alternate")]
    assert not texts[0] & texts[1]


def test_question_types_and_split_sizes_follow_the_size(world):
    types = {s: Counter(q["metadata"]["type"] for q in rows) for s, rows in world.splits.items()}
    assert types == {
        "train": {"single": 480, "two_hop": 420, "comparison": 300},
        "dev": {"single": 80, "two_hop": 70, "comparison": 50},
        "test": {"single": 80, "two_hop": 70, "comparison": 50},
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_held_out_questions_ask_each_fact_once_and_none_that_train_asks(seed, world):
    """A fact is a gold passage, one per (entity, relation): test and dev ask each once, share none, and train
    asks none of theirs, while train still asks every relation they ask (it teaches what the jargon means)."""
    world = world if seed == 0 else generate_world(seed, GAP_WORLD.sizes["default"], kind=GAP_WORLD)
    facts = {s: Counter(f for q in rows for f in q["metadata"]["gold_doc_ids"]) for s, rows in world.splits.items()}
    for held_out in ("dev", "test"):
        assert [f for f, n in facts[held_out].items() if n > 1] == []
        assert not facts[held_out].keys() & facts["train"].keys()
    assert not facts["dev"].keys() & facts["test"].keys()
    assert all(question_facts(q) == set(q["metadata"]["gold_doc_ids"]) for q in world.splits["test"])

    def jargon(split: str) -> set[str]:
        words = {w for q in world.splits[split] for w in re.findall(r"\w+", q["question"])}
        return {r.jargon for r in RELATIONS} & words

    assert jargon("test") | jargon("dev") <= jargon("train")


def test_make_world_and_the_config_key_select_the_gap_world(tmp_path, monkeypatch):
    out = tmp_path / "w"
    assert main(["make-world", "--world", "gap", "--out", str(out), "--size", "small", "--seed", "2"]) == 0
    assert load_split(out, "dev") == generate_world(2, SMALL, kind=GAP_WORLD).splits["dev"]
    monkeypatch.setenv("BRIDGE_RAY_CACHE", str(tmp_path / "cache"))
    world = configured_world(load_config(None, ["data.world=gap", "data.world_size=small", "data.world_seed=2"]))
    assert world.name == world_key(2, SMALL, "default", GAP_WORLD)
    assert load_split(world, "dev") == load_split(out, "dev")
    gap = load_config(None, ["data.world=gap", "data.world_size=small", "data.world_seed=2"])
    assert eval_files(gap) == {"gap": str(world / "test.jsonl")}, "tables name the world they measured"
    assert list(eval_files(load_config(None, []))) == ["world"]
