"""The bad-input sweep: real bad input to the real commands and the real HTTP server, one row per case.

Every command case runs ``bridge_ray.cli.main`` in-process and asserts the exit code, that stderr names the
culprit (file:line, key, flag, field or folder) with no traceback, and that the folders the command was
pointed at are exactly as they were before (nothing half-written, nothing deleted). No case starts Ray or
loads a policy: every check runs before that.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from serving import served

from bridge_ray.cli import main
from bridge_ray.data.world import SMALL_SIZE, write_world
from bridge_ray.errors import InputError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = str(REPO / "jobs/configs/local_cpu.yaml")


@dataclass(frozen=True)
class Assets:
    """Good inputs the cases spoil copies of."""

    world: Path
    index: Path
    checkpoint_run: Path  # a run folder holding a (fake-policy) checkpoint layout


def write_lines(path: Path, lines: list[str] | bytes) -> Path:
    path.write_bytes(lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode())
    return path


def question(i: int, **extra) -> str:
    return json.dumps({"id": str(i), "question": f"q{i}?", "golden_answers": [f"a{i}"], **extra})


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Assets:
    root = tmp_path_factory.mktemp("assets")
    world = write_world(root / "world", seed=0, size=SMALL_SIZE)
    rows = [json.dumps({"id": f"d{i}", "contents": f'"Doc {i}"\nbody {i}'}) for i in range(12)]
    corpus = write_lines(root / "corpus.jsonl", rows)
    index = root / "index"
    assert main(["build-index", "--corpus", str(corpus), "--out", str(index), "--shards", "2", "--no-progress"]) == 0
    run = root / "run"
    checkpoint = run / "checkpoints" / "round-000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "manifest.json").write_text(json.dumps({"round": 2}))
    (run / "checkpoints" / "latest").write_text("round-000002\n")
    return Assets(world, index, run)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its sha256 (empty when the folder does not exist)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass(frozen=True)
class Case:
    """``setup(ws, assets)`` spoils inputs under the workspace ``ws`` and returns the argv; ``culprit`` is a
    substring of the message (``{ws}`` is replaced by the workspace path)."""

    name: str
    setup: Callable[[Path, Assets], list[str]]
    culprit: str
    rc: int = 2


def config_file(ws: Path, text: str | bytes) -> str:
    path = ws / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def train(ws: Path, *args: str) -> list[str]:
    """``train`` on the embedded default into ``ws/run``; ``args``: flags (``--...``), then overrides."""
    flags = [a for a in args if a.startswith("--")]
    return ["train", *flags, "--config", LOCAL_CPU, f"run.output_dir={ws / 'run'}",
            *(a for a in args if not a.startswith("--"))]


def bad_questions(ws: Path, lines: list[str] | bytes) -> str:
    return str(write_lines(ws / "qa.jsonl", lines))


def damaged_index(ws: Path, assets: Assets, spoil: Callable[[Path], None]) -> list[str]:
    index = ws / "index"
    shutil.copytree(assets.index, index)
    spoil(index)
    return ["serve-retriever", "--index", str(index), "--port", "0"]


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


CONFIG_CASES = [
    Case("unknown key in a file", lambda ws, a: ["config", "--config", config_file(ws, "optim:\n  lrr: 0.1\n")],
         "optim.lrr: unknown key (did you mean 'lr'?) [{ws}/job.yaml:2]"),
    Case("unknown section on the command line", lambda ws, a: ["config", "optimm.lr=0.1"], "optimm"),
    Case("wrong type in an override", lambda ws, a: ["config", "optim.lr=fast"], "optim.lr"),
    Case("infinite learning rate", lambda ws, a: ["config", "optim.lr=.inf"], "finite"),
    Case("nan coefficient in a file",
         lambda ws, a: ["config", "--config", config_file(ws, "algorithm:\n  grpo:\n    kl_coef: .nan\n")],
         "job.yaml:3"),
    Case("a section written twice",
         lambda ws, a: ["config", "--config", config_file(ws, "run:\n  seed: 1\noptim:\n  lr: 1\nrun:\n  rounds: 2\n")],
         "duplicate key 'run' (first on line 1)"),
    Case("invalid YAML", lambda ws, a: ["config", "--config", config_file(ws, "run:\n  seed: [1,\n")], "job.yaml:"),
    Case("config file that is not UTF-8",
         lambda ws, a: ["config", "--config", config_file(ws, b"run:\n  output_dir: caf\xe9\n")],
         "job.yaml:2: not UTF-8"),
    Case("missing config file", lambda ws, a: ["config", "--config", str(ws / "nope.yaml")], "nope.yaml"),
    Case("cross-field error blames the override",
         lambda ws, a: ["config", "--config", LOCAL_CPU, "optim.mini_batch_size=3"],
         "override 'optim.mini_batch_size=3'"),
    Case("override without '='", lambda ws, a: ["config", "optim.lr"], "optim.lr"),
    Case("prompt template that does not exist",
         lambda ws, a: ["config", f"policy.prompt_template={ws / 'none.txt'}"], "policy.prompt_template"),
]

def train_on(ws: Path, lines: list[str] | bytes) -> list[str]:
    return train(ws, "--dry-run", f"data.train=[{bad_questions(ws, lines)}]")


def build_index(ws: Path, corpus: Path, *args: str) -> list[str]:
    return ["build-index", "--corpus", str(corpus), "--out", str(ws / "out"), "--no-progress", *args]


def corpus_of(ws: Path, lines: list[str]) -> Path:
    return write_lines(ws / "c.jsonl", lines)


def copied(source: Path, target: Path, argv: list[str]) -> list[str]:
    shutil.copytree(source, target)
    return argv


DATA_CASES = [
    Case("question file with a broken JSON line", lambda ws, a: train_on(ws, [question(0), "{oops"]), "qa.jsonl:2"),
    Case("question file that is not UTF-8", lambda ws, a: train_on(ws, b'{"id": "1", "question": "caf\xe9"}\n'),
         "qa.jsonl:1: not UTF-8"),
    Case("question without golden answers", lambda ws, a: train_on(ws, [json.dumps({"id": "1", "question": "q?"})]),
         "qa.jsonl:1"),
    Case("missing question file", lambda ws, a: train(ws, "--dry-run", f"data.train=[{ws / 'gone.jsonl'}]"),
         "data.train[0]"),
    Case("eval set that does not exist", lambda ws, a: train(ws, "--dry-run", f"data.eval.dev={ws / 'gone.jsonl'}"),
         "data.eval.dev"),
    Case("eval --data without a name", lambda ws, a: ["eval", "--data", str(ws / "x.jsonl")], "--data"),
]

CORPUS_CASES = [
    Case("corpus line that is not JSON",
         lambda ws, a: build_index(ws, corpus_of(ws, [json.dumps({"id": "d0", "contents": "x"}), "{bad"])),
         "c.jsonl:2"),
    Case("corpus line without contents", lambda ws, a: build_index(ws, corpus_of(ws, [json.dumps({"id": "d0"})])),
         "c.jsonl:1"),
    Case("missing corpus", lambda ws, a: build_index(ws, ws / "none.jsonl"), "none.jsonl"),
    Case("build-index --chunk 0", lambda ws, a: build_index(ws, a.world / "corpus.jsonl", "--chunk", "0"), "--chunk"),
    Case("build-index over another index",
         lambda ws, a: copied(a.index, ws / "out", build_index(ws, a.world / "corpus.jsonl")),
         "{ws}/out already holds"),
    Case("make-world over a world",
         lambda ws, a: copied(a.world, ws / "w", ["make-world", "--out", str(ws / "w"), "--size", "small"]),
         "w already holds a world"),
]

INDEX_CASES = [
    Case("truncated passages.jsonl",
         lambda ws, a: damaged_index(ws, a, lambda i: truncate(next(i.rglob("passages.jsonl")))), "passages.jsonl"),
    Case("truncated embeddings.npy",
         lambda ws, a: damaged_index(ws, a, lambda i: truncate(next(i.rglob("embeddings.npy")))), "embeddings.npy"),
    Case("corrupt manifest.json",
         lambda ws, a: damaged_index(ws, a, lambda i: (i / "manifest.json").write_text('{"dim": 3,,}')),
         "manifest.json:1:"),
    Case("missing index", lambda ws, a: ["serve-retriever", "--index", str(ws / "nowhere"), "--port", "0"], "nowhere"),
]

RUN_CASES = [
    Case("train --resume with no checkpoint", lambda ws, a: train(ws, "--resume"), "--resume"),
    Case("train into another run's folder", lambda ws, a: copied(a.checkpoint_run, ws / "run", train(ws)), "{ws}/run"),
    Case("eval --max-questions 0",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, "--max-questions", "0"], "--max-questions"),
    Case("eval of a checkpoint without policy/",
         lambda ws, a: copied(a.checkpoint_run, ws / "run", ["eval", "--checkpoint", str(ws / "run/checkpoints")]),
         "policy"),
    Case("eval of a folder that holds no checkpoint", lambda ws, a: ["eval", "--checkpoint", str(ws)], "--checkpoint"),
]

def flashrag_root(ws: Path) -> Path:
    """A FlashRAG dataset root holding only NQ's train split (the other sets are missing)."""
    (ws / "flashrag/nq").mkdir(parents=True)
    write_lines(ws / "flashrag/nq/train.jsonl", [question(0)])
    return ws / "flashrag"


