"""Answer-likelihood scoring: the shared-prefix computation equals the naive per-candidate one."""

import pytest
import torch

from bridge_ray.agent.protocol import ObservationRenderer
from bridge_ray.agent.scoring import answer_group, answer_groups, score_answers
from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.algo.logprob import sequence_log_likelihood, token_log_probs
from bridge_ray.engines.base import PrefixGroup
from bridge_ray.engines.hf import HFEngine, shared_prefix_log_likelihoods
from bridge_ray.retrieval.types import Passage


def naive(model, group):
    """One full forward per candidate: prefix + continuation, scored on the continuation's tail."""
    out = []
    for cont, n in zip(group.continuations, group.num_scored, strict=True):
        ids = torch.tensor([[*group.prefix, *cont]])
        logp = token_log_probs(model(ids).logits[:, :-1], ids[:, 1:])
        mask = torch.zeros_like(logp, dtype=torch.bool)
        mask[:, -n:] = True
        out.append(sequence_log_likelihood(logp, mask)[0])
    return torch.stack(out)


@pytest.fixture(scope="module")
def group(gemma_tokenizer):
    tok = gemma_tokenizer
    prefix = tok("Question: where was the inventor born? <search> inventor birthplace </search>").input_ids
    docs = ["short", "a much longer document " * 4, "medium sized text here", "x", "another one " * 2]
    conts = [[*tok(f" {d} <answer>", add_special_tokens=False).input_ids, 9079, 236764] for d in docs]
    conts.append([9079])  # a continuation scored in full: its first token is predicted by the prefix alone
    return PrefixGroup(prefix, conts, [2, 2, 2, 2, 1, 1])


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_shared_prefix_equals_naive(tiny_model, group, batch_size):
    assert len(group.prefix) > tiny_model.config.sliding_window  # the cached prefix outgrows the window
    with torch.no_grad():
        fast = shared_prefix_log_likelihoods(tiny_model, group, batch_size=batch_size)
        torch.testing.assert_close(fast, naive(tiny_model, group), atol=1e-4, rtol=0)


@pytest.mark.parametrize("softcap", [None, 0.05])
def test_leading_tokens_every_continuation_shares_are_scored_as_in_a_full_forward(make_tiny, gemma_tokenizer,
                                                                                   softcap):
    """The ``<information>`` header all k candidates open with joins the prefix; scores stay those of the full
    forward, soft-capped logits included, also where the shared part reaches the first scored token."""
    tok = gemma_tokenizer
    model = make_tiny(2)
    model.config.final_logit_softcapping = softcap
    prefix = tok("Question: where was the inventor born? <search> inventor birthplace </search>").input_ids
    header = tok("\n\n<information>Doc 1(Title:", add_special_tokens=False).input_ids
    docs = [" Ada) born in Leeds", " Bo) a longer passage " * 3, " Cy)"]
    groups = [
        PrefixGroup(prefix, [[*header, *tok(d, add_special_tokens=False).input_ids, 9079, 236764] for d in docs],
                    [2, 2, 1]),
        PrefixGroup(prefix, [[*header, 9079, 236764]], [2]),  # one candidate: everything unscored is shared
        PrefixGroup(prefix, [[*header, 9079], [*header, 236764]], [1, 1]),  # they differ at the scored token
    ]
    with torch.no_grad():
        scores = [shared_prefix_log_likelihoods(model, group, batch_size=2) for group in groups]
        for group, fast in zip(groups, scores, strict=True):
            torch.testing.assert_close(fast, naive(model, group), atol=1e-5, rtol=0)
        if softcap is not None:
            model.config.final_logit_softcapping = None
            assert (scores[0] - shared_prefix_log_likelihoods(model, groups[0])).abs().max() > 1e-3, "cap inert"


