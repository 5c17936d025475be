"""``bridge-ray bench replay``: retriever steps compared on the same logged rollouts, the policy held fixed.

Does one retriever step (its lr, inner steps, trust region, turn weights, γ) raise held-out recall from what the
policy's rollouts tell it, or fit the batch and lose elsewhere? A BRIDGE run cannot say: its policy, its searches and
its batches move with every round, and a round costs minutes. This bench separates the retriever's step:

1. **Collect once** (cached in ``--rows DIR``): the policy (the config's warm-up, or ``policy.model``) rolls out
   ``--questions`` train questions, ``algorithm.grpo.rollouts_per_question`` each with the frozen retriever, in
   rounds of ``rollout.questions_per_batch``; the production scorer gives every retrieval turn's
   ``log p(y | h_t, d)`` over its k candidates; the GRPO advantages are the run's. The same policy's greedy searches
   of the first ``--dev-questions`` dev questions are the probe.
2. **Replay** every ``--variant`` (``algorithm.retriever`` settings) for every ``--seeds`` (the order the rounds
   take the questions), the probe's recall after every round (:mod:`bridge_ray.sweep.replay`).

The report: recall per round (mean over seeds), the last round − the frozen retriever per variant with a 95%
bootstrap interval over dev questions, and where the logged signal points: of the turns whose candidates hold a
gold passage, how often the answer posterior ranks one first, and how much of the evidence turn weight such turns
carry. What replay leaves out: the rounds' trajectories do not follow the adapter (the shown passages and the next
searches are the frozen retriever's), and the policy does not train.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from bridge_ray.algo.grpo import group_advantages
from bridge_ray.cache import MARKER, cached_directory
from bridge_ray.cache_key import CacheKey, under
from bridge_ray.checkpoint import RETRIEVER_ADAPTER_DIR
from bridge_ray.cli import add_config_arguments, add_out_argument
from bridge_ray.cli_types import positive_int, seed_list
from bridge_ray.config import Config, load_config
from bridge_ray.coordinator.inputs import configured_world, train_questions
from bridge_ray.data.qa import load_questions
from bridge_ray.errors import InputError
from bridge_ray.model_paths import resolve_model_path
from bridge_ray.progress import Progress
from bridge_ray.reporting.figures import plot_replay, write_figures
from bridge_ray.reporting.tables import markdown_table
from bridge_ray.sweep.replay import probe_adapters, replay_variant, signal_figures
from bridge_ray.train.local_eval import local_sampler
from bridge_ray.warmup.trainer import warmed_up_policy, warmup_key, warmup_sources

ROWS_FILE = "turns.jsonl"  # one logged retrieval turn per line
PROBE_FILE = "probe.jsonl"  # one dev question per line: its gold passages and the policy's greedy searches
COLLECTION_FILE = "collection.json"  # the collection's key
# What the logged turns and the probe depend on: the questions, the policy (the warm-up's own key when it warms up),
# its sampling, the GRPO advantages, and the frozen retriever (its index and encoder as configured: computing the
# key builds nothing, so a --rows folder of other settings is refused at once). Bump the version when the
# collection's code changes what the same settings log.
REPLAY_KEY = CacheKey(
    "replay", version=1,
    fields=(
        *under("data", "train", "world", "world_seed", "world_size", "world_phrasing"),
        *under("policy", "model", "dtype", "chat_template", "prompt_template"),
        "warmup.enabled",
        "rollout",
        "engine",
        *under("algorithm.grpo", "rollouts_per_question", "adv_eps", "scale_adv_by_std"),
        *under("algorithm.retriever", "num_candidates", "num_shown", "candidates"),
        *under("retrieval.index", "dir", "num_shards", "index_type", "hnsw_m", "hnsw_ef_construction",
               "hnsw_ef_search", "ivf_nlist", "ivf_nprobe"),
        *under("retrieval.encoder", "name", "passage_name", "pooling", "normalize", "query_prefix",
               "passage_prefix", "max_query_length", "max_passage_length", "passage_dtype"),
        "run.seed",
    ),
    excluded={
        "data.eval": "the probe input names the dev file",
        "policy.trust_remote_code": "whether a model's own code may run, not what it computes",
        "policy.score_batch_size": "batching",
        **dict.fromkeys(under("warmup", "data", "examples", "epochs", "lr", "batch_size", "freeze_embeddings",
                              "lora", "phrasings", "decision_weight", "detours", "seed"),
                        "the warmup input: the warm-up's key"),
        **dict.fromkeys(under("algorithm.grpo", "clip_low", "clip_high", "dual_clip", "loss_agg", "kl_coef", "kl_kind",
                              "entropy_coef", "old_logp", "tis_cap"), "the policy's update, which replay does not run"),
        **dict.fromkeys(under("algorithm.retriever", "gamma", "retrieval_temperature", "posterior_temperature",
                              "clip_eps", "turns", "turn_weight", "kl_coef", "update_period", "lr", "inner_steps",
                              "micro_batch_size"), "the retriever step replayed: what --variant varies"),
        "retrieval.index.verify": "checks the index files, changes no search",
        **dict.fromkeys(under("retrieval.encoder", "passage_batch_size", "query_batch_size"), "batching"),
        "retrieval.encoder.adapter": "the collection searches with a fresh adapter: the frozen retriever",
        **dict.fromkeys(under("run", "rounds", "continue_from", "output_dir", "ray_address", "call_timeout_s",
                              "driver_timeout_s", "autoscale_timeout_s", "max_learner_failures", "dashboard"),
                        "how and where a training run goes"),
    },
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=positive_int, default=128, help="train questions rolled out (all rounds)")
    parser.add_argument("--dev-questions", type=positive_int, default=64,
                        help="dev questions whose searches are the probe")
    parser.add_argument("--probe", metavar="FILE", help="the probe's question file (default: the world's dev split); "
                        "never a test split: settings are chosen on what this reports")
    add_out_argument(parser, "folder", "the logged turns and probe: collected here on first use, reused after",
                     flag="--rows", required=True, resumable=True,
                     overwrite="collect again into a --rows folder of other settings (or other files), and replace "
                     "an existing --out file")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=V[,KEY=V]",
                        help="a retriever step to replay: algorithm.retriever settings over the config's "
                        "(repeat; default: one variant, the config's own, unless --adapter is given)")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                        help="also probe a trained query adapter (a run's checkpoint, or its retriever_adapter "
                        "folder), paired against the frozen retriever: a real run's adapter on the same probe")
    parser.add_argument("--seeds", type=seed_list, default="0,1,2",
                        help="comma list: each permutes the questions into rounds")
    add_out_argument(parser, "file", "write the figures as JSON (and FILE.png, the curves)", metavar="FILE.json")
    add_config_arguments(parser)


def parse_variants(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``NAME:KEY=V,KEY=V`` -> (name, ``algorithm.retriever.KEY=V`` overrides); an empty list is the config's own."""
    variants: list[tuple[str, list[str]]] = []
    for spec in specs or ["config:"]:
        name, sep, settings = spec.partition(":")
        if not sep or not name:
            raise InputError(f"--variant {spec!r}: expected NAME:KEY=V[,KEY=V] (e.g. small:lr=3e-4,inner_steps=2)")
        pairs = [s for s in settings.split(",") if s]
        bad = [s for s in pairs if "=" not in s]
        if bad:
            raise InputError(f"--variant {spec!r}: {bad[0]!r} is not KEY=VALUE")
        if name in {n for n, _ in variants}:
            raise InputError(f"--variant {spec!r}: the name {name!r} is used twice")
        variants.append((name, [f"algorithm.retriever.{s}" for s in pairs]))
    return variants


