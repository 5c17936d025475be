"""``bridge-ray bench retrieval``: the retrieval figures: recall, encoding and search throughput.

1. recall@1/3/10 of the gold passage(s) for the frozen default encoder (MiniLM) on the default world,
   per question type and per hop (each hop's passage retrieved from the question alone);
2. passage-encoding throughput of the default encoder (passages/s, model time only);
3. search throughput (queries/s) through K shard-holder actors vs one in-process FAISS index over the
   same N random unit vectors, and their ratio, measured in this one run (exactness checked too);
4. ``adapt``: is the world learnable? The query LoRA is trained for a few steps on train questions with
   the gold first-hop passage as target (NLL of the retriever distribution over the k logged candidates,
   ``algo.retriever``), and first-hop recall on dev + test is measured before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import ray
import torch

from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.cli import add_out_argument
from bridge_ray.cli_types import name_list, positive_float, positive_int
from bridge_ray.config import load_config
from bridge_ray.data.world import SPLITS, default_world_dir, load_split
from bridge_ray.reporting.figures import write_figures
from bridge_ray.retrieval.build import build_index
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import PassageEncoder, QueryEncoder
from bridge_ray.shard_holder.group import start_shard_holders

PARTS = ("recall", "adapt", "throughput")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", type=name_list(PARTS), default="recall,adapt,throughput",
                        help="comma list of: recall, adapt, throughput")
    parser.add_argument("--vectors", type=positive_int, default=1_000_000,
                        help="random unit vectors in the search index")
    parser.add_argument("--dim", type=positive_int, default=384)
    parser.add_argument("--shards", type=positive_int, default=2, help="K shard-holder actors")
    parser.add_argument("--shard-cpus", type=positive_float, default=1.0, help="CPUs per shard-holder actor")
    parser.add_argument("--queries", type=positive_int, default=512, help="queries searched per configuration")
    parser.add_argument("--query-batch", type=positive_int, default=64, help="queries per search call (one agent turn)")
    parser.add_argument("-k", type=positive_int, default=40,
                        help="candidates per query (algorithm.retriever.num_candidates)")
    parser.add_argument("--adapt-steps", type=positive_int, default=60, help="LoRA steps of the learnability check")
    parser.add_argument("--adapt-lr", type=positive_float, default=1e-3)
    add_out_argument(parser, "folder", "keep the indexes it builds here (default: a temporary folder, "
                     "removed)", flag="--work-dir", resumable=True)
    add_out_argument(parser, "file", "also write the figures of every part run as JSON", metavar="FILE.json")


def run(args: argparse.Namespace) -> int:
    parts = set(args.parts)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, object] = {}
    try:
        if parts & {"recall", "adapt"}:
            client, world, figures["passage_encoding"] = default_world_client(work / "world-index")
            if "recall" in parts:
                figures["recall"] = frozen_recall(client, world)
            if "adapt" in parts:
                figures["adapt"] = adapt(client, world, args.adapt_steps, args.adapt_lr)
        if "throughput" in parts:
            figures["throughput"] = search_throughput(work / "random-index", args)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.out:
        write_figures(args.out, figures)
    return 0


def default_world_client(index_dir: Path):
    """A fresh-LoRA client of the default world indexed with the default encoder, the world, and the
    encoding's figures (empty when the index was already built)."""
    cfg = load_config().retrieval
    spec = cfg.encoder.spec()
    world = default_world_dir()
    encoder = PassageEncoder(spec, device="cpu", batch_size=cfg.encoder.passage_batch_size)
    spent = {"seconds": 0.0, "passages": 0}

    def timed_embed(passages):
        start = time.perf_counter()
        out = encoder.embed_passages(passages)
        spent["seconds"] += time.perf_counter() - start
        spent["passages"] += len(passages)
        return out

    build_index(
        world / "corpus.jsonl",
        index_dir,
        timed_embed,
        encoder=spec.to_dict(),
        dim=encoder.dim,
        batch_size=1024,
        progress=False,
    )
    encoding = {}
    if spent["passages"]:
        encoding = {"passages": spent["passages"], "seconds": spent["seconds"], "threads": torch.get_num_threads(),
                    "passages_per_s": spent["passages"] / spent["seconds"]}
        print(
            f"passage encoding ({spec.model}, CPU, {torch.get_num_threads()} threads, batch "
            f"{cfg.encoder.passage_batch_size}): {encoding['passages_per_s']:.1f} passages/s "
            f"({spent['passages']} passages in {spent['seconds']:.1f} s)"
        )
    return RetrieverClient.from_index(QueryEncoder.from_config(cfg), index_dir), world, encoding  # fresh LoRA


def frozen_recall(client, world: Path) -> dict[str, dict[str, list[float]]]:
    """Recall@1/3/10 per question type and hop: ``{type: {hop: [R@1, R@3, R@10]}}``."""
    questions = [q for split in SPLITS for q in load_split(world, split)]
    hits, _ = client.search([q["question"] for q in questions], 10)
    print(
        f"\nrecall of gold passages, frozen {client.encoder.spec.model}, default world ({client.num_passages} "
        f"passages, {len(questions)} questions of train+dev+test)"
    )
    print(f"{'type':<11} {'hop':<5} {'n':>5} {'R@1':>6} {'R@3':>6} {'R@10':>6}")
    by_type: dict[str, list[tuple[list[int], list[int]]]] = {}
    figures: dict[str, dict[str, list[float]]] = {}
    for i, q in enumerate(questions):
        gold = [int(d) for d in q["metadata"]["gold_doc_ids"]]
        by_type.setdefault(q["metadata"]["type"], []).append((gold, hits.ids[i].tolist()))
    for qtype, rows in sorted(by_type.items()):
        hops = len(rows[0][0])
        labels = [(f"{h + 1}", lambda gold, got, k, h=h: gold[h] in got[:k]) for h in range(hops)]
        if hops > 1:
            labels.append(("all", lambda gold, got, k: all(g in got[:k] for g in gold)))
        for label, hit in labels:
            rec = [sum(hit(g, got, k) for g, got in rows) / len(rows) for k in (1, 3, 10)]
            figures.setdefault(qtype, {})[label] = rec
            print(f"{qtype:<11} {label:<5} {len(rows):>5} {rec[0]:>6.3f} {rec[1]:>6.3f} {rec[2]:>6.3f}")
    return figures