EXPORT_CASES = [
    Case("export of a folder that holds no checkpoint", lambda ws, a: ["export", "--checkpoint", str(ws), "--out",
                                                                        str(ws / "x")], "--checkpoint"),
    Case("export --what of an unknown part",
         lambda ws, a: ["export", "--checkpoint", str(ws), "--out", str(ws / "x"), "--what", "optimizer"], "--what"),
    Case("prepare-data with no input", lambda ws, a: ["prepare-data", "--out", str(ws / "data")], "--flashrag-root"),
    Case("prepare-data with missing sets",
         lambda ws, a: ["prepare-data", "--out", str(ws / "data"), "--flashrag-root", str(flashrag_root(ws))],
         "hotpotqa"),
]

# --- checks before Ray (issue 29): what used to pass --dry-run and fail inside an actor, or as a traceback ------


def index_of(ws: Path, assets: Assets, encoder: str = "intfloat/e5-base-v2") -> Path:
    """A copy of the assets' index whose manifest says it was built with ``encoder``."""
    index = ws / "index"
    shutil.copytree(assets.index, index)
    manifest = json.loads((index / "manifest.json").read_text())
    manifest["encoder"]["model"] = encoder
    (index / "manifest.json").write_text(json.dumps(manifest))
    return index


def adapter(ws: Path, width: int = 384, base: str = "all-MiniLM-L6-v2", spoil: str | None = None) -> Path:
    """A peft LoRA adapter directory of rank 4 on ``width``-wide query/value layers, written without any model;
    ``spoil``: "config" (invalid JSON) or "tensors" (a truncated safetensors file)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = ws / "adapter"
    folder.mkdir()
    config = {"peft_type": "LORA", "base_model_name_or_path": base, "r": 4, "lora_alpha": 4,
              "target_modules": ["query", "value"]}
    (folder / "adapter_config.json").write_text("{oops" if spoil == "config" else json.dumps(config))
    layer = "base_model.model.encoder.layer.0.attention.self"
    save_file({f"{layer}.{m}.{ab}.weight": np.zeros((4, width) if ab == "lora_A" else (width, 4), np.float32)
               for m in ("query", "value") for ab in ("lora_A", "lora_B")}, str(folder / "adapter_model.safetensors"))
    if spoil == "tensors":
        truncate(folder / "adapter_model.safetensors", 0.8)
    return folder


def checkpoint_of(ws: Path, parts: dict[str, Callable[[Path], None]] | None = None, **trained) -> Path:
    """A checkpoint in ``ws/run`` of a run with the overrides ``trained``, whose ``parts`` (name -> writer) are
    written into it and listed whole by its manifest."""
    from bridge_ray.config import dump_config, load_config

    root = ws / "run/checkpoints"
    checkpoint = root / "round-000002"
    checkpoint.mkdir(parents=True)
    config = load_config(LOCAL_CPU, [f"{key}={value}" for key, value in trained.items()])
    (checkpoint / "config.yaml").write_text(dump_config(config))
    for name, write in (parts or {}).items():
        write(checkpoint / name)
    files = {str(p.relative_to(checkpoint)): p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()}
    manifest = {"round": 2, "policy_version": 2, "retriever_version": 2, "files": files}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    (root / "latest").write_text("round-000002\n")
    return checkpoint


def resumable(ws: Path, **trained) -> list[str]:
    """``train --resume`` into a run whose checkpoint was trained with the overrides ``trained``."""
    checkpoint_of(ws, **trained)
    return train(ws, "--resume", "--dry-run", "warmup.enabled=false")


def policy_config(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))


def evaluated(ws: Path, width: int) -> list[str]:
    """``eval`` of a checkpoint holding a policy and a retriever adapter on ``width``-wide layers."""
    parts = {"policy": policy_config, "retriever_adapter": lambda p: shutil.move(adapter(ws, width=width), p)}
    return ["eval", "--checkpoint", str(checkpoint_of(ws, parts))]


def below_a_file(ws: Path) -> str:
    (ws / "a-file").write_text("x\n")
    return str(ws / "a-file" / "out")


def based(ws: Path, text: str) -> str:
    """``ws/job.yaml``: ``text`` over a base file beside it that sets only ``run.rounds``."""
    (ws / "base.yaml").write_text("run:\n  rounds: 3\n")
    return config_file(ws, "base: base.yaml\n" + text)


def damaged_manifest(ws: Path, argv: list[str]) -> list[str]:
    """``argv`` against a checkpoint in ``ws/run`` whose manifest.json is not JSON."""
    (checkpoint_of(ws) / "manifest.json").write_text("{bad")
    return argv


RECIPE_4GPU = str(REPO / "jobs/configs/recipes/qwen2.5-3b-bridge-1node-4gpu.yaml")
UNKNOWN_ENCODER = ["retrieval.encoder.pooling=mean", "retrieval.encoder.normalize=true"]
BELOW_A_FILE = "a-file is a file, so nothing can be written below it"

PREFLIGHT_CASES = [
    Case("empty train question file", lambda ws, a: train_on(ws, b""),
         "data.train[0]: {ws}/qa.jsonl holds no questions"),
    Case("empty eval question file",
         lambda ws, a: train(ws, "--dry-run", f"data.eval.dev={bad_questions(ws, b'')}"), "data.eval.dev"),
    Case("fewer train questions than one batch",
         lambda ws, a: [*train_on(ws, [question(0), question(1)]), "rollout.questions_per_batch=3"],
         "data.train: 2 training questions, fewer than one batch (rollout.questions_per_batch=3)"),
    Case("fewer train questions than one oversampled batch",
         lambda ws, a: [*train_on(ws, [question(i) for i in range(3)]), "rollout.dynamic_sampling=true",
                        "rollout.oversample=2"], "= 4 questions a round"),
    Case("eval of an empty question file", lambda ws, a: ["eval", "--config", LOCAL_CPU, "--data",
                                                          f"dev={bad_questions(ws, b'')}"], "data.eval.dev"),
    Case("train on an index of another encoder",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.index.dir={index_of(ws, a)}"),
         "was built with another encoder than retrieval.encoder (model: index has 'intfloat/e5-base-v2'"),
    Case("train on a prebuilt index that retrieval.index's build keys describe otherwise",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.index.dir={a.index}", "retrieval.index.index_type=hnsw"),
         "was built otherwise than retrieval.index says (retrieval.index.index_type 'hnsw', the index 'flat')"),
    Case("eval on an index of another encoder",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, f"retrieval.index.dir={index_of(ws, a)}"],
         "--encoder all-MiniLM-L6-v2 --overwrite"),
    Case("serve-retriever with an encoder it cannot load",
         lambda ws, a: ["serve-retriever", "--index", str(a.index), f"retrieval.encoder.name={ws / 'no-encoder'}",
                        *UNKNOWN_ENCODER], "retrieval.encoder.name: {ws}/no-encoder does not exist"),
    Case("train with an adapter of another encoder's width",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.adapter={adapter(ws, width=768)}"),
         "retrieval.encoder.adapter {ws}/adapter: its LoRA factors act on widths [768]"),
    Case("train from an adapter whose shape retrieval.lora does not say",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.adapter={adapter(ws)}", "retrieval.lora.alpha=4"),
         "retrieval.lora.rank: config 16, adapter 4: set retrieval.lora to the adapter's values"),
    Case("serve-retriever with an adapter of another base model",
         lambda ws, a: ["serve-retriever", "--index", str(a.index), "--adapter",
                        str(adapter(ws, base="intfloat/e5-base-v2"))], "an adapter of intfloat/e5-base-v2"),
    Case("serve-retriever with a damaged adapter config",
         lambda ws, a: ["serve-retriever", "--index", str(a.index), "--adapter", str(adapter(ws, spoil="config"))],
         "adapter_config.json: invalid JSON"),
    Case("train with a truncated adapter",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.adapter={adapter(ws, spoil='tensors')}"),
         "adapter_model.safetensors: not a whole safetensors file"),
    Case("train --resume into a run of another policy",
         lambda ws, a: resumable(ws, **{"policy.model": "Qwen/Qwen2.5-0.5B-Instruct", "warmup.enabled": "false"}),
         "was trained from policy.model=Qwen/Qwen2.5-0.5B-Instruct"),
    Case("train --resume into a run of another encoder",
         lambda ws, a: resumable(ws, **{"retrieval.encoder.name": "intfloat/e5-base-v2"}),
         "was trained with another retriever encoder (model: checkpoint 'intfloat/e5-base-v2'"),
    Case("eval of a checkpoint whose adapter is another encoder's",
         lambda ws, a: evaluated(ws, width=768), "retriever_adapter: its LoRA factors act on widths [768]"),
    Case("online W&B without a key", lambda ws, a: train(ws, "--dry-run", "telemetry.wandb_mode=online"),
         "telemetry.wandb_mode: online, but no W&B key"),
    Case("eval of a policy that is neither a folder nor cached, offline",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, "policy.model=nobody/no-such-model-xyz"],
         "policy.model: nobody/no-such-model-xyz is not in the Hugging Face cache"),
    Case("export --out below a file",
         lambda ws, a: ["export", "--checkpoint", str(ws), "--out", below_a_file(ws)], BELOW_A_FILE),
    Case("make-world --out below a file", lambda ws, a: ["make-world", "--out", below_a_file(ws)], BELOW_A_FILE),
    Case("build-index --out below a file",
         lambda ws, a: ["build-index", "--corpus", str(a.world / "corpus.jsonl"), "--out", below_a_file(ws)],
         BELOW_A_FILE),
    Case("eval --out below a file", lambda ws, a: ["eval", "--config", LOCAL_CPU, "--out", below_a_file(ws)],
         BELOW_A_FILE),
    Case("prepare-data --out below a file",
         lambda ws, a: ["prepare-data", "--out", below_a_file(ws), "--flashrag-root", str(flashrag_root(ws))],
         BELOW_A_FILE),
    Case("train with run.output_dir below a file", lambda ws, a: [*train(ws, "--dry-run"),
                                                                  f"run.output_dir={below_a_file(ws)}"],
         "run.output_dir {ws}/a-file/out: {ws}/a-file is a file"),
    Case("build-index of more shards than passages",
         lambda ws, a: build_index(ws, corpus_of(ws, [json.dumps({"id": f"d{i}", "contents": f"p{i}"})
                                                      for i in range(10)]), "--shards", "20"),
         "20 shards for 10 passages"),
    Case("deleting a key that nothing sets", lambda ws, a: ["config", "--config", LOCAL_CPU, "~data.eval.nope"],
         "override '~data.eval.nope': data.eval.nope is not set"),
    Case("deleting under base: a key no base file sets",
         lambda ws, a: ["config", "--config", based(ws, "data:\n  eval:\n    ~nope: null\n")],
         "{ws}/job.yaml:4: ~nope cannot delete data.eval.nope"),
    Case("wrong type in an override of a recipe", lambda ws, a: ["config", "--config", RECIPE_4GPU,
                                                                 "roles.sampler.count=two"],
         "roles.sampler.count: Input should be a valid integer [override 'roles.sampler.count=two']"),
    Case("serve-retriever with an adapter folder that does not exist",
         lambda ws, a: ["serve-retriever", "--index", str(a.index), "--adapter", str(ws / "none")],
         "--adapter {ws}/none: not a peft adapter directory"),
    Case("train with an adapter that is a file",
         lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.adapter={write_lines(ws / 'lora', ['x'])}"),
         "retrieval.encoder.adapter: '{ws}/lora' is not a peft adapter directory"),
    Case("eval of a checkpoint whose adapter is truncated",
         lambda ws, a: ["eval", "--checkpoint", str(checkpoint_of(ws, {
             "policy": policy_config,
             "retriever_adapter": lambda p: shutil.move(adapter(ws, spoil="tensors"), p)}))],
         "retriever_adapter/adapter_model.safetensors: not a whole safetensors file"),
    Case("train --resume from a damaged manifest",
         lambda ws, a: damaged_manifest(ws, train(ws, "--resume", "--dry-run", "warmup.enabled=false")),
         "round-000002/manifest.json: unreadable manifest"),
]

# --- benches: every flag, file and --out checked before a model converts, a warm-up trains or Ray starts -------


def bench(name: str, ws: Path, *args: str) -> list[str]:
    """``bench name`` with ``args``, writing (if it got that far) to ``ws/out.json``, or ``ws/out`` for the benches
    whose output is a folder."""
    folder = name in ("learn",)
    return ["bench", name, "--out", str(ws / ("out" if folder else "out.json")), *args]


def eval_file(ws: Path, name: str, record: dict | None = None, text: str | None = None) -> str:
    """An evaluation file ``ws/name`` holding one data set ``gap_dev`` with ``record`` (or the raw ``text``)."""
    record = record if record is not None else {"uid": ["q0", "q1"], "em": [0, 1], "recall": [0.5, 1.0]}
    body = text if text is not None else json.dumps({"rows": [], "m_avg": None, "avg": None,
                                                     "questions": {"gap_dev": record}})
    (ws / name).write_text(body)
    return str(ws / name)


def paired(ws: Path, baseline: str, *extra: str) -> list[str]:
    """``bench paired`` of ``baseline`` against a good evaluation file."""
    return ["bench", "paired", "--baseline", baseline, "--treated", eval_file(ws, "good.json"), *extra]


def replay(ws: Path, *args: str) -> list[str]:
    return ["bench", "replay", "--rows", str(ws / "rows"), *args]


EMPTY_ANSWER = [json.dumps({"id": "1", "question": "q?", "golden_answers": ["a", " "]})]

BENCH_CASES = [
    Case("bench learn --rounds 0", lambda ws, a: bench("learn", ws, "--rounds", "0"),
         "argument --rounds: must be at least 1, not 0"),
    Case("bench learn --eval-every 0", lambda ws, a: bench("learn", ws, "--eval-every", "0"),
         "argument --eval-every: must be at least 1, not 0"),
    Case("bench learn --eval-questions 0", lambda ws, a: bench("learn", ws, "--eval-questions", "0"),
         "argument --eval-questions: must be at least 1, not 0"),
    Case("bench learn --seeds -1", lambda ws, a: bench("learn", ws, "--seeds", "-1"),
         "argument --seeds: must be 0 or more, not -1"),
    Case("bench learn --seeds a", lambda ws, a: bench("learn", ws, "--seeds", "a"),
         "argument --seeds: expected a whole number, not 'a'"),
    Case("bench learn --seeds 0,,1", lambda ws, a: bench("learn", ws, "--seeds", "0,,1"),
         "argument --seeds: '0,,1' has an empty item"),
    Case("bench learn --seeds 0,0", lambda ws, a: bench("learn", ws, "--seeds", "0,0"),
         "argument --seeds: '0,0' names 0 more than once"),
    Case("bench learn --ood-seed -2", lambda ws, a: bench("learn", ws, "--ood-seed", "-2"), "argument --ood-seed"),
    Case("bench learn --presets of no file", lambda ws, a: bench("learn", ws, "--presets", "fixed,fixd"),
         "--presets: no file for fixd in jobs/configs/presets/local_cpu; known:"),
    Case("bench learn --baseline not a preset", lambda ws, a: bench("learn", ws, "--baseline", "bridge2"),
         "--baseline bridge2: not one of --presets (fixed,bridge)"),
    Case("bench learn with a misspelt override", lambda ws, a: bench("learn", ws, "optim.lrr=0.1"),
         "optim.lrr: unknown key (did you mean 'lr'?)"),
    Case("bench learn on a question file with an empty gold answer",
         lambda ws, a: bench("learn", ws, f"data.train=[{bad_questions(ws, EMPTY_ANSWER)}]"),
         "qa.jsonl:1: golden_answers[1] is empty"),
    Case("bench learn --out a file", lambda ws, a: ["bench", "learn", "--out", str(write_lines(ws / "f", ["x"]))],
         "--out {ws}/f: is a file, not a folder"),
    Case("bench round --compare with a misspelt key",
         lambda ws, a: bench("round", ws, "--compare", "engine.backendd=hf,vllm"),
         "--compare engine.backendd=hf: invalid configuration"),
    Case("bench round --compare without values", lambda ws, a: bench("round", ws, "--compare", "engine.backend"),
         "--compare 'engine.backend': expected KEY=V1,V2"),
    Case("bench round --compare with an empty value",
         lambda ws, a: bench("round", ws, "--compare", "rollout.max_staleness=0,,1"), "has an empty item"),
    Case("bench round --compare with a value of the wrong type",
         lambda ws, a: bench("round", ws, "--compare", "rollout.max_staleness=0,x"),
         "--compare rollout.max_staleness=x: invalid configuration"),
    Case("bench round --rounds 0", lambda ws, a: bench("round", ws, "--rounds", "0"), "argument --rounds"),
    Case("bench paired on records without recall",
         lambda ws, a: paired(ws, eval_file(ws, "e.json", {"uid": ["q0", "q1"], "em": [0, 1]})),
         "{ws}/e.json: questions.gap_dev.recall: Field required"),
    Case("bench paired on a file that is not JSON", lambda ws, a: paired(ws, eval_file(ws, "e.json", text="{oops")),
         "{ws}/e.json:1: not JSON"),
    Case("bench paired on an em of the wrong type",
         lambda ws, a: paired(ws, eval_file(ws, "e.json", {"uid": ["q0"], "em": ["yes"], "recall": [None]})),
         "{ws}/e.json: questions.gap_dev.em[0]: Input should be a valid number"),
    Case("bench paired on lists of unequal length",
         lambda ws, a: paired(ws, eval_file(ws, "e.json", {"uid": ["q0", "q1"], "em": [0, 1], "recall": [0.5]})),
         "{ws}/e.json: questions.gap_dev: Value error, recall has 1 entries and uid 2"),
    Case("bench paired on a file without rows", lambda ws, a: paired(ws, eval_file(ws, "e.json", text='{"a": 1}')),
         "{ws}/e.json: rows: Field required"),
    Case("bench paired on a JSON list", lambda ws, a: paired(ws, eval_file(ws, "e.json", text="[]")),
         "{ws}/e.json: not an evaluation file"),
    Case("bench paired on a file that does not exist", lambda ws, a: paired(ws, str(ws / "none.json")),
         "{ws}/none.json: no such file"),
    Case("bench paired --out a folder", lambda ws, a: paired(ws, eval_file(ws, "e.json"), "--out", str(ws)),
         "is a folder, not a file"),
    Case("bench agent --group-size 0", lambda ws, a: bench("agent", ws, "--group-size", "0"), "argument --group-size"),
    Case("bench agent --ks with a zero", lambda ws, a: bench("agent", ws, "--ks", "8", "0"), "argument --ks"),
    Case("bench estimators --gammas with a negative",
         lambda ws, a: bench("estimators", ws, "--gammas", "0.1,-1"), "argument --gammas: must be a finite number"),
    Case("bench estimators --gammas with an empty item",
         lambda ws, a: bench("estimators", ws, "--gammas", "0.1,"), "argument --gammas: '0.1,' has an empty item"),
    Case("bench estimators --first-question -1",
         lambda ws, a: bench("estimators", ws, "--first-question", "-1"), "argument --first-question"),
    Case("bench landscape --points 0", lambda ws, a: bench("landscape", ws, "--points", "0"), "argument --points"),
    Case("bench landscape --span nan", lambda ws, a: bench("landscape", ws, "--span", "nan"),
         "argument --span: must be a finite number above 0"),
    Case("bench learner --variants of an unknown one", lambda ws, a: bench("learner", ws, "--variants", "full,qlora"),
         "argument --variants: unknown qlora; choose from full, full_ckpt, lora, lora_ckpt"),
    Case("bench learner --length 1", lambda ws, a: bench("learner", ws, "--length", "1"), "--length 1"),
    Case("bench learner --rows 0", lambda ws, a: bench("learner", ws, "--rows", "0"), "argument --rows"),
    Case("bench retrieval --parts of an unknown part", lambda ws, a: bench("retrieval", ws, "--parts", "recall,speed"),
         "argument --parts: unknown speed; choose from recall, adapt, throughput"),
    Case("bench retrieval --shard-cpus 0", lambda ws, a: bench("retrieval", ws, "--shard-cpus", "0"),
         "argument --shard-cpus"),
    Case("bench retriever-update --turns 0", lambda ws, a: bench("retriever-update", ws, "--turns", "0"),
         "argument --turns"),
    Case("bench speed --untimed -1", lambda ws, a: bench("speed", ws, "--untimed", "-1"),
         "argument --untimed: must be 0 or more, not -1"),
    Case("bench trl --threads 0", lambda ws, a: bench("trl", ws, "--threads", "0"), "argument --threads"),
    Case("bench trl --group-size 1", lambda ws, a: bench("trl", ws, "--group-size", "1"),
         "--group-size 1 must each be at least 2 (TRL's minimum)"),
    Case("bench learner --model of no architecture", lambda ws, a: bench("learner", ws, "--model", "llama-9000"),
         "--model llama-9000: no architecture config"),
    Case("bench world --max-questions 0", lambda ws, a: bench("world", ws, "--max-questions", "0"),
         "argument --max-questions"),
    Case("bench replay --seeds 1,x", lambda ws, a: replay(ws, "--seeds", "1,x"), "argument --seeds"),
    Case("bench replay --rows an existing file",
         lambda ws, a: ["bench", "replay", "--rows", str(write_lines(ws / "rows", ["x"]))],
         "--rows {ws}/rows: is a file, not a folder"),
    Case("bench replay --probe with an empty gold answer",
         lambda ws, a: replay(ws, "--probe", bad_questions(ws, EMPTY_ANSWER)),
         "qa.jsonl:1: golden_answers[1] is empty"),
    Case("bench replay --probe of no questions", lambda ws, a: replay(ws, "--probe", bad_questions(ws, b"")),
         "holds no questions"),
    Case("train on an empty gold answer", lambda ws, a: train_on(ws, EMPTY_ANSWER),
         "qa.jsonl:1: golden_answers[1] is empty, and an empty answer is found in every response"),
    Case("eval of a set with an empty gold answer",
         lambda ws, a: ["eval", "--config", LOCAL_CPU, "--data", f"dev={bad_questions(ws, EMPTY_ANSWER)}"],
         "golden_answers[1] is empty"),
]

# --- an earlier result is never replaced without --overwrite; result files read through their schema -----------


def existing(path: Path, argv: list[str]) -> list[str]:
    """``argv`` with ``path`` already holding an earlier result (the case asserts it keeps its bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"an earlier result": true}\n')
    return argv


