"""The one-node recipes (``jobs/configs/recipes/``) and the training command each cluster file ships, checked by
``train --dry-run`` against a simulated head of the node shape each recipe states: a local Ray that declares that
node's GPUs and CPUs. The preset's data and index are replaced by small stand-ins of the same shape (a training
file of one full batch, an 8-shard index like wiki-18's), and all eval sets but one are deleted with
``~data.eval.<name>``, so the table printed is what the real run asks."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import ray
import yaml

from bridge_ray.cli import build_parser, main
from bridge_ray.config import load_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "jobs/configs/recipes"
# recipe -> (the node its comment states as the least it needs: CPUs, GPUs; the table --dry-run must print)
NODES = {
    "qwen2.5-3b-bridge-1node-4gpu.yaml": (22, 4, {
        "policy_learner": ["2", "CPU 4, GPU 1", "CPU 8, GPU 2"],
        "sampler": ["1", "CPU 4, GPU 1", "CPU 4, GPU 1"],
        "retriever_learner": ["1", "CPU 2, GPU 0.5", "CPU 2, GPU 0.5"],
        "shard_holder": ["8", "CPU 1", "CPU 8"],
        "graph": ["CPU 22, GPU 3.5"],
    }),
    "qwen2.5-3b-bridge-1node-8gpu.yaml": (38, 8, {
        "policy_learner": ["4", "CPU 4, GPU 1", "CPU 16, GPU 4"],
        "sampler": ["3", "CPU 4, GPU 1", "CPU 12, GPU 3"],
        "retriever_learner": ["1", "CPU 2, GPU 0.5", "CPU 2, GPU 0.5"],
        "shard_holder": ["8", "CPU 1", "CPU 8"],
        "graph": ["CPU 38, GPU 7.5"],
    }),
}


def test_every_recipe_is_checked_here():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(NODES)
    for name in NODES:
        assert load_config(RECIPES / name).rollout == load_config(REPO / "jobs/configs/qwen2.5-3b-bridge.yaml").rollout


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory, small_world) -> dict[str, Path]:
    """A training file of exactly one batch of the preset's, an eval file, and the small world's corpus indexed
    into as many shards as the preset's wiki-18 index (one shard holder each) with the default encoder."""
    root = tmp_path_factory.mktemp("recipe-data")
    preset = load_config(RECIPES / next(iter(NODES)))
    records = [{"id": str(i), "question": f"stand-in question {i}?", "golden_answers": [f"answer {i}"]}
               for i in range(preset.rollout.questions_per_batch)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:8]))
    index = root / "index"
    assert main(["build-index", "--corpus", str(small_world / "corpus.jsonl"), "--out", str(index),
                 "--shards", str(preset.retrieval.index.num_shards), "--no-progress"]) == 0
    return {"train": root / "train.jsonl", "nq": root / "nq.jsonl", "index": index}


@pytest.fixture(scope="module", params=sorted(NODES))
def head(request):
    """A private local Ray declaring the recipe's node: its CPUs and GPUs (none of them real)."""
    cpus, gpus, _ = NODES[request.param]
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        ray.init(address="local", num_cpus=cpus, num_gpus=gpus, include_dashboard=False,
                 object_store_memory=100_000_000, log_to_driver=False)
        yield request.param
        ray.shutdown()


def on_stand_ins(config: Path, stand_ins: dict[str, Path], out: Path) -> list[str]:
    """Overrides that point ``config`` at the stand-ins: every eval set but nq deleted, MiniLM for the encoder the
    stand-in index was built with, outputs in ``out``."""
    dropped = [f"~data.eval.{name}" for name in load_config(config).data.eval if name != "nq"]
    return [f"run.output_dir={out}", f"data.train=[{stand_ins['train']}]", *dropped, f"data.eval.nq={stand_ins['nq']}",
            f"retrieval.index.dir={stand_ins['index']}", "retrieval.encoder.name=all-MiniLM-L6-v2"]


def dry_run(recipe: str, stand_ins: dict[str, Path], out: Path, *overrides: str) -> list[str]:
    """``train --dry-run`` of ``recipe`` on the stand-ins, W&B offline (no key here)."""
    return ["train", "--dry-run", "--config", str(RECIPES / recipe), *on_stand_ins(RECIPES / recipe, stand_ins, out),
            "telemetry.wandb_mode=offline", *overrides]