def parse_adapters(specs: list[str]) -> list[tuple[str, Path]]:
    """``NAME=DIR`` -> (name, the adapter folder): DIR itself, or DIR/retriever_adapter (a checkpoint)."""
    adapters = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise InputError(f"--adapter {spec!r}: expected NAME=DIR")
        path = Path(folder)
        path = path / RETRIEVER_ADAPTER_DIR if (path / RETRIEVER_ADAPTER_DIR).is_dir() else path
        if not (path / "adapter_config.json").is_file():
            raise InputError(f"--adapter {spec!r}: {path} holds no adapter_config.json (a peft adapter)")
        adapters.append((name, path))
    return adapters


def run(args: argparse.Namespace) -> int:
    seeds = args.seeds
    specs = parse_variants(args.variant) if args.variant or not args.adapter else []  # --adapter alone: no replay
    variants = [(name, load_config(args.config, [*args.overrides, *extra])) for name, extra in specs]
    config = load_config(args.config, args.overrides)
    for name, cfg in variants:  # what the logged turns were collected with cannot vary between variants
        for key in ("num_candidates", "candidates"):
            if getattr(cfg.algorithm.retriever, key) != getattr(config.algorithm.retriever, key):
                raise InputError(f"--variant {name}: algorithm.retriever.{key} is fixed by the collection; "
                                 "set it as an override of the whole bench (and another --rows)")
    adapters = parse_adapters(args.adapter)  # checked before the collection, which takes minutes
    rows_dir = collected(config, Path(args.rows), args.questions, args.dev_questions, args.probe, args.overwrite)
    turns = read_jsonl(rows_dir / ROWS_FILE)
    probe = read_jsonl(rows_dir / PROBE_FILE)
    figures: dict[str, Any] = {
        "questions": len({t["uid"] for t in turns}),
        "turns": len(turns),
        "probe_questions": len(probe),
        "questions_per_round": config.rollout.questions_per_batch,
        "seeds": seeds,
        "signal": signal_figures(turns, config),
        "variants": [replay_variant(name, cfg, turns, probe, seeds) for name, cfg in variants],
        "adapters": probe_adapters(adapters, config, probe),
    }
    _print(figures)
    if args.out:  # the curves only where variants were replayed
        write_figures(args.out, figures, plot_replay if figures["variants"] else None)
    return 0


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collected(
    config: Config, rows: Path, questions: int, dev_questions: int, probe: str | None, overwrite: bool = False
) -> Path:
    """``rows``, holding the logged turns and the probe: built once (atomically) and reused; a folder collected
    with other settings, or holding other files, is refused rather than mixed or replaced, unless ``overwrite``
    (then it is collected again, replacing what is there)."""
    probe = str(Path(probe).resolve()) if probe else str(configured_world(config) / "dev.jsonl")
    if not Path(probe).is_file():
        raise InputError(f"--probe {probe}: not a file")
    if not load_questions([probe]):  # every line parsed now, not after the collection's rollouts
        raise InputError(f"--probe {probe}: holds no questions")
    key = collection_key(config, questions, dev_questions, probe)
    problem = _other_collection(rows, key)
    if problem is not None and not overwrite:
        raise InputError(f"--rows {rows}: {problem}; choose another --rows, or pass --overwrite to collect there "
                         "again")
    if problem is not None:
        print(f"note: --overwrite: collecting again into {rows} ({problem})", file=sys.stderr)
        (rows / MARKER).unlink(missing_ok=True)  # not a finished collection any more: rebuilt, then replaced
    return cached_directory(rows, lambda tmp: collect(config, tmp, questions, probe, dev_questions, key))


