"""Builders of the CUDA checks, all from configs (the device has no model files and no network): a word-level
tokenizer whose action tags are single tokens, a tiny random Gemma 3 policy over it, a tiny BERT query encoder,
and an exact top-k retriever over that encoder's passage embeddings (FAISS's flat index, in torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertModel,
    BertTokenizerFast,
    Gemma3TextConfig,
    PreTrainedTokenizerFast,
)

from bridge_ray.agent.protocol import ANSWER_CLOSE, ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, SEARCH_CLOSE, SEARCH_OPEN
from bridge_ray.config.encoders import EncoderSpec
from bridge_ray.retrieval.corpus import Document
from bridge_ray.retrieval.encoder import PassageEncoder, QueryEncoder
from bridge_ray.retrieval.types import Passage, RetrievalResult

SPECIALS = ["[PAD]", "[EOS]", "[BOS]", "[UNK]"]
TAGS = [SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, INFO_OPEN, INFO_CLOSE]
# Few words, so that a random policy writes complete <search> and <answer> actions often.
WORDS = ["ada", "born", "paris", "who", "Doc", "Title"]



def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level, 16 ids: the protocol's tags are single tokens; unknown words map to ``[UNK]``."""
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in TAGS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]",
                                   bos_token="[BOS]", unk_token="[UNK]")


def tiny_gemma(vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """A 4-layer random Gemma 3 (sliding window 8 alternating with full attention) in fp32 on the CPU.

    Untied head, init std 0.2: logits of spread ~1.6, so sampled and teacher-forced log-probs differ visibly when
    a position or a cache row is wrong, while sampling still visits every token (tied, it repeats its input).
    """
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, sliding_window=8, max_position_embeddings=1024,
        layer_types=["sliding_attention", "full_attention"] * 2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        initializer_range=0.2, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def save_tiny_bert(directory: Path, seed: int = 0) -> EncoderSpec:
    """A 2-layer random BERT and a WordPiece tokenizer over :data:`WORDS`, saved as a local encoder."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(w.lower() for w in WORDS if w.isalnum())]
    (directory / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(directory)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128)
    BertModel(config).save_pretrained(directory)
    return EncoderSpec(model=str(directory), pooling="mean", normalize=True, query_prefix="", passage_prefix="",
                       max_query_length=32, max_passage_length=64)


def corpus(size: int = 24, seed: int = 0) -> list[Passage]:
    g = torch.Generator().manual_seed(seed)
    pick = lambda n: " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g))  # noqa: E731
    return [Passage(id=str(i), title=pick(2), text=pick(6)) for i in range(size)]


@dataclass
class TopKRetriever:
    """Exact inner-product top-k of :class:`QueryEncoder` queries over frozen passage embeddings."""

    encoder: QueryEncoder
    corpus: list[Passage]
    num_candidates: int = 4
    num_shown: int = 2

    def __post_init__(self) -> None:
        docs = [Document(p.id, f"{p.title} {p.text}") for p in self.corpus]
        passage_encoder = PassageEncoder(self.encoder.spec, device=str(self.encoder.device), dtype="float32")
        self.doc_embeddings = torch.from_numpy(passage_encoder.embed_passages(docs)).to(self.encoder.device)
        self.calls = 0

    def retrieve(self, queries: list[str]) -> list[RetrievalResult]:
        self.calls += 1
        q = torch.from_numpy(self.encoder.embed_queries(queries)).to(self.encoder.device)
        scores, ids = (q @ self.doc_embeddings.T).topk(self.num_candidates, dim=1)
        return [
            RetrievalResult(query, row.tolist(), s.tolist(), self.passages(row[: self.num_shown].tolist()))
            for query, row, s in zip(queries, ids.cpu(), scores.cpu(), strict=True)
        ]

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        return [self.corpus[i] for i in ids]
