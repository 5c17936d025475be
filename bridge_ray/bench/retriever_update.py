"""``bridge-ray bench retriever-update``: Fig. 2b — peak memory and time of one η update, BRIDGE vs two-state.

Every variant runs in a process of its own, as the retriever learner does, on the same batch: ``--turns``
train questions of the configured world as the retrieval turns' queries, their top k under η_0 from the
configured index as the logged candidates. The update's cost does not depend on the values of the answer
log-likelihoods and advantages, so they are drawn from a seeded generator instead of scored by a policy.

- ``bridge``: one η_γ update (``retriever.update.RetrieverUpdater``);
- ``drop``: the same η update (Drop differs from BRIDGE in θ only), measured again as a control;
- ``two_state``: the η_γ update plus η*'s (``retriever.two_state.LowerLevelState``): a second adapter and
  optimizer, its own retrieval log (a search with η*'s queries) and an update on ``L_RAG`` alone.

Peak memory is the process's peak on CPU (``VmHWM``, and the same above the process before any encoder was
built; not ``ru_maxrss``, which a spawned child inherits from its parent's peak across ``exec``) and
``torch.cuda.max_memory_allocated`` on CUDA. ``update_bytes`` is what the η update itself adds on top of its
inputs (the index, the base encoder and the batch, already in memory): its adapters and optimizers, η*'s
encoder and search, the activations and gradients, at their peak over the warm-up and the timed updates (on
CPU the peak resident set, reset with ``/proc/self/clear_refs``; on CUDA the peak allocated memory). On a
cluster the index lives on the shard holders, not in the retriever learner, so this is the part of the
learner's memory that differs between estimators. Time is the mean of ``--repeats`` updates after one warm-up
update.
"""

from __future__ import annotations

import argparse
import time

import torch

from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.cli_types import positive_int
from bridge_ray.coordinator.inputs import index_shards, train_questions
from bridge_ray.fresh_process import in_fresh_process
from bridge_ray.reporting.figures import plot_retriever_update, write_figures, wrote
from bridge_ray.reporting.measures import reset_peak_memory, status_bytes
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.two_state import LowerLevelState
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater

VARIANTS = ("bridge", "drop", "two_state")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--turns", type=positive_int, default=64, help="retrieval turns in the batch")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed updates after one warm-up update")
    add_out_argument(parser, "file", "figures as JSON; a bar chart is written beside it (.png)",
                     required=True, metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    figures = {}
    for variant in VARIANTS:  # a fresh process per variant: its peak is its own
        figures[variant] = in_fresh_process(measure, config, variant, args.turns, args.repeats)
        f = figures[variant]
        print(f"{variant:9s} peak {f['peak_bytes'] / 2**20:8.1f} MiB (above start "
              f"{f['peak_above_start_bytes'] / 2**20:7.1f} MiB; the update's own {f['update_bytes'] / 2**20:7.1f} "
              f"MiB), {f['seconds']:.3f} s per update", flush=True)
    bridge, two = figures["bridge"], figures["two_state"]
    keys = ("peak_bytes", "peak_above_start_bytes", "update_bytes", "seconds")
    figures["ratios"] = r = {key: bridge[key] / two[key] for key in keys}
    print(f"BRIDGE / two-state: peak {r['peak_bytes']:.2f}x (above start {r['peak_above_start_bytes']:.2f}x, "
          f"the update's own {r['update_bytes']:.2f}x), time {r['seconds']:.2f}x")
    wrote(write_figures(args.out, figures, lambda figures, png: plot_retriever_update(figures, png, VARIANTS)))
    return 0


def measure(config, variant: str, turns: int, repeats: int) -> dict[str, float]:
    """Peak memory and mean seconds of ``variant``'s η update, in this (fresh) process."""
    if config.roles.torch_threads:
        torch.set_num_threads(config.roles.torch_threads)
    cuda = torch.cuda.is_available()
    start_rss = status_bytes("VmHWM")
    objective = config.algorithm.retriever
    shards = index_shards(config)
    encoder = QueryEncoder.from_config(config.retrieval, device="cuda" if cuda else "cpu")
    client = RetrieverClient(encoder, shards, num_candidates=objective.num_candidates, num_shown=objective.num_shown)
    queries = [q.question for q in train_questions(config)[:turns]]
    logged = client.retrieve(queries)
    generator = torch.Generator().manual_seed(config.run.seed)
    answer_logp = -torch.rand(len(queries), objective.num_candidates, generator=generator) * 5
    advantages = torch.randn(len(queries), generator=generator)
    batch = RetrieverBatch.from_turns(
        queries, [r.doc_ids for r in logged], [r.scores for r in logged], answer_logp.tolist(), advantages.tolist()
    )
    inputs_peak = 0 if cuda else status_bytes("VmHWM")  # the process peak so far; the reset below drops it
    resident = reset_peak_memory(cuda)  # the inputs are in memory; what follows is the update's own
    penalized = RetrieverUpdater(encoder, shards.doc_embeddings, objective, micro_batch_size=objective.micro_batch_size)
    lower = (
        LowerLevelState(config.retrieval, objective, shards, device="cuda" if cuda else "cpu")
        if variant == "two_state" else None
    )

    def update() -> None:
        penalized.step(batch)
        if lower is not None:
            lower.step(queries, answer_logp.tolist(), advantages.tolist())

    update()  # warm-up: lazily built optimizer state and kernels
    if cuda:
        torch.cuda.synchronize()
    update_peak = torch.cuda.max_memory_allocated() if cuda else status_bytes("VmHWM")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    for _ in range(repeats):
        update()
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - began) / repeats
    peak = torch.cuda.max_memory_allocated() if cuda else max(inputs_peak, status_bytes("VmHWM"))
    update_peak = max(update_peak, peak if cuda else status_bytes("VmHWM"))
    return {"peak_bytes": float(peak), "peak_above_start_bytes": float(peak - (0 if cuda else start_rss)),
            "update_bytes": float(update_peak - resident), "seconds": seconds, "turns": float(len(queries)),
            "device": "cuda" if cuda else "cpu"}
