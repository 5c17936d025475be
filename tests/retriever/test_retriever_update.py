"""The retriever step of a round on the real MiniLM query encoder and a real FAISS index."""

import pytest
import torch

from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.config import RetrieverObjectiveConfig
from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever.update import RetrieverBatch, RetrieverUpdater

pytestmark = pytest.mark.slow
K = 8


@pytest.fixture(scope="module")
def setup(minilm_spec, small_world, world_index):
    encoder = QueryEncoder(minilm_spec)
    client = RetrieverClient.from_index(encoder, world_index, num_candidates=K, num_shown=3)
    questions = [q["question"] for q in load_split(small_world, "test")[:6]]
    results = client.retrieve(questions)
    # The answer is supported by the 5th candidate of every turn and nothing else.
    answer_logp = [[0.0 if j == 4 else -12.0 for j in range(K)] for _ in results]
    batch = RetrieverBatch.from_turns(
        questions, [r.doc_ids for r in results], [r.scores for r in results], answer_logp, [1.0] * len(results)
    )
    yield encoder, client, batch
    client.close()


def _updater(encoder, client, **kw):
    objective = RetrieverObjectiveConfig(lr=2e-3, **kw.pop("objective", {}))
    return RetrieverUpdater(encoder, client.doc_embeddings, objective, **kw)


def _target_log_prob(encoder, client, batch):
    with torch.no_grad():
        scores = torch.einsum("md,mkd->mk", encoder.encode_queries(batch.queries), client.doc_embeddings(batch.doc_ids))
    return retrieval_log_probs(scores, 0.4)[:, 4].mean().item()


@pytest.mark.parametrize("turn_weight", ["uniform", "evidence"])
def test_micro_batches_accumulate_the_full_batch_gradient(setup, turn_weight):
    encoder, client, batch = setup
    g = client.doc_embeddings(batch.doc_ids)
    grads = []
    for micro in (len(batch), 2):
        updater = _updater(encoder, client, micro_batch_size=micro, objective={"turn_weight": turn_weight})
        updater.optimizer.zero_grad(set_to_none=True)
        stats = updater.accumulate_gradients(batch, g)
        grads.append([p.grad.clone() for p in encoder.trainable_parameters()])
        assert stats["score_mismatch"] < 1e-4  # same adapter as at retrieval time: logged scores reproduce
    for full, micro in zip(*grads, strict=True):
        torch.testing.assert_close(micro, full, rtol=1e-4, atol=1e-7)


def test_update_moves_only_lora_towards_supporting_document(setup):
    encoder, client, batch = setup
    base = {n: p.detach().clone() for n, p in encoder.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}
    before = _target_log_prob(encoder, client, batch)
    updater = _updater(encoder, client, version=3, objective={"inner_steps": 5})
    stats = updater.step(batch)
    assert updater.version == 4 and stats["retriever_version"] == 4.0
    assert _target_log_prob(encoder, client, batch) > before + 0.05
    for name, p in encoder.named_parameters():
        if name in base:
            assert torch.equal(p, base[name]), f"base weight {name} changed"
    assert any(not torch.equal(p, lora[n]) for n, p in encoder.named_parameters() if n in lora)


def test_save_writes_peft_adapter_and_optimizer(setup, tmp_path):
    encoder, client, batch = setup
    updater = _updater(encoder, client)
    updater.step(batch)
    updater.save(tmp_path)
    assert (tmp_path / "retriever_adapter" / "adapter_config.json").is_file()
    fresh = _updater(QueryEncoder(encoder.spec, adapter_dir=tmp_path / "retriever_adapter"), client)
    fresh.load_optimizer(tmp_path)
    assert fresh.optimizer.state_dict()["state"].keys() == updater.optimizer.state_dict()["state"].keys()
    for key, value in encoder.adapter_state_dict().items():
        torch.testing.assert_close(fresh.encoder.adapter_state_dict()[key], value)


def test_batch_shapes_are_checked():
    with pytest.raises(ValueError, match="advantages"):
        RetrieverBatch(["q"], torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(2))
