"""The real MiniLM encoders: pooling, prefixes, truncation, and the query-side LoRA (peft)."""

import dataclasses

import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import AutoModel

from bridge_ray.model_paths import resolve_model_path
from bridge_ray.retrieval.corpus import Document
from bridge_ray.retrieval.encoder import PassageEncoder, QueryEncoder, embed_texts

pytestmark = pytest.mark.slow

TEXTS = ["Where was Ilsa Varen born?", "the Copper Bridge", "Who founded the Harrowgate Shipyard in 1820?"]


@pytest.fixture(scope="module")
def query_encoder(minilm_spec):
    return QueryEncoder(minilm_spec)


def test_mean_pooling_ignores_padding_and_embeddings_are_unit(query_encoder):
    together = query_encoder.encode_queries(TEXTS).detach()
    alone = torch.cat([query_encoder.encode_queries([t]).detach() for t in TEXTS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(together.norm(dim=-1), torch.ones(3))
    assert together.shape == (3, 384)


def test_passages_and_queries_share_one_embedding_path(minilm_spec, passage_encoder, query_encoder):
    # MiniLM has no prefixes: a passage embeds exactly like its contents as a query, quoted title included.
    contents = [*TEXTS, '"Velmora"\nA river town.']
    docs = passage_encoder.embed_passages([Document(str(i), t) for i, t in enumerate(contents)])
    queries = query_encoder.encode_queries(contents).detach()
    torch.testing.assert_close(torch.from_numpy(docs), queries, atol=1e-5, rtol=0)
    unquoted = query_encoder.encode_queries(["Velmora\nA river town."]).detach()
    assert not torch.allclose(torch.from_numpy(docs[-1:]), unquoted, atol=1e-3)


def test_prefix_cls_pooling_normalisation_and_truncation(minilm_spec, query_encoder):
    model, tok = query_encoder.model, query_encoder.tokenizer
    with_prefix = dataclasses.replace(minilm_spec, query_prefix="query: ")
    torch.testing.assert_close(
        embed_texts(model, tok, ["x y"], prefix=with_prefix.query_prefix, max_length=64, spec=with_prefix),
        embed_texts(model, tok, ["query: x y"], prefix="", max_length=64, spec=minilm_spec),
    )
    cls = dataclasses.replace(minilm_spec, pooling="cls", normalize=False)
    batch = tok(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        first_token = model(**batch).last_hidden_state[:, 0]
        torch.testing.assert_close(embed_texts(model, tok, TEXTS[:1], prefix="", max_length=64, spec=cls), first_token)
        # 8 tokens keep [CLS] + 6 word pieces + [SEP]: texts that differ only later embed the same.
        a, b = "one two three four five six seven eight", "one two three four five six nine ten"
        short = embed_texts(model, tok, [a, b], prefix="", max_length=8, spec=minilm_spec)
        full = embed_texts(model, tok, [a, b], prefix="", max_length=64, spec=minilm_spec)
    torch.testing.assert_close(short[0], short[1])
    assert not torch.allclose(full[0], full[1])


def test_only_lora_factors_train_and_base_weights_never_change(minilm_spec, passage_encoder):
    enc = QueryEncoder(minilm_spec, rank=16, alpha=16)
    names = [n for n, p in enc.named_parameters() if p.requires_grad]
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    assert len(names) == 6 * 3 * 2  # 6 layers x (query, key, value) x (A, B)
    assert {p.shape for n, p in enc.named_parameters() if "lora_A" in n} == {torch.Size([16, 384])}
    assert sum(p.numel() for p in enc.trainable_parameters()) == 6 * 3 * 2 * 16 * 384
    base = {n: p.detach().clone() for n, p in enc.named_parameters() if not p.requires_grad}
    before = enc.encode_queries(TEXTS).detach()
    docs = torch.from_numpy(passage_encoder.embed_passages([Document("0", '"Varen"\nthe Copper Bridge')]))
    opt = torch.optim.Adam(enc.trainable_parameters(), lr=1e-2)
    for _ in range(3):
        loss = -(enc.encode_queries(TEXTS) @ docs.T).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for n, p in enc.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base[n]), f"base weight {n} changed"
    after = enc.encode_queries(TEXTS).detach()
    assert (after @ docs.T).sum() > (before @ docs.T).sum() + 0.1  # the adapter learned something
    enc.train()  # dropout 0: train mode scores equal eval-mode (rollout) scores
    torch.testing.assert_close(enc.encode_queries(TEXTS).detach(), after)


def test_adapter_saves_in_peft_format_and_round_trips(minilm_spec, tmp_path):
    enc = QueryEncoder(minilm_spec, rank=8, alpha=16)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.normal_(0, 0.05)
    expected = enc.encode_queries(TEXTS).detach()
    out = enc.save_adapter(tmp_path / "adapter")
    assert {p.name for p in out.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    # A user loads it with plain peft.
    user = PeftModel.from_pretrained(AutoModel.from_pretrained(resolve_model_path(minilm_spec.model)), str(out)).eval()
    with torch.no_grad():
        got = embed_texts(user, enc.tokenizer, TEXTS, prefix="", max_length=256, spec=minilm_spec)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # The serving path loads the directory; the rollout path takes the learner's state dict.
    torch.testing.assert_close(QueryEncoder(minilm_spec, adapter_dir=out).encode_queries(TEXTS).detach(), expected)
    fresh = QueryEncoder(minilm_spec, rank=8, alpha=16)
    assert not torch.allclose(fresh.encode_queries(TEXTS).detach(), expected)
    state = enc.adapter_state_dict()
    assert all(v.device.type == "cpu" and not v.requires_grad for v in state.values())
    fresh.load_adapter_state_dict(state)
    torch.testing.assert_close(fresh.encode_queries(TEXTS).detach(), expected)
    with pytest.raises(ValueError, match="mismatch"):
        fresh.load_adapter_state_dict({k: v for k, v in list(state.items())[1:]})
    with pytest.raises(ValueError, match="shape"):
        QueryEncoder(minilm_spec, rank=4).load_adapter_state_dict(state)
    with pytest.raises(FileNotFoundError, match="not a peft adapter"):
        QueryEncoder(minilm_spec, adapter_dir=tmp_path)


def test_batched_rollout_path_equals_learner_path(minilm_spec):
    enc = QueryEncoder(minilm_spec, batch_size=2)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.normal_(0, 0.05)
    learner = enc.encode_queries(TEXTS)
    assert learner.requires_grad
    torch.testing.assert_close(torch.from_numpy(enc.embed_queries(TEXTS)), learner.detach(), atol=1e-5, rtol=0)
    assert enc.embed_queries([]).shape == (0, 384)


def test_passage_encoder_keeps_input_order(passage_encoder):
    documents = [Document(str(i), f'"T{i}"\n' + "word " * (i * 7)) for i in range(5)]
    batched = passage_encoder.embed_passages(documents)
    single = [passage_encoder.embed_passages([d])[0] for d in documents]
    torch.testing.assert_close(torch.from_numpy(batched), torch.from_numpy(np.stack(single)), atol=1e-5, rtol=0)
    assert isinstance(passage_encoder, PassageEncoder) and passage_encoder.dim == 384


def test_a_pickled_adapter_is_refused_not_loaded(minilm_spec, tmp_path):
    """A ``.bin`` adapter (pickle, may run code when loaded) from a shared path is never opened."""
    encoder = QueryEncoder(minilm_spec, rank=8, alpha=16)
    encoder.model.save_pretrained(tmp_path / "pickled", safe_serialization=False)
    assert (tmp_path / "pickled" / "adapter_model.bin").is_file()
    with pytest.raises(FileNotFoundError, match=r"pickled: not a peft adapter directory in safetensors"):
        QueryEncoder(minilm_spec, adapter_dir=tmp_path / "pickled")


def test_a_fresh_adapter_is_drawn_from_its_seed_alone(minilm_spec):
    torch.manual_seed(1)
    a = QueryEncoder(minilm_spec, rank=2, init_seed=7).adapter_state_dict()
    torch.manual_seed(2)
    b = QueryEncoder(minilm_spec, rank=2, init_seed=7).adapter_state_dict()
    c = QueryEncoder(minilm_spec, rank=2, init_seed=8).adapter_state_dict()
    lora_a = [k for k in a if "lora_A" in k]
    assert lora_a and all(torch.equal(a[k], b[k]) for k in a), "the process's RNG state does not matter"
    assert not any(torch.equal(a[k], c[k]) for k in lora_a)
