"""Retriever steps replayed on logged rollouts, the policy held fixed: a grid of retriever-step variants
(``algorithm.retriever`` settings) × seeds, each seed ordering the logged questions into rounds, a fresh query LoRA
taking the production update (:class:`~bridge_ray.retriever_learner.update.RetrieverUpdater`) round by round, with
``η_old`` re-scored at the adapter the round starts from, as a sampler serving it would have logged.

After every round the probe's fixed searches (a policy's greedy searches of held-out questions) are ranked again:
the gold recall of the top m of each question's searches, so no policy noise enters the comparison, and the last
round is paired against the frozen retriever question by question. ``bench replay`` collects the logged turns and
the probe (``turns``: one retrieval turn a row, with its candidates, their scores and answer log-likelihoods, its
advantage and its question's gold passages; ``probe``: one question a row, its gold passages and searches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from bridge_ray.algo.rag import answer_posterior, evidence_turn_weights
from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.config import Config
from bridge_ray.coordinator.inputs import index_shards
from bridge_ray.evaluation.paired import paired_difference
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder, adapter_init_seed
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater


def signal_figures(turns: list[dict[str, Any]], config: Config) -> dict[str, float]:
    """Where the logged RAG signal points, at the frozen retriever that logged it: of the turns whose k candidates
    hold a gold passage, the share whose answer posterior (eq. app_retrieval_credit's weights) ranks a gold passage
    first; and the share of the uniform and of the evidence turn weights (over all turns) on turns where it does."""
    objective = config.algorithm.retriever
    batch = logged_batch(turns, None)
    log_rho = retrieval_log_probs(batch.old_scores, objective.retrieval_temperature, batch.candidate_mask)
    posterior = answer_posterior(log_rho, batch.answer_logp, objective.posterior_temperature, batch.candidate_mask)
    gold_in_k = torch.tensor([any(str(d) in t["gold"] for d in t["doc_ids"]) for t in turns])
    top = posterior.argmax(dim=-1).tolist()
    gold_first = torch.tensor([str(t["doc_ids"][i]) in t["gold"] for t, i in zip(turns, top, strict=True)])
    evidence = evidence_turn_weights(log_rho, batch.answer_logp, batch.candidate_mask)
    return {
        "turns_gold_in_k": 100.0 * float(gold_in_k.float().mean()),
        "posterior_gold_first": 100.0 * float(gold_first[gold_in_k].float().mean()) if bool(gold_in_k.any()) else 0.0,
        "uniform_weight_on_gold_first": 100.0 * float(gold_first.float().mean()),
        "evidence_weight_on_gold_first": 100.0 * float(evidence[gold_first].sum()),
    }


def logged_batch(turns: list[dict[str, Any]], old_scores: torch.Tensor | None):
    """The turns as a :class:`~bridge_ray.retriever_learner.update.RetrieverBatch`, with ``old_scores`` [M, K] as
    η_old's scores (default: the scores logged at collection, the frozen retriever's)."""
    batch = RetrieverBatch.from_turns(
        [t["query"] for t in turns], [t["doc_ids"] for t in turns], [t["scores"] for t in turns],
        [t["answer_logp"] for t in turns], [t["advantage"] for t in turns],
    )
    if old_scores is not None:
        batch.old_scores = torch.where(batch.candidate_mask, old_scores, torch.zeros_like(old_scores))
    return batch


def replay_variant(
    name: str, config: Config, turns: list[dict[str, Any]], probe: list[dict[str, Any]], seeds: list[int]
) -> dict[str, Any]:
    """One variant's curves over ``seeds``, and its last round − the frozen retriever on the probe, paired."""
    shards = index_shards(config)
    try:
        per_seed = [replay_seed(config, shards, turns, probe, seed) for seed in seeds]
    finally:
        shards.close()
    curves = np.array([[np.mean(r) for r in rounds] for rounds in per_seed])  # [seeds, rounds + 1]
    print(f"replay: {name}: recall per round {' '.join(f'{r:.1f}' for r in curves.mean(axis=0))}", flush=True)
    paired = paired_difference([rounds[-1] for rounds in per_seed], [rounds[0] for rounds in per_seed])
    types = sorted({str(q["type"]) for q in probe})
    last_by_type = {
        kind: float(np.mean([[r for r, q in zip(rounds[-1], probe, strict=True) if str(q["type"]) == kind]
                             for rounds in per_seed]))
        for kind in types
    }
    return {
        "name": name,
        "retriever": config.algorithm.retriever.model_dump(mode="json"),
        "recall_per_round": curves.mean(axis=0).tolist(),
        "recall_per_round_by_seed": curves.tolist(),
        "last_by_type": last_by_type,
        "frozen_by_type": {
            kind: float(np.mean([r for r, q in zip(per_seed[0][0], probe, strict=True) if str(q["type"]) == kind]))
            for kind in types
        },
        "diff_recall": paired.diff, "ci_low": paired.ci_low, "ci_high": paired.ci_high, "interval": paired.interval,
    }


