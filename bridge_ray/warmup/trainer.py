"""The warm-up stage (cold-start SFT): teach the policy the search protocol before RL.

Gemma 3 270M base writes tag salad and copies the wrong span, so every GRPO group of the embedded default
had zero reward variance. A few hundred demonstrations (:mod:`bridge_ray.agent.demonstrations`), trained
with the negative log-likelihood of their action tokens only — the tokens RL later trains, observation
and prompt tokens masked exactly as in RL — give RL rewarded trajectories to start from.

The warmed-up policy is an ordinary HF directory in the model cache, keyed by a hash of everything that
determines it (base weights, prompt, demonstrations, settings: :data:`WARMUP_KEY`), so a second run reuses it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from bridge_ray.agent.demonstrations import (
    DemonstrationBuilder,
    detour_sources,
    gold_search_demonstrations,
    load_demonstrations,
    plan_detours,
)
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.agent.protocol import ANSWER_OPEN, SEARCH_OPEN, ObservationRenderer
from bridge_ray.agent.types import Trajectory, collate
from bridge_ray.cache_key import CacheKey, file_digest, under
from bridge_ray.config import Config
from bridge_ray.coordinator.inputs import (
    index_dir,
    reworded,
    reworded_train_files,
    starting_retriever,
    train_questions,
    train_questions_files,
)
from bridge_ray.engines.buckets import least_padding_runs
from bridge_ray.engines.models import load_causal_lm, load_tokenizer, pad_token_id
from bridge_ray.engines.precision import FP32, Precision, cpu_kernels, resolve_precision
from bridge_ray.fresh_process import in_fresh_process
from bridge_ray.model_paths import cached_model, resolve_model_path, save_tokenizer
from bridge_ray.policy_learner.batch import PolicyBatch
from bridge_ray.policy_learner.objective import sequence_log_probs
from bridge_ray.progress import LINES, Progress
from bridge_ray.runtime.model_process import skip_unused_transformers_imports

_SAMPLER_ONLY = "the sampler's: demonstrations are written, not sampled"
# The warmed-up policy's cache key. Bump the version when the demonstrations or the training loop change what a given
# configuration produces (2: the demonstrations' gold passage sits at a drawn slot, not always last).
_LORA_SHAPE = under("learner.lora", "rank", "alpha", "dropout", "target_modules")  # under warmup.lora only
WARMUP_KEY = CacheKey(
    "warmup", version=2,
    fields=(
        *under("warmup", "examples", "epochs", "lr", "batch_size", "freeze_embeddings", "lora", "phrasings",
               "decision_weight", "detours", "seed"),
        *under("rollout", "max_turns", "max_observation_length"),
        "policy.chat_template",
        *_LORA_SHAPE,
        "algorithm.retriever.num_shown",
        *under("retrieval.index", "hnsw_ef_search", "ivf_nprobe"),  # which passages the demonstrations' searches find
    ),
    excluded={
        "warmup.enabled": "whether a run warms up, not what it trains",
        "warmup.data": "its bytes' digest is the sources input",
        **dict.fromkeys(under("rollout", "questions_per_batch", "temperature", "top_p", "max_prompt_length",
                              "max_response_length", "max_action_length", "max_staleness", "dynamic_sampling",
                              "oversample"), _SAMPLER_ONLY),
        "policy.model": "enters resolved, as the model input (a packaged model's converted directory)",
        "policy.prompt_template": "its text is the template input",
        "policy.trust_remote_code": "whether a model's own code may run, not what it computes",
        **dict.fromkeys(under("policy", "dtype", "score_batch_size"), _SAMPLER_ONLY),
        "learner.dtype": "enters resolved on this machine's device, as the precision input",
        **dict.fromkeys(under("learner", "zero_stage", "micro_batch_size", "length_buckets", "reuse_old_logp",
                              "gradient_checkpointing", "lr_schedule", "min_lr_ratio"), "the RL learner's"),
        "learner.lora.enabled": "the RL learner's adapter; the warm-up's is warmup.lora",
        **dict.fromkeys(under("algorithm.retriever", "gamma", "retrieval_temperature", "posterior_temperature",
                              "clip_eps", "candidates", "turns", "turn_weight", "kl_coef", "update_period", "lr",
                              "inner_steps", "micro_batch_size"), "the retriever's RL update"),
        "algorithm.retriever.num_candidates": "a demonstration shows the top num_shown of its searches",
        **dict.fromkeys(under("retrieval.encoder", "name", "passage_name", "pooling", "normalize", "query_prefix",
                              "passage_prefix", "max_query_length", "max_passage_length"),
                        "enters resolved, as the encoder input"),
        "retrieval.encoder.adapter": "its weights' digest is the adapter input",
        **dict.fromkeys(under("retrieval.encoder", "passage_batch_size", "query_batch_size"), "batching"),
        "retrieval.encoder.passage_dtype": "shapes the index, whose name is in the sources input",
        **dict.fromkeys(under("retrieval.index", "dir", "num_shards", "index_type", "hnsw_m", "hnsw_ef_construction",
                              "ivf_nlist"), "the index, whose name is in the sources input"),
        "retrieval.index.verify": "checks the index files, changes no search",
        **dict.fromkeys(under("data", "train", "world", "world_seed", "world_size", "world_phrasing"),
                        "the train questions, whose files' digests are the sources input"),
        "data.eval": "evaluation only",
    },
)


def action_nll(logp: torch.Tensor, weights: torch.Tensor, tokens: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the action tokens of a batch over ``tokens``, by default their total weight: their
    (weighted) mean, the SFT loss. ``weights`` is the action mask (observations excluded) or
    :func:`decision_weights`. With the whole step's total, the parts of a step sum to its loss."""
    mask = weights.to(logp.dtype)
    return -(logp * mask).sum() / (mask.sum().clamp(min=1.0) if tokens is None else max(tokens, 1.0))


