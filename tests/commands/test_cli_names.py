"""One name for each thing on the command line, and one rule for every output path.

The warm-up is the ``warmup`` command (``sft`` still runs, with a note); the judge is ``--judge`` on ``eval`` and
``judge``; every ``--out`` is declared as a file or a folder, and refused before any work when it cannot be one.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator

import pytest

from bridge_ray.cli import OutputFlag, build_parser, main

WORK_WORDS = re.compile(r"\bissue\b|\bsession\b|\btoday\b|\b20\d\d-\d\d\b|xeon|\bzen\b|epyc|sapphire", re.I)


Parsers = Iterator[tuple[str, argparse.ArgumentParser]]


def _parsers(parser: argparse.ArgumentParser, name: str = "bridge-ray") -> Parsers:
    """Every command and bench's parser, by its full name."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _parsers(child, f"{name} {sub}")


PARSERS = dict(_parsers(build_parser()))


def test_the_warm_up_is_the_warmup_command_and_sft_still_runs_with_a_note(capsys):
    assert "bridge-ray warmup" in PARSERS and "bridge-ray sft" not in PARSERS
    assert "warm-up" in PARSERS["bridge-ray warmup"].description
    assert main(["warmup", "--examples", "0"]) == 2  # a bad value: refused by the config, before any training
    assert "warmup.examples" in capsys.readouterr().err
    assert main(["sft", "--examples", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("note: the sft command is now warmup") and "warmup.examples" in err


def test_judge_is_one_flag_on_eval_and_judge_and_backend_a_hidden_alias(capsys):
    for name in ("bridge-ray eval", "bridge-ray judge"):
        flags = {s for a in PARSERS[name]._actions for s in a.option_strings if a.help != argparse.SUPPRESS}
        assert "--judge" in flags and "--backend" not in flags
    judge = PARSERS["bridge-ray judge"]
    assert judge.parse_args(["--responses", "r", "--out", "o", "--judge", "openai"]).judge == "openai"
    assert judge.parse_args(["--responses", "r", "--out", "o", "--backend", "openai"]).judge == "openai"
    assert "note: --backend is deprecated; write --judge" in capsys.readouterr().err
    assert "--backend" not in judge.format_help()


def _outputs(parser: argparse.ArgumentParser) -> dict[str, OutputFlag]:
    return {output.flag: output for output in parser.get_default("_outputs") or []}


@pytest.mark.parametrize("name", [n for n, p in PARSERS.items() if "--out" in p._option_string_actions])
def test_every_out_says_file_or_folder(name):
    parser = PARSERS[name]
    assert "--out" in _outputs(parser), f"{name}: declare --out with add_out_argument"
    help_text = parser._option_string_actions["--out"].help
    assert help_text.startswith(("a file: ", "a folder: ")) or ("a file" in help_text and "a folder" in help_text)


def test_help_texts_hold_no_work_words():
    for name, parser in PARSERS.items():
        texts = [parser.description or "", *(a.help or "" for a in parser._actions)]
        assert not [t for t in texts if WORK_WORDS.search(t)], name


def test_every_bench_with_a_config_takes_overrides_the_same_way():
    benches = {n: p for n, p in PARSERS.items()
               if n.startswith("bridge-ray bench ") and "--config" in p._option_string_actions}
    assert "bridge-ray bench replay" in benches
    for name, parser in benches.items():
        [positional] = [a for a in parser._actions if not a.option_strings and a.dest == "overrides"]
        assert positional.metavar == "key.sub=value" and positional.help.startswith("override any config key"), name


def test_a_file_out_that_is_a_folder_or_below_a_file_is_refused_before_any_work(tmp_path, capsys):
    base = tmp_path / "missing.json"  # bench paired would fail on it, after the --out check
    argv = ["bench", "paired", "--baseline", str(base), "--treated", str(base), "--out"]
    assert main([*argv, str(tmp_path)]) == 2
    assert f"error: --out {tmp_path}: is a folder, not a file" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main([*argv, str(tmp_path / "f" / "x.json")]) == 2
    assert f"error: --out {tmp_path / 'f' / 'x.json'}: {tmp_path / 'f'} is a file" in capsys.readouterr().err


def test_a_folder_out_that_is_a_file_or_holds_files_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["make-world", "--size", "small", "--out", str(tmp_path / "f")]) == 2
    assert f"error: --out {tmp_path / 'f'}: is a file, not a folder" in capsys.readouterr().err
    assert main(["make-world", "--size", "small", "--out", str(tmp_path / "f" / "w")]) == 2
    assert "is a file, so nothing can be written below it" in capsys.readouterr().err
    assert main(["make-world", "--size", "small", "--out", str(tmp_path)]) == 2
    assert f"error: {tmp_path} already holds files that are not a world (f)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_failed_command_leaves_no_folder_or_lock_behind(tmp_path, monkeypatch, capsys):
    from bridge_ray.commands import make_world
    from bridge_ray.errors import InputError

    out = tmp_path / "new" / "world"

    def fails_after_creating(args: argparse.Namespace) -> int:
        out.mkdir(parents=True)
        (tmp_path / "new" / "world.lock").write_text("")
        raise InputError("refused half-way")

    monkeypatch.setattr(make_world, "run", fails_after_creating)
    assert main(["make-world", "--out", str(out)]) == 2
    assert "error: refused half-way" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    def exits_1_with_a_partial_result(args: argparse.Namespace) -> int:
        out.mkdir(parents=True)
        (out / "partial.jsonl").write_text("{}\n")
        return 1

    monkeypatch.setattr(make_world, "run", exits_1_with_a_partial_result)
    assert main(["make-world", "--out", str(out)]) == 1
    assert [p.name for p in out.iterdir()] == ["partial.jsonl"]  # a result the command reports stays


def test_a_resumable_folder_is_the_commands_to_judge(tmp_path, capsys):
    (tmp_path / "turns.jsonl").write_text("")
    (tmp_path / "collection.json").write_text("{}")
    argv = ["bench", "replay", "--rows", str(tmp_path), "--questions", "2", "--dev-questions", "1"]
    assert main(argv) == 2  # collected with other settings: refused by the bench, naming --rows
    assert f"--rows {tmp_path}: collected with other settings" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collection.json", "turns.jsonl"]


def _argv_with(name: str, flag: str, value: str) -> list[str]:
    """``name``'s argv with every other required flag and positional filled (the output check comes first)."""
    parser, argv = PARSERS[name], [*name.split()[1:], flag, value]
    for action in parser._actions:
        if action.required and action.option_strings and flag not in action.option_strings:
            argv += [action.option_strings[0], str(next(iter(action.choices))) if action.choices else "x"]
        elif action.required and not action.option_strings:  # a positional, e.g. bench seeds' LABEL=results.json
            argv.append("x=y")
    return argv


OUTPUTS = [(name, output) for name, parser in PARSERS.items() for output in _outputs(parser).values()
           if parser.get_default("_bench") is None or name.count(" ") == 2]


@pytest.mark.parametrize(("name", "output"), OUTPUTS, ids=[f"{n.split(' ', 1)[1]} {o.flag}" for n, o in OUTPUTS])
def test_every_output_of_the_wrong_kind_is_refused_and_nothing_is_touched(name, output, tmp_path, capsys):
    kind = output.kind_for(PARSERS[name].parse_args(_argv_with(name, output.flag, "x")[name.count(" "):]))
    wrong = tmp_path / "a-folder"
    wrong.mkdir()
    if kind == "folder":
        wrong = tmp_path / "a-file"
        wrong.write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(_argv_with(name, output.flag, str(wrong))) == 2
    err = capsys.readouterr().err
    assert f"error: {output.flag} {wrong}: is a {'file' if kind == 'folder' else 'folder'}, not a {kind}" in err
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.rglob("*")) == before
    (tmp_path / "f").write_text("mine")
    assert main(_argv_with(name, output.flag, str(tmp_path / "f" / "below"))) == 2
    assert f"{tmp_path / 'f'} is a file, so nothing can be written below it" in capsys.readouterr().err


