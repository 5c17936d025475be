"""Encoder presets and the resolved encoder specification: the configuration of the dense retriever's encoders,
which ``retrieval.encoder`` resolves to (:meth:`~bridge_ray.config.schema.EncoderConfig.spec`) and every reader of
an index checks it against. Light (no torch), like the rest of the config.

A spec is everything that decides an embedding: the query and passage models, pooling, normalisation, prefixes,
maximum lengths and which text of a corpus row is embedded. Index manifests record it, and the retriever refuses
an index built under another spec.

An encoder is symmetric (one model embeds queries and passages: E5, BGE, MiniLM) or a pair (MedCPT's Query- and
Article-Encoder, DPR's question and context encoders): the query-side LoRA adapts the query model, the passage
model builds the index. A symmetric spec's dict has no ``passage_model`` key, so it reads as it always did:
manifests and caches written before pairs existed, one model for both sides, still match.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from bridge_ray.model_paths import MINILM_NAMES

Pooling = Literal["mean", "cls"]

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
# What a passage encoder embeds after the passage prefix: a corpus row's ``contents`` verbatim, quotes and newlines
# included, else its ``text`` verbatim -- what Search-R1's and FlashRAG's index builders embed, so indexes
# built here and there are interchangeable. Indexes built before it was recorded embed a re-assembled title/text.
PASSAGE_TEXT = "contents, else text"
LEGACY_PASSAGE_TEXT = (
    "passage_text: index has none recorded (built before passages were encoded from `contents` verbatim: it "
    "embeds a re-assembled title/text, so its scores differ from Search-R1's and FlashRAG's); rebuild it "
    "(build-index --overwrite)"
)


@dataclass(frozen=True)
class EncoderPreset:
    pooling: Pooling
    normalize: bool
    query_prefix: str = ""
    passage_prefix: str = ""
    passage_model: str | None = None  # the pair's passage encoder; None: the query model (symmetric)


PRESETS: dict[str, EncoderPreset] = {
    **{name: EncoderPreset("mean", True) for name in MINILM_NAMES},  # the embedded default, packaged
    "intfloat/e5-base-v2": EncoderPreset("mean", True, "query: ", "passage: "),
    "intfloat/e5-large-v2": EncoderPreset("mean", True, "query: ", "passage: "),
    **{
        f"BAAI/bge-{size}-en-v1.5": EncoderPreset("cls", True, BGE_QUERY_INSTRUCTION)
        for size in ("small", "base", "large")
    },
    # Asymmetric pairs: [CLS] of the last layer, inner product of raw (unnormalised) embeddings, as each was trained.
    "ncbi/MedCPT-Query-Encoder": EncoderPreset("cls", False, passage_model="ncbi/MedCPT-Article-Encoder"),
    "facebook/dpr-question_encoder-single-nq-base": EncoderPreset(
        "cls", False, passage_model="facebook/dpr-ctx_encoder-single-nq-base"
    ),
}


@dataclass(frozen=True)
class EncoderSpec:
    """A fully resolved encoder configuration; ``model`` (the query side) and ``passage_model`` are each a preset
    name, a local directory or a hub id; ``passage_model`` None (or ``model``): one model for both sides."""

    model: str
    pooling: Pooling
    normalize: bool
    query_prefix: str
    passage_prefix: str
    max_query_length: int
    max_passage_length: int
    passage_text: str = PASSAGE_TEXT  # not configurable: a record of the rule, so caches and indexes key on it
    passage_model: str | None = None

    # Fields that change the score f(q)ᵀg(d) of an index; max_query_length only truncates long queries.
    INDEX_FIELDS = (
        "model",
        "passage_model",
        "pooling",
        "normalize",
        "query_prefix",
        "passage_prefix",
        "max_passage_length",
        "passage_text",
    )

    def __post_init__(self) -> None:
        if self.passage_model == self.model:  # one spelling of a symmetric encoder, so equal specs compare equal
            object.__setattr__(self, "passage_model", None)

    @property
    def passage_encoder(self) -> str:
        """The model that embeds passages (builds the index): ``passage_model``, else ``model``."""
        return self.passage_model or self.model

    @property
    def asymmetric(self) -> bool:
        return self.passage_model is not None

    def to_dict(self) -> dict:
        """Every field; ``passage_model`` only for a pair (see the module docstring)."""
        out = asdict(self)
        if not self.asymmetric:
            del out["passage_model"]
        return out

    def index_mismatches(self, recorded: dict) -> list[str]:
        """``key: recorded != configured`` for every index-relevant field that differs from ``recorded`` (a spec's
        dict, a manifest's ``encoder``). ``passage_model`` compares the models that embed passages (a record
        without one is of a symmetric encoder: its ``model``), and only where a side is a pair: between two symmetric
        encoders ``model`` says it all."""
        mine, theirs = both_sides(self.to_dict()), both_sides(recorded)
        pair = self.asymmetric or "passage_model" in recorded
        return [
            LEGACY_PASSAGE_TEXT
            if key == "passage_text" and key not in recorded
            else f"{key}: index has {theirs.get(key)!r}, configured {mine[key]!r}"
            for key in self.INDEX_FIELDS
            if (pair or key != "passage_model") and theirs.get(key) != mine[key]
        ]


def both_sides(encoder: dict) -> dict:
    """A recorded spec with ``passage_model`` made explicit: the model that embeds passages."""
    return {**encoder, "passage_model": encoder.get("passage_model") or encoder.get("model")}