def test_recipe_fits_its_node(head, stand_ins, tmp_path, capsys):
    assert main(dry_run(head, stand_ins, tmp_path / "run")) == 0
    out = capsys.readouterr().out
    table = {cells[0]: cells[1:] for line in out.splitlines() if len(cells := re.split(r"\s{2,}", line.strip())) > 1}
    cpus, gpus, expected = NODES[head]
    assert {role: table.get(role) for role in expected} == expected, out
    assert table["cluster"][0] == f"CPU {cpus}, GPU {gpus} (free: CPU {cpus}, GPU {gpus})", out
    assert "the cluster can hold the graph" in out
    assert "data: train" in out and "eval nq " in out and "bamboogle" not in out, out


def test_one_sampler_more_does_not_fit(head, stand_ins, tmp_path, capsys):
    """The node is the least the recipe needs: one more sampler GPU is beyond it, named as an error (exit 2)."""
    samplers = NODES[head][2]["sampler"][0]
    assert main(dry_run(head, stand_ins, tmp_path / "run", f"roles.sampler.count={int(samplers) + 1}")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the cluster cannot hold the whole graph at once") and "Traceback" not in err, err


# ---- the cluster files' commands ---------------------------------------------------------------------------

CLUSTER_FILES = ["clusters/aws.yaml", "clusters/gcp.yaml", "clusters/kuberay/raycluster.yaml",
                 "clusters/kuberay/rayjob.yaml"]
# Keys the stand-ins replace: on a cluster they name the shared volume, which this machine has not.
ON_SHARED = ("run.output_dir=", "retrieval.index.dir=", "data.train=", "data.eval=")


def shipped_command(path: str) -> list[str] | None:
    """The ``train`` arguments of the command ``path`` ships: the RayJob's entrypoint, else the ``jobs/submit.sh``
    line of its header comment (continued over trailing backslashes, up to its ``...``); None if it has none."""
    text = (REPO / path).read_text()
    if path.endswith("rayjob.yaml"):
        words = shlex.split(yaml.safe_load(text)["spec"]["entrypoint"])
        assert words[:4] == ["python", "-m", "bridge_ray", "train"]
        return words[4:]
    match = re.search(r"^#.*?jobs/submit\.sh (jobs/configs/.*?)\.\.\.", "\n".join(
        line for line in text.splitlines() if line.startswith("#")).replace("\\\n#", " "), re.M | re.S)
    if match is None:
        return None
    config, *rest = shlex.split(match.group(1))
    return ["--config", config, *rest]


def test_every_cluster_file_ships_a_command_or_points_to_one():
    """gcp.yaml runs aws.yaml's workflow; each other file's command is one the tests below dry-run."""
    commands = {path: shipped_command(path) for path in CLUSTER_FILES}
    assert [path for path, words in commands.items() if words is None] == ["clusters/gcp.yaml"]
    assert "Same workflow as clusters/aws.yaml" in (REPO / "clusters/gcp.yaml").read_text()
    assert all(words[1] == "jobs/configs/qwen2.5-3b-bridge.yaml" for words in commands.values() if words)


@pytest.mark.parametrize("path", [p for p in CLUSTER_FILES if p != "clusters/gcp.yaml"])
def test_cluster_file_command_passes_the_dry_run_without_a_wandb_key(head, stand_ins, tmp_path, capsys, monkeypatch,
                                                                     path):
    """Its own config and flags, the shared volume's files replaced by the stand-ins, no W&B key anywhere: every
    input check passes. It fits the 8-GPU node; on the 4-GPU one, only the resources are short, or (where the
    command sets run.autoscale_timeout_s) are left to the autoscaler."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a W&B key
    args = build_parser().parse_args(["train", *shipped_command(path)])
    kept = [o for o in args.overrides if not o.startswith(ON_SHARED)]
    flags = ["--auto-resume"] * args.auto_resume + ["--resume"] * args.resume
    code = main(["train", "--dry-run", *flags, "--config", str(REPO / args.config),
                 *on_stand_ins(REPO / args.config, stand_ins, tmp_path / "run"), *kept])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "wandb" not in err, err
    gpus = NODES[head][1]
    if gpus >= 8 or any(o.startswith("run.autoscale_timeout_s=") for o in kept):
        assert code == 0, err
        assert "the cluster can hold the graph" in out or "ask the autoscaler" in out, out
    else:
        assert code == 2 and err.startswith("error: the cluster cannot hold"), err
