"""``bridge-ray bench world``: is a bundled world a testbed where a trained retriever can win? Its calibration gates.

On the held-out split (``test``; ``--split dev`` for choosing settings, which the test split must never
decide), with the frozen retriever (the base encoder, no adapter):

- ``frozen_recall_at_m`` / ``frozen_recall_at_k``: the share of gold passages among the m passages shown /
  the k candidates of any of the question's searches (m = ``num_shown``, k = ``num_candidates``);
- ``frozen_em`` / ``oracle_em``: greedy EM of the warm-up policy with the frozen retriever, and with the
  gold passages shown at every search (``eval.oracle_retrieval``).

The searches are the warm-up policy's own (``--queries policy``: trained on first use, ~25 min on 2 cores,
then cached) or the gold searches its demonstrations issue (``--queries gold``: no policy, so both EMs are
null). Gates from the literature (README, "The gap world"): recall@m in 30-60, recall@k >= 90, oracle EM -
frozen EM >= 15. Figures are percentages. ``by_type`` splits both recalls by question type, and a two-hop
question's by hop: a second hop searched from a first hop the frozen retriever did not show names the wrong
entity, which no k reaches.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bridge_ray.agent.demonstrations import gold_queries
from bridge_ray.agent.outcomes import question_outcome
from bridge_ray.cli import add_config_arguments, add_out_argument
from bridge_ray.cli_types import positive_int
from bridge_ray.config import Config, derive, load_config
from bridge_ray.coordinator.inputs import configured_world, starting_retriever
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.errors import InputError
from bridge_ray.reporting.figures import write_figures
from bridge_ray.train import local_eval
from bridge_ray.train.local_eval import local_sampler
from bridge_ray.warmup import trainer as warmup

RECALL_AT_M = (30.0, 60.0)
MIN_RECALL_AT_K = 90.0
MIN_ORACLE_GAP = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world", choices=["default", "gap"], default="gap", help="data.world to measure")
    parser.add_argument(
        "--queries", choices=["policy", "gold"], default="policy",
        help="policy: the warm-up policy's searches (and EM); gold: the demonstrations' gold searches, no EM",
    )
    parser.add_argument("--split", choices=["test", "dev"], default="test",
                        help="the held-out split measured: test (the calibration) or dev (to choose settings on)")
    parser.add_argument("--max-questions", type=positive_int, help="first N questions of the split (default: all)")
    add_out_argument(parser, "file", "also write the figures as JSON")
    add_config_arguments(parser)
    parser.set_defaults(config="jobs/configs/local_cpu.yaml")


def gates(figures: dict[str, Any]) -> dict[str, bool | None]:
    """Each gate's verdict; None where a figure it needs is null (EM without a policy)."""
    recall_m, recall_k = figures["frozen_recall_at_m"], figures["frozen_recall_at_k"]
    frozen, oracle = figures["frozen_em"], figures["oracle_em"]
    return {
        "frozen_recall_at_m_in_30_60": RECALL_AT_M[0] <= recall_m <= RECALL_AT_M[1],
        "frozen_recall_at_k_at_least_90": recall_k >= MIN_RECALL_AT_K,
        "oracle_em_minus_frozen_em_at_least_15": None if frozen is None or oracle is None
        else oracle - frozen >= MIN_ORACLE_GAP,
    }


def recall_at(gold: Sequence[Sequence[str]], searched: Sequence[Sequence[Sequence[str]]], depth: int) -> float:
    """Percent of gold passages among the first ``depth`` results of any search of their question.

    ``gold[i]``: question i's gold ids; ``searched[i]``: its searches' ranked ids (as strings)."""
    found = total = 0
    for ids, searches in zip(gold, searched, strict=True):
        top = {d for ranked in searches for d in ranked[:depth]}
        found += sum(d in top for d in ids)
        total += len(ids)
    return 100.0 * found / total


def recall_by_type(
    types: Sequence[str], gold: Sequence[Sequence[str]], searched: Sequence[Sequence[Sequence[str]]], m: int, k: int
) -> dict[str, dict[str, float | int]]:
    """:func:`recall_at` at depths m and k per question type, and per hop of the two-hop questions (gold ids
    are in hop order): ``{group: {"questions", "recall_at_m", "recall_at_k"}}``."""
    groups: dict[str, tuple[list[Sequence[str]], list[Sequence[Sequence[str]]]]] = {}

    def add(group: str, ids: Sequence[str], searches: Sequence[Sequence[str]]) -> None:
        golds, searches_of = groups.setdefault(group, ([], []))
        golds.append(ids)
        searches_of.append(searches)

    for kind, ids, searches in zip(types, gold, searched, strict=True):
        add(kind, ids, searches)
        if kind == "two_hop":
            for hop, doc in enumerate(ids, start=1):
                add(f"two_hop/hop{hop}", [doc], searches)
    return {
        group: {"questions": len(golds), "recall_at_m": recall_at(golds, searches, m),
                "recall_at_k": recall_at(golds, searches, k)}
        for group, (golds, searches) in sorted(groups.items())
    }


