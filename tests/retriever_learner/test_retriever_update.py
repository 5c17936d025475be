"""The retriever step of a round on the real MiniLM query encoder and a real FAISS index."""

import dataclasses

import pytest
import torch

from bridge_ray.algo.retriever import retrieval_log_probs
from bridge_ray.config import RetrieverObjectiveConfig
from bridge_ray.data.world import load_split
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retriever_learner.update import RetrieverBatch, RetrieverUpdater

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
    objective = RetrieverObjectiveConfig(**{"lr": 2e-3, **kw.pop("objective", {})})
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


def test_a_trust_region_keeps_the_ranking_near_the_one_that_logged_the_batch(setup):
    """Many large inner steps fit the batch's one supporting candidate; kl_coef holds the ranking near eta_old's."""
    encoder, client, batch = setup
    start = encoder.adapter_state_dict()
    with torch.no_grad():  # logged by this adapter (the module's earlier tests moved it)
        old = torch.einsum("md,mkd->mk", encoder.encode_queries(batch.queries), client.doc_embeddings(batch.doc_ids))
    batch = dataclasses.replace(batch, old_scores=old)
    moved, step_kl, g = {}, {}, client.doc_embeddings(batch.doc_ids)
    for kl_coef in (0.0, 5.0):
        encoder.load_adapter_state_dict(start)
        updater = _updater(encoder, client, objective={"inner_steps": 8, "lr": 1e-2, "kl_coef": kl_coef})
        stats = updater.step(batch)
        assert ("trust_kl" in stats) == (kl_coef > 0)
        step_kl[kl_coef] = updater.ranking_kl(batch, updater.log_rho(batch, g))
        moved[kl_coef] = _target_log_prob(encoder, client, batch)
        # measured after the step; the first pass's trust_kl is 0 by construction
        assert step_kl[kl_coef] > 1e-4 and abs(stats.get("trust_kl", 0.0)) < 1e-6
    encoder.load_adapter_state_dict(start)
    before = _target_log_prob(encoder, client, batch)
    assert before < moved[5.0] < moved[0.0]  # still towards the supporting document, by less
    assert step_kl[5.0] < step_kl[0.0]
    assert updater.ranking_kl(batch, updater.log_rho(batch, g)) < 1e-6  # back at the adapter that logged the batch


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