def exists(ws: Path, flag: str = "--out", name: str = "out.json") -> str:
    return f"{flag} {ws}/{name}: the file exists (an earlier result?); choose another {flag}, or pass --overwrite"


def kept_evaluation(ws: Path, text: str) -> list[str]:
    """``bench learn --quick`` into ``ws/out``, where a stopped run kept the warm-up's evaluation as ``text``."""
    (ws / "out").mkdir()
    (ws / "out" / "warmup-bench-eval-q200-ood1.json").write_text(text)
    return ["bench", "learn", "--quick", "--out", str(ws / "out")]


def rows_holding(ws: Path, files: dict[str, str]) -> list[str]:
    """``bench replay`` whose ``--rows ws/rows`` holds ``files`` (name -> text)."""
    (ws / "rows").mkdir()
    for name, text in files.items():
        (ws / "rows" / name).write_text(text)
    return replay(ws, "--questions", "2", "--dev-questions", "1")


def without_gold(i: int) -> str:
    return question(i, metadata={"type": "single"})


KEPT = "{ws}/out/warmup-bench-eval-q200-ood1.json"
GOLD_WARMUP = "give warmup.data a demonstration file, or set warmup.enabled=false"

RESULT_CASES = [
    Case("eval --out an existing result",
         lambda ws, a: existing(ws / "out.json", ["eval", "--config", LOCAL_CPU, "--out", str(ws / "out.json")]),
         exists("{ws}")),
    Case("judge --out an existing result",
         lambda ws, a: existing(ws / "out.json", ["judge", "--responses", bad_questions(ws, [question(0)]),
                                                  "--out", str(ws / "out.json"), "--judge", "openai"]),
         exists("{ws}")),
    Case("eval --suite mirage --out a folder holding a result",
         lambda ws, a: existing(ws / "m" / "mirage.json", ["eval", "--suite", "mirage", "--out", str(ws / "m")]),
         "{ws}/m already holds files (mirage.json); choose another --out, or pass --overwrite"),
    Case("bench paired --out an existing result",
         lambda ws, a: existing(ws / "out.json", paired(ws, eval_file(ws, "e.json"), "--out", str(ws / "out.json"))),
         exists("{ws}")),
    Case("bench seeds --out an existing figure",
         lambda ws, a: existing(ws / "f.png", ["bench", "seeds", "a=r.json", "--out", str(ws / "f.png")]),
         exists("{ws}", name="f.png")),
    *[Case(f"bench {name} --out an existing result",
           lambda ws, a, name=name: existing(ws / "out.json", bench(name, ws)), exists("{ws}"))
      for name in ("world", "round", "speed", "agent", "trl", "landscape", "learner", "retrieval",
                   "retriever-update")],
    Case("bench seeds on a results.json without paired rows",
         lambda ws, a: ["bench", "seeds", f"a={write_lines(ws / 'r.json', [json.dumps({'final': []})])}", "--out",
                        str(ws / "f.png")],
         "{ws}/r.json: paired: Field required"),
    Case("bench replay --out an existing result",
         lambda ws, a: existing(ws / "out.json", replay(ws, "--out", str(ws / "out.json"))), exists("{ws}")),
    Case("bench replay --rows holding files that are not a collection",
         lambda ws, a: rows_holding(ws, {"notes.txt": "mine\n"}),
         "--rows {ws}/rows: holds files that are not a collection (notes.txt); choose another --rows, or pass "
         "--overwrite"),
    Case("bench replay --rows with a damaged collection.json",
         lambda ws, a: rows_holding(ws, {"collection.json": "{oops", "turns.jsonl": ""}),
         "--rows {ws}/rows: {ws}/rows/collection.json is damaged"),
    Case("bench estimators --out holding a file that is not its figures",
         lambda ws, a: existing(ws / "out.json", bench("estimators", ws)),
         "--out {ws}/out.json: batches: Field required; choose another --out, or pass --overwrite to start over"),
    Case("bench learn --out with a kept evaluation that is not JSON", lambda ws, a: kept_evaluation(ws, '{"gap": '),
         KEPT + ":1: not JSON"),
    Case("bench learn --out with a kept evaluation missing a field",
         lambda ws, a: kept_evaluation(ws, json.dumps({"gap": {"rows": [], "m_avg": None, "avg": None}})),
         KEPT + ": gap.questions: Field required; remove it to evaluate again"),
    Case("bench learn --out with a kept evaluation of the wrong shape",
         lambda ws, a: kept_evaluation(ws, "[]"),
         KEPT + ": not an evaluation bench learn kept"),
    Case("train --dry-run warming up on questions without gold passages",
         lambda ws, a: train_on(ws, [without_gold(i) for i in range(4)]),
         "warmup: {ws}/qa.jsonl:1: no metadata.gold_doc_ids, nor has any other of the 4 questions"),
    Case("train --dry-run warming up on gold ids that are not corpus ids",
         lambda ws, a: train_on(ws, [question(0, metadata={"gold_doc_ids": [3]}),
                                     question(1, metadata={"gold_doc_ids": ["doc-7"]})]),
         "warmup: {ws}/qa.jsonl:2: metadata.gold_doc_ids must be a list of corpus ids (whole numbers), "
         "got ['doc-7']"),
    Case("bench learn warming up on questions without gold passages",
         lambda ws, a: bench("learn", ws, f"data.train=[{bad_questions(ws, [without_gold(i) for i in range(4)])}]"),
         "warmup: {ws}/qa.jsonl:1: no metadata.gold_doc_ids"),
    Case("warmup without gold passages, checked before its model loads",
         lambda ws, a: ["warmup", "--config", LOCAL_CPU, f"data.train=[{bad_questions(ws, [without_gold(0)])}]"],
         GOLD_WARMUP),
]