def test_warmup_names_only_the_warm_up_and_untimed_iterations_are_untimed(capsys):
    for name, parser in PARSERS.items():
        shown = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        assert "--warmup" not in shown, f"{name}: --warmup is the warm-up's name; untimed iterations are --untimed"
    speed = PARSERS["bridge-ray bench speed"]
    assert speed.parse_args(["--warmup", "2"]).untimed == 2
    assert "note: --warmup is deprecated; write --untimed" in capsys.readouterr().err


def test_dtype_flags_speak_the_configs_spelling(capsys):
    learner = PARSERS["bridge-ray bench learner"]
    assert learner.parse_args(["--dtype", "bfloat16", "--out", "x.json"]).dtype == "bfloat16"
    assert learner.parse_args(["--dtype", "bf16", "--out", "x.json"]).dtype == "bfloat16"
    assert "note: --dtype bf16 is a former spelling; write bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize("name", [n for n, p in PARSERS.items() if _outputs(p)])
def test_overwrite_comes_from_the_output_declaration(name):
    """A command with an output that it does not resume takes --overwrite, declared once by add_out_argument (so
    refused outputs and the flag that lifts the refusal never disagree); a resumable one only where it means
    something there."""
    parser, outputs = PARSERS[name], _outputs(PARSERS[name]).values()
    takes = "--overwrite" in parser._option_string_actions
    assert takes == any(output.overwrite for output in outputs), name
    assert takes or all(output.resumable for output in outputs), name


def test_overwrite_replaces_an_earlier_result_whole(tmp_path, capsys):
    """``bench paired --out`` over an earlier result: refused, then replaced with --overwrite, atomically."""
    records = {"gap_dev": {"uid": ["q0", "q1"], "em": [0, 1], "recall": [0.5, 1.0]}}
    table = tmp_path / "eval.json"
    table.write_text(json.dumps({"rows": [], "m_avg": None, "avg": None, "questions": records}))
    out = tmp_path / "paired.json"
    out.write_text("earlier\n")
    argv = ["bench", "paired", "--baseline", str(table), "--treated", str(table), "--out", str(out)]
    assert main(argv) == 2
    assert f"error: --out {out}: the file exists" in capsys.readouterr().err and out.read_text() == "earlier\n"
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads(out.read_text())["paired"][0]["diff_em"] == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "paired.json"]
