"""Helpers of dev/gpu/graph.sh (the actor graph on a GPU machine with no model files).

``models DIR``: saves the tiny random Gemma 3 policy (the word-level tokenizer whose action tags are single tokens)
and the tiny BERT encoder of tests/gpu/cuda_helpers.py under DIR, and writes the job overrides that select them
to DIR/overrides.txt, one a line (stdout gets the libraries' chatter).
``watch FILE``: until SIGTERM, every second, notes which processes under its parent (the job, its Ray actors by
their ``ray::Class`` title) hold a CUDA device (an open /dev/nvidiaN) and, where nvidia-smi lists it, their GPU memory;
then writes the table to FILE and prints it. Ray hides the GPUs a role did not reserve, so this is where they ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def save_models(directory: Path) -> list[str]:
    sys.path[:0] = [str(REPO), str(REPO / "tests/gpu")]
    from cuda_helpers import save_tiny_bert, tiny_gemma, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tiny_gemma(len(tokenizer)).save_pretrained(directory / "policy")
    tokenizer.save_pretrained(directory / "policy")
    spec = save_tiny_bert(directory / "encoder")
    return [f"policy.model={directory / 'policy'}", f"retrieval.encoder.name={spec.model}",
            f"retrieval.encoder.pooling={spec.pooling}", f"retrieval.encoder.normalize={spec.normalize}",
            f"retrieval.encoder.max_query_length={spec.max_query_length}",
            f"retrieval.encoder.max_passage_length={spec.max_passage_length}"]


def role(cmdline: str) -> str | None:
    """``ray::Sampler.rollout`` and ``ray::shard-holder-0:IndexShard`` (a named actor) -> ``Sampler``, ``IndexShard``;
    the job itself -> ``job (driver)``; other processes -> None."""
    if cmdline.startswith("ray::"):
        return cmdline.split()[0][5:].split(".")[0].split(":")[-1]
    return "job (driver)" if "python" in cmdline.split()[0] and "bridge_ray train" in cmdline else None


def cuda_devices(pid: str) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if re.fullmatch(r"/dev/nvidia\d+", target):
            found.add(target.removeprefix("/dev/"))
    return found


def gpu_memory_mib() -> dict[str, int]:
    try:
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {pid.strip(): int(mib) for pid, mib in (r.split(",") for r in rows if r.count(",") == 1)}


def watch(out: Path) -> None:
    seen: dict[str, dict] = defaultdict(lambda: {"pids": set(), "devices": set(), "gpu_mib": 0})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop:
        memory = gpu_memory_mib()
        for proc in psutil.Process(os.getppid()).children(recursive=True):
            try:
                pid, name = str(proc.pid), role(" ".join(proc.cmdline()))
                if name is None:
                    continue
                entry = seen[name]
                entry["pids"].add(pid)
                entry["devices"] |= cuda_devices(pid)
                entry["gpu_mib"] = max(entry["gpu_mib"], memory.get(pid, 0))
            except (OSError, psutil.Error):  # the process ended meanwhile
                continue
        time.sleep(1.0)
    lines = [f"{'process':24} {'pids':>4}  {'CUDA device':12} {'peak GPU MiB (nvidia-smi)':>25}"]
    for name, e in sorted(seen.items()):
        lines.append(f"{name:24} {len(e['pids']):>4}  {','.join(sorted(e['devices'])) or 'none':12} {e['gpu_mib']:>25}")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    command, path = sys.argv[1:3]
    if command == "models":
        (Path(path) / "overrides.txt").write_text("\n".join(save_models(Path(path))) + "\n")
    else:
        watch(Path(path))
