"""Deleting a key: ``~a.b.c`` on the command line, ``~key: null`` in a file on top of its ``base:``; deleting
what nothing set is an error naming the key and the override or ``file:line``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_ray.cli import main
from bridge_ray.config import ConfigError, load_config

EVAL = "data:\n  eval:\n    nq: nq.jsonl\n    bamboogle: bamboogle.jsonl\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def eval_files(tmp_path):
    for name in ("nq", "bamboogle", "popqa"):
        write(tmp_path / f"{name}.jsonl", '{"question": "q", "golden_answers": ["a"]}\n')
    return tmp_path


def test_override_deletes_one_entry_of_a_map(eval_files):
    base = write(eval_files / "base.yaml", EVAL)
    assert list(load_config(base).data.eval) == ["nq", "bamboogle"]
    assert list(load_config(base, ["~data.eval.bamboogle"]).data.eval) == ["nq"]
    assert load_config(base, ["~data.eval"]).data.eval == {}, "a whole section goes back to its default"
    again = load_config(base, ["~data.eval.bamboogle", f"data.eval.bamboogle={eval_files / 'popqa.jsonl'}"])
    assert again.data.eval["bamboogle"].endswith("popqa.jsonl"), "a later override sets it again"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("~data.eval.musique", r"override '~data\.eval\.musique': data\.eval\.musique is not set, so there is nothing"),
        ("~run.rounds", r"override '~run\.rounds': run\.rounds is not set"),  # a default, not set by the file
        ("~data.eval.nq=x", r"override '~data\.eval\.nq=x': ~key\.sub deletes a key and takes no value"),
        ("~data.eval.nq.x", r"override '~data\.eval\.nq\.x': data\.eval\.nq is not a section"),
        ("~", r"expected key\.sub=value, or ~key\.sub to delete a key"),
    ],
)
def test_override_deleting_what_is_not_set_names_it(eval_files, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(eval_files / "base.yaml", EVAL), [override])


def test_override_cannot_delete_a_list_item(eval_files):
    config = write(eval_files / "c.yaml", "stages:\n  - {name: a, train: policy, rounds: 1}\n")
    with pytest.raises(ConfigError, match=r"'~stages\.0': stages is a list: restate it without the item"):
        load_config(config, ["~stages.0"])


def test_an_error_after_a_deletion_names_the_override(tmp_path):
    config = write(tmp_path / "c.yaml", "rollout:\n  questions_per_batch: 32\noptim:\n  mini_batch_size: 32\n")
    with pytest.raises(ConfigError, match=r"must divide rollout\.questions_per_batch \(32\) \[.*override "
                       r"'~optim\.mini_batch_size'"):  # the default (64) is back, and the deletion is to blame
        load_config(config, ["~optim.mini_batch_size"])


def test_child_file_deletes_a_key_of_its_base(eval_files):
    write(eval_files / "base.yaml", EVAL + "run:\n  rounds: 3\n")
    child = write(eval_files / "presets" / "c.yaml",
                  "base: ../base.yaml\ndata:\n  eval:\n    ~bamboogle: null\nrun:\n  ~rounds:\n")
    config = load_config(child)
    assert list(config.data.eval) == ["nq"] and config.run.rounds == load_config().run.rounds


def test_child_file_replaces_a_section_whole_with_delete_then_set(eval_files):
    write(eval_files / "base.yaml", EVAL)
    child = write(eval_files / "presets" / "c.yaml",
                  "base: ../base.yaml\ndata:\n  ~eval: null\n  eval:\n    popqa: ../popqa.jsonl\n")
    assert list(load_config(child).data.eval) == ["popqa"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base: ../base.yaml\ndata:\n  eval:\n    ~musique: null\n",
         r"c\.yaml:4: ~musique cannot delete data\.eval\.musique: no base file sets it"),
        ("base: ../base.yaml\nrun:\n  ~rounds: null\n", r"c\.yaml:3: ~rounds cannot delete run\.rounds"),
        ("base: ../base.yaml\ndata:\n  ~eval: {nq: x}\n",
         r"c\.yaml:3: ~eval deletes data\.eval and takes no value \(write ~eval: null\)"),
        ("data:\n  eval:\n    ~nq: null\n", r"c\.yaml:3: ~nq cannot delete data\.eval\.nq: no base file sets it"),
    ],
    ids=["not in the base", "a section the base lacks", "a value", "no base"],
)
def test_child_file_deleting_what_its_base_lacks_names_file_and_line(eval_files, text, message):
    write(eval_files / "base.yaml", EVAL)
    with pytest.raises(ConfigError, match=message):
        load_config(write(eval_files / "presets" / "c.yaml", text))


def test_config_command_takes_a_deletion(eval_files, capsys):
    base = write(eval_files / "base.yaml", EVAL)
    assert main(["config", "--config", str(base), "~data.eval.bamboogle"]) == 0
    out = capsys.readouterr().out
    assert "nq.jsonl" in out and "bamboogle" not in out