def _other_collection(rows: Path, key: str) -> str | None:
    """What makes ``rows`` other than this collection's folder (None: it is, or it is new or empty)."""
    names = sorted(p.name for p in rows.iterdir()) if rows.is_dir() else []
    if not names:
        return None
    if COLLECTION_FILE not in names:
        return f"holds files that are not a collection ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
    try:
        held = json.loads((rows / COLLECTION_FILE).read_text())
    except (ValueError, OSError) as e:
        return f"{rows / COLLECTION_FILE} is damaged ({e})"
    return None if held == {"key": key} else f"collected with other settings ({rows / COLLECTION_FILE})"


def collection_key(config: Config, questions: int, dev_questions: int, probe: str) -> str:
    """:data:`REPLAY_KEY` of a collection (the retriever step's own settings are not among its inputs). A warm-up's
    key reads its demonstrations' sources: with ``warmup.enabled``, the world and its index are built first."""
    warm = config.warmup.enabled
    return REPLAY_KEY.of(
        config, questions=questions, dev_questions=dev_questions, probe=probe,
        warmup=warmup_key(config, resolve_model_path(config.policy.model), warmup_sources(config)) if warm else None,
    )


def collect(config: Config, out: Path, questions: int, probe: str, dev_questions: int, key: str) -> None:
    """Roll out, score and probe with the frozen retriever (the production sampler in this process)."""
    policy = str(warmed_up_policy(config)) if config.warmup.enabled else config.policy.model
    train = train_questions(config)[:questions]
    dev = load_questions([probe])[:dev_questions]
    gold = {q.uid: [str(d) for d in q.metadata.get("gold_doc_ids", [])] for q in (*train, *dev)}
    grpo, per_round = config.algorithm.grpo, config.rollout.questions_per_batch
    sampler = local_sampler(config, policy=policy)
    lines: list[str] = []
    try:
        with Progress(len(train), "replay: rollouts and answer scores", "questions") as progress:
            for first in range(0, len(train), per_round):
                part = train[first : first + per_round]
                trajectories = sampler.rollout(part, grpo.rollouts_per_question, config.run.seed + first).trajectories
                answer_logp = sampler.score(trajectories).answer_logp
                rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
                advantages = group_advantages(rewards, [t.uid for t in trajectories], grpo.adv_eps,
                                              grpo.scale_adv_by_std)
                for t, scores, advantage in zip(trajectories, answer_logp, advantages.tolist(), strict=True):
                    for n, (turn, logp) in enumerate(zip(t.retrieval_turns, scores, strict=True)):
                        lines.append(json.dumps({
                            "uid": t.uid, "sample": t.sample_index, "turn": n, "last": n == len(t.retrieval_turns) - 1,
                            "query": turn.query, "doc_ids": list(turn.doc_ids), "scores": list(turn.scores),
                            "answer_logp": list(logp),
                            "advantage": advantage, "reward": t.reward, "gold": gold[t.uid],
                        }))
                progress.update(len(part))
        (out / ROWS_FILE).write_text("\n".join(lines) + "\n")
        greedy = sampler.greedy_agent.rollout(dev, 1)
    finally:
        sampler.client.close()
    (out / PROBE_FILE).write_text("".join(
        json.dumps({"uid": q.uid, "type": q.metadata.get("type"), "gold": gold[q.uid],
                    "queries": [turn.query for turn in t.retrieval_turns]}) + "\n"
        for q, t in zip(dev, greedy, strict=True)
    ))
    (out / COLLECTION_FILE).write_text(json.dumps({"key": key}))