def decision_offset(tokenizer) -> int:
    """Where in an action the policy chooses between searching and answering: the first token at which the ids
    of ``<search>`` and ``<answer>`` differ (1 for Gemma 3: ``<``, then ``search`` or ``answer``)."""
    search, answer = (tokenizer(tag, add_special_tokens=False).input_ids for tag in (SEARCH_OPEN, ANSWER_OPEN))
    parted = (i for i, (a, b) in enumerate(zip(search, answer, strict=False)) if a != b)
    return next(parted, min(len(search), len(answer)))  # one tag a prefix of the other: the token after it


def decision_weights(action_mask: torch.Tensor, offset: int, weight: float) -> torch.Tensor:
    """Per-token loss weights: ``weight`` on token ``offset`` of every action (its search-or-answer choice), 1 on
    the other action tokens, 0 elsewhere.

    With plain weights a demonstration's one or two choices are 2 of ~27 action tokens: their gradient is small
    beside the queries' and answers', and the warm-up may settle on one number of searches for every question
    (docs/results/learn.md). A weight above 1 makes the choice, conditioned on the question, count more.
    """
    mask = action_mask.bool()
    starts = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    run = torch.cumsum(mask.long(), dim=1)  # action tokens so far; minus its value before a start: index in the action
    before = torch.cummax(torch.where(starts, run - 1, 0), dim=1).values
    choice = mask & (run - before - 1 == offset)
    return mask.float() + (weight - 1.0) * choice.float()


def demonstration_batch(trajectories: Sequence[Trajectory], pad_token_id: int) -> PolicyBatch:
    """The learner's batch layout for demonstrations (advantages unused: zero)."""
    n = len(trajectories)
    return PolicyBatch(
        **collate(trajectories, pad_token_id), advantages=torch.zeros(n), question_index=torch.arange(n)
    ).trimmed()


def freeze_embeddings(model: torch.nn.Module) -> None:
    """Stop gradients to the input embeddings (tied to the LM head in Gemma: most of a small model's weights)."""
    model.get_input_embeddings().weight.requires_grad_(False)


@contextlib.contextmanager
def matmul_working_copies(model: torch.nn.Module, precision: Precision) -> Iterator[Callable[[], None]]:
    """Trained linear weights held in ``precision.compute`` for the forwards, their fp32 masters for the optimizer.

    Under autocast every forward casts every trained weight again (autocast's cast cache lasts one context, and a
    step runs one forward per run of similar lengths): 100M values read and written per forward for Gemma 3 270M.
    Here each weight is cast once per optimizer step instead (the yielded ``refresh``), as DeepSpeed's bf16 mode
    keeps bf16 working weights beside fp32 masters. The values are autocast's: the same rounding of the same
    master in the forward, and each run's bf16 gradient added to the master's fp32 ``.grad`` where autocast's cast
    would have added it, so a step's losses and updates are bitwise those of plain autocast. Weights shared by two
    modules (a tied head), frozen weights and anything but ``nn.Linear`` weights keep autocast's own handling; on
    exit the masters are back in the model.
    """
    if not precision.autocast:
        yield lambda: None
        return
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    swapped: list[tuple[torch.nn.Linear, torch.nn.Parameter, torch.nn.Parameter]] = []
    for module in model.modules():
        master = module.weight if isinstance(module, torch.nn.Linear) else None
        if master is not None and master.requires_grad and uses[id(master)] == 1:
            working = torch.nn.Parameter(master.detach().to(precision.compute))
            working.register_post_accumulate_grad_hook(functools.partial(_add_to_master_grad, master))
            module.weight = working
            swapped.append((module, master, working))

    def refresh() -> None:
        with torch.no_grad():
            for _, master, working in swapped:
                working.copy_(master)

    try:
        yield refresh
    finally:
        for module, master, _ in swapped:
            module.weight = master


