"""The command line lists every command and bench from its registry: ``--help`` imports none of their modules, so
it loads no torch, Ray, transformers, FAISS or DeepSpeed; only the chosen command's module is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridge_ray.cli import COMMANDS
from bridge_ray.commands.bench import BENCHMARKS

HEAVY = ("torch", "ray", "transformers", "faiss", "deepspeed")
# Runs the CLI on argv, then prints the heavy and the command modules it imported (--help exits through SystemExit).
PROBE = """
import sys
from bridge_ray.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
loaded = [m for m in sys.modules if m.split(".")[0] in {heavy!r} or m.startswith(("bridge_ray.commands.",
          "bridge_ray.bench."))]
print("LOADED", " ".join(sorted(loaded)))
"""


def imported(*argv: str) -> tuple[set[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                          check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOADED"))
    return set(line.split()[1:]), done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_help_lists_everything_and_imports_no_command_module(argv):
    loaded, out = imported(*argv)
    registry = COMMANDS if argv == ["--help"] else BENCHMARKS
    assert all(name in out for name in registry)
    assert loaded <= {"bridge_ray.commands.bench"}, f"--help imported {sorted(loaded)}"


def test_only_the_chosen_command_module_is_imported():
    loaded, _ = imported("config", "--help")
    assert loaded == {"bridge_ray.commands.config_cmd"}
    loaded, _ = imported("bench", "seeds", "--help")
    assert {m for m in loaded if m.startswith("bridge_ray.bench.")} == {"bridge_ray.bench.seeds"}
    assert "bridge_ray.commands.bench" in loaded and "bridge_ray.commands.train" not in loaded


def test_an_unknown_command_is_one_error_line():
    done = subprocess.run([sys.executable, "-m", "bridge_ray", "trian"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "invalid choice" in done.stderr
