"""The guide: its generated pages match the code they describe, every config key is documented, and MkDocs builds
it in strict mode, where a broken link, a missing page or a missing anchor fails."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from bridge_ray.cli import build_parser
from bridge_ray.commands.docs_ref import PAGES, cli_reference, main, subcommands
from bridge_ray.config.reference import (
    REGENERATE,
    code,
    config_reference,
    is_departure,
    leaves,
    sections,
    type_name,
)
from bridge_ray.config.renamed import FORMER_DTYPES, REMOVED, RENAMED
from bridge_ray.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]


def all_keys() -> list[tuple[str, Any]]:
    return [(f"{path}.{name}", info) for path, model in sections(Config) for name, info in leaves(model)]


def test_every_config_key_has_a_description():
    assert [key for key, info in all_keys() if not info.description] == []


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page_is_current(name):
    if (ROOT / "docs" / name).read_text() != PAGES[name]():
        pytest.fail(f"docs/{name} differs from the code it describes: regenerate it with `{REGENERATE}`")


def test_check_reports_a_stale_page(tmp_path, capsys):
    assert main(["--docs", str(tmp_path)]) == 0
    assert main(["--docs", str(tmp_path), "--check"]) == 0
    (tmp_path / "cli.md").write_text("# edited by hand\n")
    assert main(["--docs", str(tmp_path), "--check"]) == 1
    assert "cli.md" in capsys.readouterr().err


def test_configuration_reference_lists_every_key_and_former_key_or_value():
    page = config_reference()
    assert [key for key, _ in all_keys() if code(key) not in page] == []
    former = [(f"{section}.{old}", new) for section, table in RENAMED.items() for old, new in table.items()]
    former += [(".".join(filter(None, (section, old))), "removed") for section, table in REMOVED.items()
               for old in table]  # section "": the top level
    former += [(old, new) for old, new in FORMER_DTYPES.items()]
    assert [old for old, new in former if f"`{old}` | " not in page or new not in page] == []


def test_departures_from_the_paper_are_listed_first():
    page = config_reference()
    listed = page.split("## Departures from the paper")[1].split("\n## ")[0]
    flagged = [key for key, info in all_keys() if is_departure(info)]
    assert "algorithm.retriever.kl_coef" in flagged
    assert [key for key in flagged if f"`{key}`" not in listed] == []
    assert "`algorithm.retriever.gamma`" not in listed


def test_type_names_read_as_yaml_values():
    assert type_name(int | None) == "int | null"
    assert type_name(Literal["hf", "vllm"]) == '"hf" | "vllm"'
    assert type_name(list[str]) == "list[str]"
    assert type_name(dict[str, Any]) == "dict[str, any]"


def parsers(parser: argparse.ArgumentParser, name: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for sub_name, sub in subcommands(parser).items():
        full = f"{name} {sub_name}".strip()
        found += [(full, sub), *parsers(sub, full)]
    return found


def test_cli_reference_lists_every_command_benchmark_and_flag():
    page = cli_reference()
    every = parsers(build_parser())
    assert {"train", "bench", "bench retrieval"} <= {name for name, _ in every}
    missing = [name for name, _ in every if f"# {name}\n" not in page]
    missing += [f"{name} {flag}" for name, sub in every for action in sub._actions for flag in action.option_strings
                if action.help != argparse.SUPPRESS and flag not in ("-h", "--help") and flag not in page]
    assert missing == []


def load_hook():
    spec = importlib.util.spec_from_file_location("repo_links", ROOT / "docs" / "hooks" / "repo_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_leaving_the_guide_are_checked_and_pointed_at_the_repository(tmp_path):
    hook = load_hook()
    docs = tmp_path / "docs"
    (docs / "raw").mkdir(parents=True)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.yaml").write_text("a: 1\n")
    page = docs / "a.md"
    text = ("[page](b.md) [config](../jobs/x.yaml) [raw](raw/) [gone](../nope.yaml) [web](https://x.org)\n"
            "```\n[example](../nope.yaml)\n```\n")
    out, missing = hook.rewrite(text, page, tmp_path / "site" / "a" / "index.html", docs, None)
    assert missing == ["../nope.yaml"]
    assert "[page](b.md)" in out and "[web](https://x.org)" in out and "[example](../nope.yaml)" in out
    assert '<a href="../../jobs/x.yaml">config</a>' in out
    assert '<a href="../../docs/raw/">raw</a>' in out
    out, _ = hook.rewrite(text, page, tmp_path / "site" / "a" / "index.html", docs, "https://github.com/o/r")
    assert "[config](https://github.com/o/r/blob/HEAD/jobs/x.yaml)" in out
    assert "[raw](https://github.com/o/r/tree/HEAD/docs/raw)" in out


def test_the_guide_builds_in_strict_mode(tmp_path):
    """Every page of the nav exists, and every link and anchor of every page resolves."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    problems = [line for line in build.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    if build.returncode != 0:
        pytest.fail("mkdocs build --strict failed:\n" + ("\n".join(problems) or build.stderr[-3000:]))