def _add_to_master_grad(master: torch.nn.Parameter, working: torch.Tensor) -> None:
    """Move a working copy's just-accumulated gradient into its fp32 master's, as autocast's cast backward does."""
    if master.grad is None:
        master.grad = working.grad.to(master.dtype)
    else:
        master.grad.add_(working.grad)
    working.grad = None


def train_on_demonstrations(
    model: torch.nn.Module,
    demos: Sequence[Trajectory],
    pad_token_id: int,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    precision: Precision = FP32,
    decision: tuple[int, float] = (0, 1.0),
    log: Callable[[str], None] = print,
) -> list[float]:
    """AdamW on :func:`action_nll`, shuffled by ``seed`` each epoch; returns the loss of every step.

    A step's ``batch_size`` demonstrations go through in runs of similar length (:func:`least_padding_runs`),
    whose losses and gradients sum to the step's. ``decision`` is the ``(offset, weight)`` of
    :func:`decision_weights` (weight 1: the plain mean).

    The forwards run in ``precision``'s context (the loss is fp32 either way); ``model`` holds its weights.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    order = list(range(len(demos)))
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    started = time.time()
    steps = epochs * math.ceil(len(order) / batch_size)
    window = max(1, steps // LINES)  # the loss shown: the mean over the last tenth of the steps
    progress = Progress(steps, "warm-up", "steps", log=log)
    with matmul_working_copies(model, precision) as refresh:  # bf16 weights for the forwards, cast once a step
        for epoch in range(epochs):
            rng.shuffle(order)
            for start in range(0, len(order), batch_size):
                step = [demos[i] for i in order[start : start + batch_size]]
                losses.append(
                    _demonstration_step(model, step, pad_token_id, optimizer, params, precision, device, decision)
                )
                refresh()
                progress.update(1, loss=sum(losses[-window:]) / len(losses[-window:]))
            recent = losses[-max(1, len(order) // batch_size) :]
            seconds = time.time() - started
            log(f"warm-up epoch {epoch + 1}/{epochs}: loss {sum(recent) / len(recent):.4f} ({seconds:.0f} s)")
    progress.close()
    model.eval()
    return losses


def _demonstration_step(
    model: torch.nn.Module, step: Sequence[Trajectory], pad_token_id: int, optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter], precision: Precision, device: torch.device, decision: tuple[int, float],
) -> float:
    """One optimizer step on ``step``'s demonstrations; its loss."""
    # one forward per run of similar lengths, padded less than the whole step; the runs' losses sum to its
    runs = [demonstration_batch([step[i] for i in run], pad_token_id).to(device)
            for run in least_padding_runs([len(d.token_ids) for d in step], len(step))]
    weights = [decision_weights(batch.action_mask, *decision) for batch in runs]
    tokens, loss = float(sum(w.sum().item() for w in weights)), 0.0
    optimizer.zero_grad(set_to_none=True)
    for batch, weight in zip(runs, weights, strict=True):
        with precision.context(device.type):
            logp, _ = sequence_log_probs(model, batch)
        part = action_nll(logp, weight, tokens)
        part.backward()
        loss += part.item()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss


