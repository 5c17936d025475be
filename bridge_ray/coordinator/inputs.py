"""What a job reads: question files, the index, the policy weights; the bundled world when none is configured.

The world and its index are built once into the cache (:func:`~bridge_ray.cache.cache_root`) and reused, keyed
by the world's kind, seed, size and phrasing and by the encoder configuration (:data:`INDEX_KEY`), so ``make demo``
and the tests encode it once.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from bridge_ray.cache import cache_root, cached_directory
from bridge_ray.cache_key import CacheKey, under
from bridge_ray.config import Config
from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.config.schema import BUILD_KEYS
from bridge_ray.data.gap_world import GAP_WORLD
from bridge_ray.data.qa import QuestionRecord, load_questions
from bridge_ray.data.world import DEFAULT_WORLD, world_dir
from bridge_ray.retrieval import build as index_build
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder

WORLD_KINDS = {kind.name: kind for kind in (DEFAULT_WORLD, GAP_WORLD)}  # data.world -> kind


def configured_world(config: Config) -> Path:
    data = config.data
    kind = WORLD_KINDS[data.world]
    return world_dir(data.world_seed, kind.sizes[data.world_size], phrasing=data.world_phrasing, kind=kind)


def train_questions_files(config: Config) -> list[str]:
    """``data.train``, or the world's train split when none is configured."""
    return list(config.data.train) or [str(configured_world(config) / "train.jsonl")]


def train_questions(config: Config) -> list[QuestionRecord]:
    return load_questions(train_questions_files(config))


def reworded_train_files(config: Config) -> dict[str, Path]:
    """``warmup.phrasings`` -> the train split of the bundled world in that wording (the same questions)."""
    data = config.data
    kind = WORLD_KINDS[data.world]
    return {
        phrasing: world_dir(data.world_seed, kind.sizes[data.world_size], phrasing=phrasing, kind=kind) / "train.jsonl"
        for phrasing in dict.fromkeys(config.warmup.phrasings)
    }


def reworded(config: Config, records: list[QuestionRecord], rng: random.Random) -> list[QuestionRecord]:
    """``records`` of the bundled world's train split, each asked in a wording drawn by ``rng`` from
    ``data.world_phrasing`` and ``warmup.phrasings``: the same question (id, answers, gold passages) in other
    words, for demonstrations that do not all share one template's words."""
    texts = {
        phrasing: {record.question_id: record.question for record in load_questions([str(path)])}
        for phrasing, path in reworded_train_files(config).items()
    }
    own = config.data.world_phrasing
    drawn = [rng.choice([own, *config.warmup.phrasings]) for _ in records]
    return [
        record if phrasing == own else replace(record, question=texts[phrasing][record.question_id])
        for record, phrasing in zip(records, drawn, strict=True)
    ]


def world_set_name(config: Config) -> str:
    """The name a bundled world's held-out split has in evaluation tables: ``world`` for the default world,
    else the world's own (``gap``, with rows ``gap/two_hop``, ...), so a table says which world it measured."""
    return "world" if config.data.world == "default" else config.data.world


def eval_files(config: Config) -> dict[str, str]:
    """Data-set name -> question file; the world's test split when none is configured."""
    return dict(config.data.eval) or {world_set_name(config): str(configured_world(config) / "test.jsonl")}


# The bundled world's index: the passages' encoding and the FAISS build. The world enters as its directory's name (its
# own content key), the encoder resolved (its preset's values filled in, and the passage text rule).
INDEX_KEY = CacheKey(
    "index", version=1,
    fields=(*under("retrieval.index", *BUILD_KEYS), "retrieval.encoder.passage_dtype"),
    excluded={
        "retrieval.index.dir": "a configured index is not built, so has no key",
        **dict.fromkeys(under("retrieval.index", "hnsw_ef_search", "ivf_nprobe", "verify"), "how it is searched"),
        **dict.fromkeys(under("retrieval.encoder", "name", "passage_name", "pooling", "normalize", "query_prefix",
                              "passage_prefix", "max_passage_length"), "enters resolved, as the encoder input"),
        **dict.fromkeys(under("retrieval.encoder", "max_query_length", "query_batch_size", "adapter"),
                        "the query side: passages are encoded without it"),
        "retrieval.encoder.passage_batch_size": "batching",
    },
)
# The build settings of one index type (``hnsw_m``, ...): another type's index leaves them out of its key.
_TYPE_SETTINGS = tuple(key for key in BUILD_KEYS if any(key in params for params in index_build.INDEX_PARAMS.values()))


def index_dir(config: Config) -> Path:
    """``retrieval.index.dir``, or the world's index in the cache (built once)."""
    if config.retrieval.index.dir is not None:
        return Path(config.retrieval.index.dir)
    world = configured_world(config)
    return cached_directory(
        cache_root() / "indexes" / index_key(config, world.name),
        # through the module, so that a test stubbing the build reaches this call
        lambda out: index_build.build_configured_index(config.retrieval, world / "corpus.jsonl", out, progress=False),
    )


def index_key(config: Config, world: str) -> str:
    """The cached index's name (:data:`INDEX_KEY`) for the world cached as ``world``; the build settings another
    index type does not read are left out, so they rebuild nothing."""
    spec, used = config.retrieval.encoder.spec(), index_build.INDEX_PARAMS[config.retrieval.index.index_type]
    unused = under("retrieval.index", *(key for key in _TYPE_SETTINGS if key not in used))
    return INDEX_KEY.of(config, omit=unused, world=world,
                        encoder={name: getattr(spec, name) for name in EncoderSpec.INDEX_FIELDS})


def index_shards(config: Config) -> ShardSet:
    """Every shard of the run's index in this process, searched and checked as ``retrieval.index`` says."""
    return ShardSet.local(index_dir(config), config.retrieval.encoder.spec(), **config.retrieval.index.search_options())


def starting_retriever(config: Config) -> RetrieverClient:
    """The run's retriever before its first update, in this process: the starting query encoder (its configured
    adapter, else a fresh LoRA, which scores as the base encoder does) over :func:`index_shards`, with the run's
    k and m. The warm-up's demonstrations, the calibration gates and the agent bench search with it."""
    objective = config.algorithm.retriever
    return RetrieverClient(QueryEncoder.from_config(config.retrieval), index_shards(config),
                           num_candidates=objective.num_candidates, num_shown=objective.num_shown)
