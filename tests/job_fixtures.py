"""Shared by the tests that run the main job: the shrunk embedded default and a tiny policy.

The tiny policy is a 2-layer random Gemma 3 with a tiny tokenizer (:func:`save_tiny_tokenizer`): the real code path
(HF engine, DeepSpeed, checkpoints) at a fraction of the cost. It rarely writes a well-formed search, so tests of the
retriever update use the protocol policy (:func:`save_protocol_policy`), which searches by construction.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import psutil
import torch

from bridge_ray.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]
LOCAL_CPU = REPO / "jobs/configs/local_cpu.yaml"

# The embedded default, shrunk: the small world, 2 questions × 2 rollouts, short actions and observations, no
# warm-up (the few-shot prompt makes the base Gemma search), no evaluation; a full fine-tune, so that DeepSpeed
# trains and syncs every weight somewhere (the gap world's tests cover the LoRA policy).
SMALL_JOB = (
    "learner.lora.enabled=false",
    "optim.lr=1.0e-5",
    "algorithm.grpo.kl_coef=1.0e-4",
    "algorithm.grpo.old_logp=learner",
    "data.world_size=small",
    "warmup.enabled=false",
    "policy.prompt_template=bridge_ray/agent/templates/few_shot.txt",
    "rollout.max_response_length=320",
    "rollout.max_observation_length=128",
    "rollout.questions_per_batch=2",
    "algorithm.grpo.rollouts_per_question=2",
    "algorithm.retriever.num_candidates=4",
    "rollout.max_action_length=24",
    "optim.mini_batch_size=2",
    "eval.before_training=false",
    "eval.after_training=false",
    "eval.max_questions=2",
    "telemetry.ray_metrics=false",
)


def job_config(output_dir: Path, *overrides: str) -> Config:
    return load_config(LOCAL_CPU, [f"run.output_dir={output_dir}", *SMALL_JOB, *overrides])


def tiny_policy_overrides(tiny_policy: Path) -> tuple[str, ...]:
    """Overrides that put the tiny policy in the job (no reference model: kl_coef 0)."""
    return (f"policy.model={tiny_policy}", "algorithm.grpo.kl_coef=0.0")


def save_tiny_tokenizer(path: Path):
    """A byte-level BPE tokenizer of about 570 tokens learnt from the prompt templates and the protocol's messages,
    saved to ``path`` as a Hugging Face tokenizer (and returned): Gemma's special tokens at Gemma's ids, and Gemma's
    split of the search protocol (``<`` ``search`` ``>`` `` blue`` `` </`` ``answer`` ``>``). With Gemma's 262,144
    tokens, the LM head and its log-softmax were nearly all of a tiny model's compute (a training step and sampling
    20 to 30 times slower), and the 33 MB ``tokenizer.json`` took two CPU-seconds to load in every sampler of every
    test. Deterministic: the same file each time."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from bridge_ray.agent.protocol import CORRECTIVE_MESSAGE

    texts = [t.read_text() for t in sorted((REPO / "bridge_ray/agent/templates").glob("*.txt"))]
    texts += [f"\n\n{CORRECTIVE_MESSAGE}\n\n",
              "<search> blue </search> <answer> red </answer>\n\n<information> </information>\n\n"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1024, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                       special_tokens=[("<bos>", bpe.token_to_id("<bos>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                        unk_token="<unk>")
    tokenizer.save_pretrained(path)
    return tokenizer


def tiny_gemma3_config(tokenizer, **overrides):
    """The tiny policies' architecture: 2 layers of width 32 with ``tokenizer``'s vocabulary and special ids."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**{
        "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 1024,
        "sliding_window": 64, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, **overrides})


def save_tiny_policy(path: Path, tokenizer_from: str | None = None) -> Path:
    """The tiny random policy, with the tiny tokenizer or a copy of ``tokenizer_from``'s."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    from bridge_ray.model_paths import copy_tokenizer, resolve_model_path

    if tokenizer_from is None:
        tokenizer = save_tiny_tokenizer(path)
    else:
        copy_tokenizer(resolve_model_path(tokenizer_from), path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    Gemma3ForCausalLM(tiny_gemma3_config(tokenizer)).save_pretrained(path)
    return path


def save_protocol_policy(path: Path) -> Path:
    """A 2-layer Gemma 3 with the tiny tokenizer whose next token depends (almost) only on the last one: a bigram
    machine over the search protocol (random layers under a dominant embedding). It writes
    ``<search|answer> blue|red </search|answer>`` with even odds at each choice, so a round searches and, where every
    golden answer is "blue", has mixed rewards.
    """
    from transformers import Gemma3ForCausalLM

    tokenizer = save_tiny_tokenizer(path)
    lt, search, gt, blue, close, answer, _ = tokenizer("<search> blue </answer>", add_special_tokens=False).input_ids
    [red] = tokenizer(" red", add_special_tokens=False).input_ids
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(tiny_gemma3_config(tokenizer, tie_word_embeddings=False))
    slot = {lt: 1, search: 2, answer: 3, gt: 4, blue: 5, red: 6, close: 7}  # dimension 0: every other token
    follows = {lt: (0,), search: (1, 7), answer: (1, 7), gt: (2, 3), blue: (4,), red: (4,), close: (5, 6)}
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[:, 8:] = torch.randn(embed.shape[0], 24)  # what the random layers see of each token
        embed[:, :8] = 0.0
        embed[:, 0] = 20.0
        for token, k in slot.items():
            embed[token, 0], embed[token, k] = 0.0, 20.0
        head.normal_(0.0, 0.01)
        for token, previous in follows.items():
            head[token, list(previous)] = 10.0
    model.save_pretrained(path)
    return path


class ProcessTree:
    """This process's descendants, each process's parent read once: psutil's ``children(recursive=True)`` reads
    every process on the machine again, 10 CPU-ms a call with 200 processes, which a wait polling it every
    10 ms took from the 2 cores the suite shares (a fifth of that here)."""

    def __init__(self) -> None:
        self._parents: dict[int, int] = {}
        self._procs: dict[int, psutil.Process] = {}

    def descendants(self) -> list[psutil.Process]:
        pids = set(psutil.pids())
        for gone in self._parents.keys() - pids:
            del self._parents[gone], self._procs[gone]
        for pid in pids - self._parents.keys():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                self._parents[pid], self._procs[pid] = proc.ppid(), proc
        children = defaultdict(list)
        for pid, parent in self._parents.items():
            children[parent].append(pid)
        found, stack = [], [os.getpid()]
        while stack:
            for pid in children[stack.pop()]:
                found.append(self._procs[pid])
                stack.append(pid)
        return found


def processes_titled(title: str, tree: ProcessTree | None = None) -> list[psutil.Process]:
    """Processes under this one whose Ray process title contains ``title`` (``tree``: one kept across the polls
    of a wait).

    Ray titles an actor's worker ``ray::Class`` when idle and ``ray::Class.method`` while it runs a call,
    and the workers of a Ray instance started here descend from this process, so other Ray instances on
    the machine are never touched.
    """
    return titled((tree or ProcessTree()).descendants(), title)


def titled(processes: Iterable[psutil.Process], title: str) -> list[psutil.Process]:
    """Those of ``processes`` whose Ray process title contains ``title``; processes that have ended are left out."""
    found = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if title in " ".join(proc.cmdline()):
                found.append(proc)
    return found


def wait_until_running(title: str, timeout_s: float = 180.0, *, kill: bool = False) -> int:
    """The pid of the first process titled ``title`` (see :func:`processes_titled`) once it appears, SIGKILLed
    when ``kill``. Polled every 20 ms: a poll took 10 ms of CPU before :class:`ProcessTree`, 2 now, so a call
    is caught as soon after it starts as when the poll slept 10 ms."""
    tree = ProcessTree()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in processes_titled(title, tree):
            try:
                if kill:
                    proc.send_signal(signal.SIGKILL)
                return proc.pid
            except psutil.Error:
                continue
        time.sleep(0.02)
    raise AssertionError(f"no process titled {title!r} within {timeout_s}s")


def kill_when_running(title: str, timeout_s: float = 180.0) -> int:
    """SIGKILL the first process titled ``title`` once it appears; its pid."""
    return wait_until_running(title, timeout_s, kill=True)


def write_checkpoint(root: Path, policy: Path, config: Config, *, adapter: bool = True) -> Path:
    """A complete checkpoint of ``config``'s run under ``root`` (round 3): ``policy`` as its policy, and when
    ``adapter`` a query LoRA adapter whose B factors are random, so that it changes the query embeddings."""
    import shutil

    from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR, CheckpointManager, Manifest
    from bridge_ray.retrieval.encoder import QueryEncoder

    def fill(staging: Path) -> None:
        shutil.copytree(policy, staging / "policy")
        if adapter:
            encoder = QueryEncoder.from_config(config.retrieval)
            torch.manual_seed(0)
            for name, param in encoder.model.named_parameters():
                if "lora_B" in name:
                    param.data.normal_(std=0.05)
            encoder.save_adapter(staging / RETRIEVER_ADAPTER_DIR)

    return CheckpointManager(root, keep=1).save(Manifest(3, 3, 3), fill, config)


# What a finished run leaves beside its checkpoints.
RUN_FILES = ("phases.jsonl", "eval.jsonl", "config.yaml", "eval_before.md", "eval_before.json", "eval_stages.md")


def old_run(folder: Path, rounds: tuple[int, ...] = (248, 249, 250)) -> Path:
    """A run folder as ``train`` leaves it: checkpoints and ``latest``, logs, evaluation tables, config.yaml."""
    checkpoints = folder / "checkpoints"
    for r in rounds:
        checkpoint = checkpoints / f"round-{r:08d}"
        (checkpoint / "policy").mkdir(parents=True)
        (checkpoint / "policy" / "config.json").write_text("{}\n")
        manifest = {"round": r, "policy_version": r, "retriever_version": r, "files": {"policy/config.json": 3}}
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    (checkpoints / "latest").write_text(f"round-{rounds[-1]:08d}")
    for name in RUN_FILES:
        (folder / name).write_text("{}\n")
    return folder