def warmup_precision(config: Config) -> Precision:
    """The warm-up's precision: ``learner.dtype``'s on the device it trains on, with fp32 weights (a plain
    AdamW keeps no fp32 master copy of bf16 weights, so bf16 runs as autocast)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return resolve_precision(config.learner.dtype, "learner.dtype", device).with_fp32_weights()


def warmup_key(config: Config, model_path: str, sources: dict[str, str]) -> str:
    """:data:`WARMUP_KEY` of ``config`` warming up ``model_path`` on ``sources`` (:func:`warmup_sources`): the cache
    key of :func:`warmed_up_policy`."""
    adapter = config.retrieval.encoder.adapter  # the demonstrations' searches go through it
    return WARMUP_KEY.of(
        config,
        omit=() if config.warmup.lora else _LORA_SHAPE,
        model=str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        template=PromptTemplate.load(config.policy.prompt_template).text,
        encoder=config.retrieval.encoder.spec().to_dict(),
        sources=sources,
        precision=warmup_precision(config).name,
        adapter=None if adapter is None else file_digest(Path(adapter) / "adapter_model.safetensors"),
    )


def build_demonstrations(config: Config, tokenizer) -> list[Trajectory]:
    """``warmup.examples`` demonstrations: the user's file when given, else gold searches on the train split.

    Gold searches read only ``data.train`` (the world's train split by default) and ask the configured
    index through the query encoder the run starts with, so no evaluation question is ever trained on.
    """
    cfg = config.warmup
    builder = DemonstrationBuilder(
        tokenizer, PromptTemplate.load(config.policy.prompt_template), config.rollout.max_turns,
        ObservationRenderer(tokenizer, config.rollout.max_observation_length), config.policy.chat_template,
    )
    rng = random.Random(cfg.seed)
    if cfg.data is not None:
        demos = load_demonstrations(cfg.data, builder)
        return rng.sample(demos, min(cfg.examples, len(demos)))
    train = train_questions(config)
    records = rng.sample(train, min(cfg.examples, len(train)))
    if cfg.phrasings:
        records = reworded(config, records, rng)
    # their own draws: the records and wordings stay those of the same seed without detours
    detours = plan_detours(records, detour_sources(train), cfg.detours, random.Random(f"detours-{cfg.seed}"))
    client = starting_retriever(config)
    try:
        return gold_search_demonstrations(records, builder, client.retrieve, client.passages, detours)
    finally:
        client.close()


def warmup_sources(config: Config) -> dict[str, str]:
    """Digests of the inputs the demonstrations come from (part of the cache key)."""
    if config.warmup.data is not None:
        return {"data": file_digest(config.warmup.data)}
    return {
        **{f"train:{Path(f).name}": file_digest(f) for f in train_questions_files(config)},
        **{f"train:{phrasing}": file_digest(f) for phrasing, f in reworded_train_files(config).items()},
        "index": index_dir(config).name,
    }


def warmed_up_policy(config: Config, log: Callable[[str], None] = print) -> Path:
    """The policy after the warm-up, as an HF directory in the cache: trained on first use, reused after.

    Training runs in a fresh process: the driver that asks for it goes on to host evaluations and the Ray
    job, and would otherwise keep the SFT's gigabytes (a 270M model in fp32 with Adam) for the whole run.
    """
    model_path = resolve_model_path(config.policy.model)
    key = warmup_key(config, model_path, warmup_sources(config))
    path = cached_model(key, lambda out: in_fresh_process(build_warmup, config, model_path, key, out, log=log))
    log(f"warm-up policy: {path}")
    return path


def build_warmup(config: Config, model_path: str, key: str, out: Path, log: Callable[[str], None]) -> None:
    """Train the warm-up of ``model_path`` and save it with its tokenizer and a ``warmup.json`` in ``out``."""
    skip_unused_transformers_imports()
    cfg = config.warmup
    started = time.time()
    torch.manual_seed(cfg.seed)  # a fresh process's RNG is unseeded: LoRA factors and dropout draw from it
    torch.set_num_threads(config.learner_threads())  # not the OMP_NUM_THREADS=1 of the Ray task that spawned us
    tokenizer = load_tokenizer(model_path, config.policy.trust_remote_code)
    demos = build_demonstrations(config, tokenizer)
    tokens = sum(sum(d.action_mask) for d in demos)
    detoured = sum(d.action_mask[d.prompt_length] == 0 for d in demos)  # a detour is the one masked first turn
    log(f"warm-up: {len(demos)} demonstrations ({tokens} action tokens, {detoured} with a detour), {cfg.epochs} "
        f"epochs, lr {cfg.lr:g}")
    precision = warmup_precision(config)
    log(f"warm-up precision: {precision.name}")
    model = load_causal_lm(model_path, precision.weights, config.policy.trust_remote_code)
    if torch.cuda.is_available():
        model = model.cuda()
    if cfg.freeze_embeddings:
        freeze_embeddings(model)
    if cfg.lora:
        model = _with_lora(model, config)
    losses = train_on_demonstrations(
        model, demos, pad_token_id(tokenizer), epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size,
        seed=cfg.seed, precision=precision, decision=(decision_offset(tokenizer), cfg.decision_weight), log=log,
    )
    if cfg.lora:
        model = model.merge_and_unload()
    model.to("cpu").save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tokenizer, out)
    summary = {"key": key, "base_model": model_path, "demonstrations": len(demos), "action_tokens": tokens,
               "detoured": detoured,
               "first_loss": losses[0], "last_loss": losses[-1], "steps": len(losses),
               "seconds": round(time.time() - started, 1), "precision": precision.name,
               "threads": torch.get_num_threads(), "cpu_kernels": cpu_kernels(), "config": cfg.model_dump()}
    (out / "warmup.json").write_text(json.dumps(summary, indent=2) + "\n")


def _with_lora(model: torch.nn.Module, config: Config) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model  # the job driver imports this module: no peft (transformers) there

    lora = config.learner.lora
    return get_peft_model(
        model,
        LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                   target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
    )