def probe_adapters(adapters: list[tuple[str, Path]], config: Config, probe: list[dict[str, Any]]) -> list[dict]:
    """Each trained adapter's probe recall, paired against the frozen retriever's (ranked once) on the same
    searches."""
    if not adapters:
        return []
    objective = config.algorithm.retriever
    shards = index_shards(config)

    def recall(adapter: Path | None) -> list[float]:
        client = RetrieverClient(QueryEncoder.from_config(config.retrieval, adapter), shards,
                                 num_candidates=objective.num_candidates, num_shown=objective.num_shown,
                                 candidates=objective.candidates)
        return probe_recall(client, probe)

    rows = []
    try:
        frozen = recall(None)
        for name, path in adapters:
            trained = recall(path)
            paired = paired_difference([trained], [frozen])
            rows.append({"name": name, "path": str(path), "recall": sum(trained) / len(probe),
                         "diff_recall": paired.diff, "ci_low": paired.ci_low, "ci_high": paired.ci_high,
                         "recall_per_question": trained})  # in probe order: two adapters pair up question by question
    finally:
        shards.close()
    return rows


def replay_seed(config: Config, shards, turns: list[dict[str, Any]], probe: list[dict[str, Any]], seed: int):
    """Per round (0 = the frozen retriever), every probe question's gold recall@m: ``seed`` orders the questions
    into rounds, seeds the adapter's initialisation and the update's dropout."""
    objective = config.algorithm.retriever
    torch.manual_seed(adapter_init_seed(seed))
    encoder = QueryEncoder.from_config(config.retrieval, None, init_seed=adapter_init_seed(seed))
    client = RetrieverClient(encoder, shards, num_candidates=objective.num_candidates, num_shown=objective.num_shown,
                             candidates=objective.candidates)
    updater = RetrieverUpdater(encoder, client.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size)
    uids = list(dict.fromkeys(t["uid"] for t in turns))
    order = [uids[i] for i in np.random.default_rng(seed).permutation(len(uids))]
    per_round = config.rollout.questions_per_batch
    rounds = [probe_recall(client, probe)]
    for first in range(0, len(order), per_round):
        chosen = set(order[first : first + per_round])
        rows = [t for t in turns if t["uid"] in chosen and (objective.turns == "all" or t["last"])]
        if rows:
            updater.step(logged_batch(rows, current_scores(encoder, client, rows)))
        rounds.append(probe_recall(client, probe))
    return rounds


def current_scores(encoder, client: RetrieverClient, rows: list[dict[str, Any]]) -> torch.Tensor:
    """``s_η(h, d)`` [M, K] of the rows' candidates at the adapter now: what a sampler serving it would log."""
    k = max(len(t["doc_ids"]) for t in rows)
    ids = torch.tensor([t["doc_ids"] + [0] * (k - len(t["doc_ids"])) for t in rows])
    with torch.no_grad():
        queries = encoder.encode_queries([t["query"] for t in rows])
        return torch.einsum("md,mkd->mk", queries, client.doc_embeddings(ids).float().to(queries.device)).cpu()


def probe_recall(client: RetrieverClient, probe: list[dict[str, Any]]) -> list[float]:
    """Per probe question, the percent of its gold passages among the top m of any of its (fixed) searches."""
    queries = [query for q in probe for query in q["queries"]]
    hits = client.search(queries, client.num_candidates)[0] if queries else None
    ranked = iter([[str(d) for d in row[: client.num_shown]] for row in hits.ids.tolist()] if hits else [])
    recalls = []
    for q in probe:
        found = {d for _ in q["queries"] for d in next(ranked)}
        recalls.append(100.0 * sum(d in found for d in q["gold"]) / len(q["gold"]) if q["gold"] else 0.0)
    return recalls


