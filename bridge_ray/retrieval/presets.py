"""Encoder presets and the resolved encoder specification (light: no torch, so the config can import it).

A spec is everything that decides an embedding: the model, pooling, normalisation, prefixes, maximum
lengths and which text of a corpus row is embedded. Index manifests record it, and the retriever refuses an
index built under another spec.
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


PRESETS: dict[str, EncoderPreset] = {
    **{name: EncoderPreset("mean", True) for name in MINILM_NAMES},  # the embedded default, packaged
    "intfloat/e5-base-v2": EncoderPreset("mean", True, "query: ", "passage: "),
    "intfloat/e5-large-v2": EncoderPreset("mean", True, "query: ", "passage: "),
    **{
        f"BAAI/bge-{size}-en-v1.5": EncoderPreset("cls", True, BGE_QUERY_INSTRUCTION)
        for size in ("small", "base", "large")
    },
}


@dataclass(frozen=True)
class EncoderSpec:
    """A fully resolved encoder configuration; ``model`` is a preset name, a local directory or a hub id."""

    model: str
    pooling: Pooling
    normalize: bool
    query_prefix: str
    passage_prefix: str
    max_query_length: int
    max_passage_length: int
    passage_text: str = PASSAGE_TEXT  # not configurable: a record of the rule, so caches and indexes key on it

    # Fields that change the score f(q)ᵀg(d) of an index; max_query_length only truncates long queries.
    INDEX_FIELDS = (
        "model",
        "pooling",
        "normalize",
        "query_prefix",
        "passage_prefix",
        "max_passage_length",
        "passage_text",
    )

    def to_dict(self) -> dict:
        return asdict(self)

    def index_mismatches(self, recorded: dict) -> list[str]:
        """``key: recorded != configured`` for every index-relevant field that differs from ``recorded``."""
        mine = self.to_dict()
        return [
            LEGACY_PASSAGE_TEXT
            if key == "passage_text" and key not in recorded
            else f"{key}: index has {recorded.get(key)!r}, configured {mine[key]!r}"
            for key in self.INDEX_FIELDS
            if recorded.get(key) != mine[key]
        ]