CASES = CONFIG_CASES + DATA_CASES + CORPUS_CASES + INDEX_CASES + RUN_CASES + EXPORT_CASES + PREFLIGHT_CASES
CASES += BENCH_CASES + RESULT_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_a_clear_error_and_leaves_the_inputs_alone(case, assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ray.init", _no_ray)
    monkeypatch.setattr(uvicorn.Server, "run", _no_serving)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # and a W&B host that no ~/.netrc has a key for
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ws = tmp_path / "ws"
    ws.mkdir()
    argv = case.setup(ws, assets)
    capsys.readouterr()
    before = snapshot(ws)
    assert main(argv) == case.rc
    err = capsys.readouterr().err
    assert case.culprit.format(ws=ws) in err, err
    assert re.search(r"^error: ", err, re.M), err
    assert "Traceback" not in err
    assert snapshot(ws) == before, "the failed command changed its inputs or left output behind"


def test_every_problem_is_listed_at_once(assets, tmp_path, capsys, monkeypatch):
    """Five independent problems of one ``train --dry-run``: five ``error:`` lines, Ray never started."""
    monkeypatch.setattr("ray.init", _no_ray)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    argv = train(tmp_path, "--dry-run", f"data.train=[{write_lines(tmp_path / 'qa.jsonl', [question(0)])}]",
                 f"data.eval.dev={tmp_path / 'gone.jsonl'}", f"retrieval.index.dir={index_of(tmp_path, assets)}",
                 "telemetry.wandb_mode=online")
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 5, err
    for culprit in ("fewer than one batch", "data.eval.dev", "another encoder", "wandb_mode", "gold_doc_ids"):
        assert any(culprit in line for line in lines), err


GOOD_STARTS = {
    "resume into a run of the same policy and encoder": lambda ws, a: resumable(ws, **{"warmup.enabled": "false"}),
    "an adapter of the encoder": lambda ws, a: train(ws, "--dry-run", f"retrieval.encoder.adapter={adapter(ws)}",
                                                     "retrieval.lora.rank=4", "retrieval.lora.alpha=4",
                                                     "retrieval.lora.target_modules=[value,query]"),
    "an index of the encoder": lambda ws, a: train(ws, "--dry-run", f"retrieval.index.dir={a.index}"),
}


@pytest.mark.parametrize("setup", GOOD_STARTS.values(), ids=GOOD_STARTS.keys())
def test_good_inputs_pass_every_check_and_reach_ray(setup, assets, tmp_path, monkeypatch):
    """The checks refuse only what is wrong: inputs that agree get as far as starting Ray."""
    monkeypatch.setattr("ray.init", _no_ray)
    with pytest.raises(AssertionError, match="before Ray starts"):
        main(setup(tmp_path, assets))


def test_dry_run_counts_one_shard_holder_per_manifest_shard(assets):
    """The index has 2 shards, ``retrieval.index.num_shards`` is left at its default 1: the run starts 2 holders,
    so --dry-run reserves 2."""
    from bridge_ray.config import load_config
    from bridge_ray.coordinator.graph import role_specs

    config = load_config(None, [f"retrieval.index.dir={assets.index}"])
    assert role_specs(config)["shard_holder"].count == 2


def test_shard_holder_count_is_checked_against_the_prebuilt_index(assets):
    """With ``retrieval.index.dir`` the manifest's shards decide (``num_shards`` is build-only): a holder count
    that equals them is accepted, one that does not is an error naming the key, before Ray starts."""
    from bridge_ray.config import load_config
    from bridge_ray.coordinator.graph import role_specs

    index = [f"retrieval.index.dir={assets.index}"]
    assert role_specs(load_config(None, [*index, "roles.shard_holder.count=2"]))["shard_holder"].count == 2
    with pytest.raises(InputError, match=r"roles.shard_holder.count \(1\) must equal the shards of"):
        role_specs(load_config(None, [*index, "roles.shard_holder.count=1"]))


def _no_ray(*args, **kwargs):
    raise AssertionError("a bad-input check must fail before Ray starts")


def _no_serving(*args, **kwargs):
    raise AssertionError("a damaged index must fail before the server starts")


# --- HTTP: one bad request fails only itself ----------------------------------------------------------------


@pytest.fixture(scope="module")
def url(assets):
    from bridge_ray.config import load_config
    from bridge_ray.retrieval.client import RetrieverClient
    from bridge_ray.retrieval.encoder import QueryEncoder
    from bridge_ray.retrieval.server import ServerLimits, create_app

    client = RetrieverClient.from_index(QueryEncoder(load_config().retrieval.encoder.spec()), assets.index)
    limits = ServerLimits(max_topk=5, max_query_chars=50, max_request_bytes=4096, batch_window_ms=20)
    with served(create_app(client, limits)) as base_url:
        yield base_url


HTTP_CASES = [
    ("lone surrogate", '{"queries": ["ok", "\\ud800"]}', 422, "queries[1]"),
    ("topk as a string", '{"queries": ["q"], "topk": "3"}', 422, "topk"),
    ("topk as a boolean", '{"queries": ["q"], "topk": true}', 422, "topk"),
    ("topk above the limit", '{"queries": ["q"], "topk": 50}', 422, "topk"),
    ("unknown field", '{"queries": ["q"], "top_k": 3}', 422, "top_k"),
    ("queries not a list", '{"queries": "q"}', 422, "queries"),
    ("body over the size limit", json.dumps({"queries": ["q" * 40] * 100}), 413,
     "limit of 4096 bytes (retrieval.server.max_request_bytes)"),
    ("query too long", json.dumps({"queries": ["x" * 51]}), 413, "queries[0]"),
    ("body that is not JSON", '{"queries": [', 422, "JSON"),
]


@pytest.mark.parametrize(("name", "body", "status", "culprit"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_bad_request_fails_only_itself(url, name, body, status, culprit):
    with httpx.Client(base_url=url, timeout=60, headers={"Content-Type": "application/json"}) as http:
        bad = http.post("/retrieve", content=body)
        good = http.post("/retrieve", json={"queries": ["body 3"], "topk": 2})
    assert bad.status_code == status, bad.text
    assert culprit in bad.text, bad.text
    assert good.status_code == 200 and len(good.json()["result"][0]) == 2


def test_port_in_use_is_an_error_before_serving(assets, capsys, monkeypatch):
    monkeypatch.setattr(uvicorn.Server, "run", _no_serving)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve-retriever", "--index", str(assets.index), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert f"port {port}" in err and "serving" not in out