def _print(figures: dict[str, Any]) -> None:
    s = figures["signal"]
    print(f"bench replay: {figures['questions']} train questions ({figures['turns']} retrieval turns, "
          f"{figures['questions_per_round']} questions a round), {figures['probe_questions']} dev questions' "
          f"fixed searches, seeds {figures['seeds']}")
    print(f"  logged signal: gold among the k candidates in {s['turns_gold_in_k']:.1f}% of turns; of those, the "
          f"answer posterior ranks gold first in {s['posterior_gold_first']:.1f}%; weight on such turns: uniform "
          f"{s['uniform_weight_on_gold_first']:.1f}%, evidence {s['evidence_weight_on_gold_first']:.1f}%")
    rows = [[v["name"], " ".join(f"{r:.1f}" for r in v["recall_per_round"]),
             f"{v['diff_recall']:+.1f} [{v['ci_low']:+.1f}, {v['ci_high']:+.1f}]", v["interval"]]
            for v in figures["variants"]]
    rows += [[f"adapter {a['name']}", f"{a['recall']:.1f}",
              f"{a['diff_recall']:+.1f} [{a['ci_low']:+.1f}, {a['ci_high']:+.1f}]", "questions"]
             for a in figures["adapters"]]
    print("\n".join(markdown_table(["variant", "recall per round (mean over seeds)", "last − frozen [95% CI]",
                                    "interval over"], rows, "llll")))
