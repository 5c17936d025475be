"""``bridge-ray build-index``: encode a corpus with the passage encoder into a sharded FAISS index.

``--encoder`` names the query encoder, and the passage encoder too unless ``--passage-encoder`` (or the encoder's
preset, e.g. MedCPT's) names a pair's other model: the manifest records both, so the index serves only that pair.

Re-running the same command on an interrupted build resumes where it stopped; on a finished one it reports
the index up to date. ``--out`` must be new, empty, or hold this build: another index is replaced only under
``--overwrite``. Bad input (a malformed corpus line, a bad flag, a taken folder) is an ``InputError``.
``--from-faiss`` takes the vectors from an existing FAISS index of the corpus (Search-R1's / FlashRAG's
``e5_Flat.index``) instead of encoding it.
"""

from __future__ import annotations

import argparse

from bridge_ray.cli import add_config_arguments, add_out_argument, config_from_args
from bridge_ray.config import Config
from bridge_ray.errors import InputError, Problems
from bridge_ray.retrieval import build
from bridge_ray.retrieval.faiss_import import import_configured_index
from bridge_ray.retrieval.manifest import IndexManifest
from bridge_ray.train.preflight import check_model_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--corpus", required=True, metavar="FILE", help="corpus jsonl: {id, contents} or {id, title, text}"
    )
    parser.add_argument(
        "--from-faiss",
        metavar="FILE",
        help="existing FAISS index of --corpus (Search-R1 / FlashRAG e5_Flat.index, vector i = line i): split into "
        "shards without encoding (--device and --chunk unused)",
    )
    add_out_argument(parser, "folder", "the index (retrieval.index.dir); a build stopped there resumes",
                     required=True, resumable=True,
                     overwrite="replace an index of another corpus or configuration held by --out")
    parser.add_argument(
        "--encoder", metavar="NAME", help="query encoder: preset, local dir or hub id (retrieval.encoder.name)"
    )
    parser.add_argument(
        "--passage-encoder",
        metavar="NAME",
        help="an asymmetric pair's passage encoder, which embeds the corpus: local dir or hub id "
        "(retrieval.encoder.passage_name; default: the preset's pair, else --encoder itself)",
    )
    parser.add_argument("--shards", type=int, metavar="K", help="number of shards (retrieval.index.num_shards)")
    parser.add_argument("--index-type", choices=["flat", "hnsw", "ivf"], help="retrieval.index.index_type")
    parser.add_argument("--device", default="auto", help="encoder device: auto (GPU when present), cpu, cuda:N")
    parser.add_argument("--chunk", type=int, default=2048, help="passages encoded between two resume checkpoints")
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip malformed corpus lines and list them")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.chunk < 1:  # before the encoder loads
        raise InputError(f"--chunk must be at least 1 (passages encoded between two resume points), got {args.chunk}")
    cfg = config_from_args(
        args,
        {
            "retrieval.index.dir": args.out,
            "retrieval.encoder.name": args.encoder,
            "retrieval.encoder.passage_name": args.passage_encoder,
            "retrieval.index.num_shards": args.shards,
            "retrieval.index.index_type": args.index_type,
        },
    )
    _check_encoders(args, cfg)
    spec = cfg.retrieval.encoder.spec()
    if args.from_faiss:
        manifest = _import_faiss(args, cfg)
    else:
        manifest = build.build_configured_index(
            cfg.retrieval,
            args.corpus,
            cfg.retrieval.index.dir,
            device=args.device,
            chunk=args.chunk,
            skip_bad_lines=args.skip_bad_lines,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    print(
        f"index {cfg.retrieval.index.dir}: {manifest.num_passages} passages, dim {manifest.dim}, "
        f"{len(manifest.shards)} {manifest.index_type} shard(s), encoder {spec.model}"
        f"{f' (queries) + {spec.passage_model} (passages)' if spec.asymmetric else ''} ({spec.pooling} pooling"
        f"{', normalised' if spec.normalize else ''}); {len(manifest.skipped_lines)} line(s) skipped"
    )
    return 0


def _check_encoders(args: argparse.Namespace, cfg: Config) -> None:
    """Both encoders load from somewhere (a folder, the packaged copy, the hub or its cache) before the corpus is
    read: transformers would otherwise fail with a traceback once the build has started."""
    encoder, problems = cfg.retrieval.encoder, Problems()
    with problems.check():
        check_model_source(encoder.name, "--encoder" if args.encoder else "retrieval.encoder.name", here=True)
    if encoder.passage_name is not None:
        with problems.check():
            key = "--passage-encoder" if args.passage_encoder else "retrieval.encoder.passage_name"
            check_model_source(encoder.passage_name, key, here=True)
    problems.raise_any()


def _import_faiss(args: argparse.Namespace, cfg: Config) -> IndexManifest:
    """``--from-faiss``: the index's vector i is corpus line i, so no line may be skipped."""
    if args.skip_bad_lines:
        raise InputError("--skip-bad-lines cannot be used with --from-faiss: vector i of the index is corpus line i")

    return import_configured_index(
        cfg.retrieval,
        args.corpus,
        args.from_faiss,
        cfg.retrieval.index.dir,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