def adapt(client, world: Path, steps: int, lr: float, batch_size: int = 32) -> dict[str, float]:
    train = [(q["question"], int(q["metadata"]["gold_doc_ids"][0])) for q in load_split(world, "train")]
    held_out = [
        (q["question"], int(q["metadata"]["gold_doc_ids"][0])) for s in ("dev", "test") for q in load_split(world, s)
    ]

    def recall() -> tuple[float, float]:
        hits, _ = client.search([q for q, _ in held_out], 3)
        got = hits.ids.tolist()
        return (
            float(np.mean([g == h[0] for (_, g), h in zip(held_out, got, strict=True)])),
            float(np.mean([g in h for (_, g), h in zip(held_out, got, strict=True)])),
        )

    encoder, rng = client.encoder, random.Random(0)
    before = recall()
    optimizer = torch.optim.Adam(encoder.trainable_parameters(), lr=lr)
    start = time.perf_counter()
    for _ in range(steps):
        batch = rng.sample(train, batch_size)
        logged = [
            (r, gold)
            for r, (_, gold) in zip(client.retrieve([q for q, _ in batch]), batch, strict=True)
            if gold in r.doc_ids
        ]
        scores = torch.einsum(
            "bd,bkd->bk",
            encoder.encode_queries([r.query for r, _ in logged]),
            client.doc_embeddings([r.doc_ids for r, _ in logged]),
        )
        target = torch.tensor([r.doc_ids.index(gold) for r, gold in logged])
        loss = -retrieval_log_probs(scores).gather(1, target[:, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = recall()
    seconds = time.perf_counter() - start
    print(
        f"\nlearnability: query LoRA (rank {encoder.model.peft_config['default'].r}) trained {steps} steps x "
        f"{batch_size} train questions on the gold first-hop passage (lr {lr:g}, {seconds:.0f} s)"
    )
    print(
        f"  first-hop recall on dev+test ({len(held_out)} questions): R@1 {before[0]:.3f} -> {after[0]:.3f}, "
        f"R@3 {before[1]:.3f} -> {after[1]:.3f}"
    )
    return {"steps": steps, "seconds": seconds, "held_out": len(held_out), "r1_before": before[0],
            "r1_after": after[0], "r3_before": before[1], "r3_after": after[1]}


def search_throughput(index_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    n, dim, k = args.vectors, args.dim, args.k
    corpus = index_dir.parent / "random-corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": str(i), "contents": f"doc {i}\nrandom unit vector {i}"}) + "\n")
    rng = np.random.default_rng(0)

    def random_unit(count: int) -> np.ndarray:
        v = rng.standard_normal((count, dim), dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    start = time.perf_counter()
    manifest = build_index(
        corpus,
        index_dir,
        lambda batch: random_unit(len(batch)),
        encoder={"model": "random-unit"},
        dim=dim,
        num_shards=args.shards,
        batch_size=65536,
        progress=False,
    )
    print(
        f"\nsearch throughput: {n} random unit vectors, dim {dim}, flat inner product, k {k}, "
        f"{args.queries} queries in batches of {args.query_batch} "
        f"(index written in {time.perf_counter() - start:.0f} s)"
    )
    queries = random_unit(args.queries)
    batches = [queries[i : i + args.query_batch] for i in range(0, len(queries), args.query_batch)]

    single = faiss.IndexFlatIP(dim)
    for shard in manifest.shards:
        single.add(np.ascontiguousarray(np.load(manifest.shard_dir(index_dir, shard.id) / "embeddings.npy")))
    single.search(batches[0], k)  # warm-up
    start = time.perf_counter()
    reference = [single.search(b, k)[1] for b in batches]
    in_process = len(queries) / (time.perf_counter() - start)
    del single

    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, int(args.shards * args.shard_cpus)),
        include_dashboard=False,
        object_store_memory=500_000_000,
        log_to_driver=False,
    )
    try:
        shards = ShardSet(start_shard_holders(index_dir, num_cpus=args.shard_cpus))
        shards.search(batches[0], k)  # warm-up
        start = time.perf_counter()
        merged = [shards.search(b, k).ids for b in batches]
        actors = len(queries) / (time.perf_counter() - start)
    finally:
        ray.shutdown()
    exact = all(np.array_equal(np.sort(a, axis=1), np.sort(b, axis=1)) for a, b in zip(reference, merged, strict=True))
    print(f"  one in-process FAISS index ({faiss.omp_get_max_threads()} threads): {in_process:8.1f} queries/s")
    print(f"  {args.shards} shard-holder actors ({args.shard_cpus:g} CPU each) + merge: {actors:8.1f} queries/s")
    print(f"  ratio actors / in-process: {actors / in_process:.2f}   merged top-{k} == single-index top-{k}: {exact}")
    return {"vectors": n, "dim": dim, "k": k, "shards": args.shards, "in_process_qps": in_process,
            "actors_qps": actors, "ratio": actors / in_process, "exact": exact}
