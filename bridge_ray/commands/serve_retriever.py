"""``bridge-ray serve-retriever``: the Search-R1-compatible ``POST /retrieve`` over a built index."""

from __future__ import annotations

import argparse
import sys

from bridge_ray.cli import add_config_arguments, config_from_args

HELP = "serve an index (optionally with a trained query adapter) over HTTP in the Search-R1 format"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", required=True, metavar="DIR", help="index directory (retrieval.index.dir)")
    parser.add_argument("--adapter", metavar="DIR", help="peft query adapter (adapter_config.json + safetensors)")
    parser.add_argument("--host", help="bind address (retrieval.server.host, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (retrieval.server.port)")
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve the shards from shard-holder actors (joins RAY_ADDRESS, else starts Ray locally)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(
        args,
        {
            "retrieval.index.dir": args.index,
            "retrieval.server.host": args.host,
            "retrieval.server.port": args.port,
        },
    )
    import uvicorn

    from bridge_ray.retrieval.client import RetrieverClient, ShardSet
    from bridge_ray.retrieval.encoder import QueryEncoder
    from bridge_ray.retrieval.manifest import IndexMismatchError
    from bridge_ray.retrieval.server import ServerLimits, create_app

    r = cfg.retrieval
    try:
        encoder = QueryEncoder.from_config(r, adapter_dir=args.adapter)
        if args.ray:
            import ray

            from bridge_ray.actors.shard_holder import start_shard_holders

            ray.init()
            shards = ShardSet(
                start_shard_holders(
                    r.index.dir,
                    encoder.spec,
                    num_cpus=r.index.shard_num_cpus,
                    num_gpus=r.index.shard_num_gpus,
                    max_restarts=r.index.shard_max_restarts,
                    hnsw_ef_search=r.index.hnsw_ef_search,
                    ivf_nprobe=r.index.ivf_nprobe,
                )
            )
        else:
            shards = ShardSet.local(
                r.index.dir, encoder.spec, hnsw_ef_search=r.index.hnsw_ef_search, ivf_nprobe=r.index.ivf_nprobe
            )
    except (IndexMismatchError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    client = RetrieverClient(encoder, shards, num_candidates=r.server.max_topk, num_shown=r.server.default_topk)
    app = create_app(client, ServerLimits(**r.server.model_dump(exclude={"host", "port"})))
    print(
        f"serving {client.num_passages} passages from {r.index.dir} at http://{r.server.host}:{r.server.port}/retrieve",
        flush=True,
    )
    uvicorn.run(app, host=r.server.host, port=r.server.port, log_level="warning")
    return 0