def test_shared_prefix_gradients_equal_naive(make_tiny, group):
    model = make_tiny(5).train(False)
    params = [p for p in model.parameters() if p.requires_grad]
    fast = torch.autograd.grad(shared_prefix_log_likelihoods(model, group, batch_size=3).sum(), params)
    slow = torch.autograd.grad(naive(model, group).sum(), params)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_answer_context_is_prefix_document_and_answer_opening(gemma_tokenizer, tiny_model):
    tok = gemma_tokenizer
    renderer = ObservationRenderer(tok, max_tokens=64)
    prefix_text = "Q: who? <search> who </search>"
    prefix = tok(prefix_text).input_ids
    turn = RetrievalTurn(0, prefix, tok.decode(prefix), "who", [5, 1], [0.9, 0.3], ["b"], 0, 0)
    docs = [Passage("b", "Bee", "A bee text."), Passage("a", "Ant", "An ant text " * 40)]
    grp = answer_group(tok, renderer, turn, docs, "  William Shakespeare ")
    first = tok.decode([*grp.prefix, *grp.continuations[0]], skip_special_tokens=True)
    block = "\n\n<information>Doc 1(Title: Bee) A bee text.</information>\n\n"
    assert first == f"{prefix_text}{block}<answer> William Shakespeare"
    for cont, n in zip(grp.continuations, grp.num_scored, strict=True):
        assert tok.decode(cont[-n:]) == " William Shakespeare"
    assert len(grp.continuations[1]) - grp.num_scored[1] - 3 == 64  # the long document is cut at the budget

    trajectory = Trajectory.start("u", "who?", ["William Shakespeare", "Shakespeare"], 0, prefix, 0)
    trajectory.retrieval_turns.append(turn)
    groups = answer_groups([trajectory], tok, renderer, lambda ids: [docs[0], docs[1]])
    assert groups[0][:2] == (0, 0) and groups[0][2] == grp  # the first golden answer is the one scored
    with pytest.raises(ValueError, match="returned 1 of 2"):
        answer_groups([trajectory], tok, renderer, lambda ids: docs[:1])
    scores = HFEngine(tiny_model, tok).continuation_log_probs([grp])[0]
    with torch.no_grad():
        torch.testing.assert_close(scores, naive(tiny_model, grp), atol=1e-4, rtol=0)


def test_identical_retrieval_turns_are_scored_once_and_each_gets_its_own_scores(gemma_tokenizer, tiny_model):
    tok = gemma_tokenizer
    renderer = ObservationRenderer(tok, max_tokens=64)
    docs = {0: Passage("a", "Ant", "An ant text."), 1: Passage("b", "Bee", "A bee text."), 2: Passage("c", "C", "Cc.")}

    def trajectory(query: str, doc_ids: list[int]) -> Trajectory:
        prefix = tok(f"Q: who? <search> {query} </search>").input_ids
        t = Trajectory.start("u", "who?", ["Ann"], 0, prefix, 0)
        t.retrieval_turns.append(RetrievalTurn(0, prefix, tok.decode(prefix), query, doc_ids, [0.5] * len(doc_ids),
                                               ["a"], 0, 0))
        return t

    # rollouts 0 and 2 searched alike; rollout 1 with the same query saw other candidates
    trajectories = [trajectory("ant", [0, 1]), trajectory("ant", [1, 2]), trajectory("ant", [0, 1]),
                    trajectory("bee", [0, 1])]
    engine = HFEngine(tiny_model, tok)
    scored: list[PrefixGroup] = []
    score = engine.continuation_log_probs
    engine.continuation_log_probs = lambda groups: scored.extend(groups) or score(groups)
    scores, groups = score_answers(engine, trajectories, tok, renderer, lambda ids: [docs[i] for i in ids])
    assert len(scored) == 3 and len(groups) == 4 and groups[0] == groups[2] == scored[0]
    for per_trajectory, group in zip(scores, groups, strict=True):
        (got,) = per_trajectory
        assert torch.equal(got, score([group])[0])
    assert not torch.equal(scores[0][0], scores[1][0])