def run(args: argparse.Namespace) -> int:
    if args.max_questions is not None and args.max_questions < 1:
        raise InputError(f"--max-questions {args.max_questions}: must be at least 1")
    config = load_config(args.config, [*args.overrides, f"data.world={args.world}"])
    held_out = str(configured_world(config) / f"{args.split}.jsonl")
    questions = load_questions([held_out])[: args.max_questions]
    gold = [[str(d) for d in q.metadata["gold_doc_ids"]] for q in questions]
    if args.queries == "gold":
        searched, frozen_em, oracle_em = _gold_searches(config, questions), None, None
    else:
        searched, frozen_em, oracle_em = _policy_searches(config, questions, held_out)
    k, m = config.algorithm.retriever.num_candidates, config.algorithm.retriever.num_shown
    figures: dict[str, Any] = {
        "world": args.world,
        "queries": args.queries,
        "split": args.split,
        "questions": len(questions),
        "m": m,
        "k": k,
        "frozen_recall_at_m": recall_at(gold, searched, m),
        "frozen_recall_at_k": recall_at(gold, searched, k),
        "frozen_em": frozen_em,
        "oracle_em": oracle_em,
        "by_type": recall_by_type([str(q.metadata.get("type", "all")) for q in questions], gold, searched, m, k),
    }
    figures["gates"] = gates(figures)
    _print(figures)
    if args.out:
        write_figures(args.out, figures)
    return 0


def _gold_searches(config: Config, questions: list[QuestionRecord]) -> list[list[list[str]]]:
    """Per question, the k ranked ids of each gold search (:func:`~bridge_ray.agent.demonstrations.gold_queries`)."""
    client = starting_retriever(config)
    try:
        per_question = [
            gold_queries(q, client.passages([int(d) for d in q.metadata["gold_doc_ids"]])) for q in questions
        ]
        hits, _ = client.search([query for queries in per_question for query in queries], client.num_candidates)
    finally:
        client.close()
    ranked = iter([[str(d) for d in row] for row in hits.ids.tolist()])
    return [[next(ranked) for _ in queries] for queries in per_question]


def _policy_searches(
    config: Config, questions: list[QuestionRecord], held_out: str
) -> tuple[list[list[list[str]]], float, float]:
    """The warm-up policy's searches with the frozen retriever, its EM there, and its EM with the oracle
    (``eval.oracle_retrieval``, on the same questions of ``held_out``)."""
    policy = str(warmup.warmed_up_policy(config))
    sampler = local_sampler(config, policy=policy)
    try:
        trajectories = sampler.greedy_agent.rollout(questions, 1)
    finally:
        sampler.client.close()
    searched = [[[str(d) for d in turn.doc_ids] for turn in t.retrieval_turns] for t in trajectories]
    frozen_em = 100.0 * sum(question_outcome(q, t).em for q, t in zip(questions, trajectories, strict=True))
    oracle = derive(config, {"eval.oracle_retrieval": True, "eval.max_questions": len(questions)},
                    source="bench world's oracle evaluation")
    table = local_eval.evaluate_policy(oracle, {"world": held_out}, policy=policy)
    return searched, frozen_em / len(questions), table.rows[0].em


def _print(figures: dict[str, Any]) -> None:
    def pct(value: float | None) -> str:
        return "null" if value is None else f"{value:.1f}"

    m, k = figures["m"], figures["k"]
    print(f"bench world: {figures['world']} world, {figures['split']} split, {figures['questions']} questions, "
          f"{figures['queries']} queries, frozen retriever")
    print(f"  recall@{m} {pct(figures['frozen_recall_at_m'])}  recall@{k} {pct(figures['frozen_recall_at_k'])}  "
          f"EM frozen {pct(figures['frozen_em'])}  EM oracle {pct(figures['oracle_em'])}")
    for group, row in figures["by_type"].items():
        print(f"    {group:<13} {row['questions']:>4} questions  recall@{m} {pct(row['recall_at_m'])}  "
              f"recall@{k} {pct(row['recall_at_k'])}")
    labels = {
        "frozen_recall_at_m_in_30_60": f"frozen recall@{m} in [30, 60]",
        "frozen_recall_at_k_at_least_90": f"frozen recall@{k} >= 90",
        "oracle_em_minus_frozen_em_at_least_15": "oracle EM - frozen EM >= 15",
    }
    for name, verdict in figures["gates"].items():
        word = "n/a (no policy: --queries gold)" if verdict is None else ("pass" if verdict else "FAIL")
        print(f"  gate {labels[name]}: {word}")
