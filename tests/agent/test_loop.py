"""The rollout loop in isolation: a scripted engine plays the policy (real tokenisation, stop strings and
budgets); the retriever is the production one over the small world's index. Questions are any text the script
knows, except where a test reads what the retriever found: those ask the world's own questions."""

import pytest
from agent_helpers import check_trajectory, segments

from bridge_ray.agent.loop import SearchAgent, gold_passages, shown_with_gold
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.agent.protocol import ObservationRenderer
from bridge_ray.agent.reward import extract_answer
from bridge_ray.agent.types import collate
from bridge_ray.config import RolloutConfig
from bridge_ray.data.qa import DataError, QuestionRecord
from bridge_ray.engines.base import Generation
from bridge_ray.retrieval.types import Passage

LOGP = -0.25


class ScriptedEngine:
    """Replays, for the question found in the context, the text of its next turn (turn = how many times the
    system has spoken). Tokenises for real, ends at the first stop string (at the token completing it) or at
    the token budget; a script text ending in ``<eos>`` ends with the EOS token."""

    weight_version = 4

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.batch_sizes: list[int] = []

    def generate(self, prompts, max_tokens, spec):
        self.batch_sizes.append(len(prompts))
        return [self._one(self.tokenizer.decode(p), m, spec.stop) for p, m in zip(prompts, max_tokens, strict=True)]

    def _one(self, context, max_tokens, stop):
        question = next(q for q in self.scripts if f"Q: {q}\n" in context)
        turn = context.count("<information>") + context.count("Invalid action.")
        text = self.scripts[question][turn]
        eos = text.endswith("<eos>")
        ids = self.tokenizer(text.removesuffix("<eos>"), add_special_tokens=False).input_ids
        ids = [*ids, self.tokenizer.eos_token_id] if eos else ids
        for i in range(1, len(ids) + 1):
            hit = next((s for s in stop if s in self.tokenizer.decode(ids[:i])), None)
            if i == max_tokens or hit:
                reason = "stop" if hit else "length"
                return Generation(ids[:i], [LOGP] * i, reason, hit)
        return Generation(ids, [LOGP] * len(ids), "eos" if eos else "length")


def settings(**overrides):
    base = dict(max_turns=2, max_prompt_length=64, max_response_length=400, max_action_length=40,
                max_observation_length=80, temperature=1.0)
    return RolloutConfig(**{**base, **overrides})


def record(question, answers=("Valmora",)):
    uid = f"test/{question.split()[0]}"
    return QuestionRecord(uid=uid, question=question, golden_answers=list(answers), source="test")


TEMPLATE = PromptTemplate("Q: {question}\n")


def rollout(tokenizer, retriever, scripts, questions, group_size=1, template=TEMPLATE, **overrides):
    engine = ScriptedEngine(tokenizer, scripts)
    cfg = settings(**overrides)
    agent = SearchAgent(engine, retriever, tokenizer, cfg, template)
    calls_before = len(retriever.calls)
    trajectories = agent.rollout(questions, group_size)
    for t in trajectories:
        check_trajectory(t, tokenizer, agent.renderer, cfg.max_response_length, retriever)
    return trajectories, engine, retriever.calls[calls_before:], agent


def test_search_then_answer_in_batched_turns(gemma_tokenizer, retriever, world_questions):
    """A single-hop question searched once and a two-hop one searched per hop, each search by its gold title."""
    single = next(q for q in world_questions if q.metadata["type"] == "single")
    two_hop = next(q for q in world_questions if q.metadata["type"] == "two_hop")
    gold = {q.uid: [int(d) for d in q.metadata["gold_doc_ids"]] for q in (single, two_hop)}
    (title,), (hop1, hop2) = ([p.title for p in retriever.passages(gold[q.uid])] for q in (single, two_hop))
    scripts = {
        single.question: [f"<think>look up</think> <search> {title} </search>",
                          f" <answer> {single.golden_answers[0]} </answer>"],
        two_hop.question: [f"<search> {hop1} </search> trailing text is never generated", f"<search> {hop2} </search>",
                           f"<answer> {two_hop.golden_answers[0]}</answer>"],
    }
    trajectories, engine, calls, _ = rollout(gemma_tokenizer, retriever, scripts, [single, two_hop], group_size=2)
    assert engine.batch_sizes == [4, 4, 2]  # one engine call per turn with every active trajectory
    assert calls == [[title] * 2 + [hop1] * 2, [hop2] * 2]
    assert [(t.uid, t.sample_index) for t in trajectories] == [
        (single.uid, 0), (single.uid, 1), (two_hop.uid, 0), (two_hop.uid, 1)]
    first, second = trajectories[0], trajectories[2]
    assert (first.answer, first.reward, first.finished, first.num_actions) == (single.golden_answers[0], 1.0, True, 2)
    assert (second.answer, second.reward, second.num_actions) == (two_hop.golden_answers[0], 1.0, 3)
    assert "trailing text" not in second.response_text  # generation stopped at </search>
    for turn, hop in zip(second.retrieval_turns, gold[two_hop.uid], strict=True):
        assert turn.prefix_text.endswith(f"<search> {turn.query} </search>")
        assert (turn.retriever_version, turn.policy_version, len(turn.doc_ids), len(turn.shown_ids)) == (3, 4, 4, 2)
        found = retriever.client.retrieve([turn.query])[0]  # the turn logs what the retriever returned (batched then)
        assert (turn.doc_ids, turn.shown_ids) == (found.doc_ids, [p.id for p in found.shown])
        assert turn.scores == pytest.approx(found.scores, abs=1e-5)
        assert hop in turn.doc_ids and turn.scores == sorted(turn.scores, reverse=True)  # the title finds its passage
    assert all(t.policy_version == 4 for t in trajectories)
    for t in trajectories:  # sampler log-probs sit exactly on the generated tokens
        assert [lp for lp, m in zip(t.logprobs, t.action_mask, strict=True) if m] == [LOGP] * sum(t.action_mask)


def test_invalid_actions_get_a_corrective_observation_and_count_as_turns(gemma_tokenizer, retriever):
    scripts = {"Where was Ada born?": ["I think it is Valmora.", "<search></search>", "<answer> Valmora </answer>"]}
    (t,), _, calls, agent = rollout(gemma_tokenizer, retriever, scripts, [record("Where was Ada born?")])
    runs = segments(t)
    observations = [t.token_ids[a:b] for a, b, k in runs if k < 0]
    assert observations == [agent.renderer.corrective_ids] * 2 and calls == []
    assert (t.num_actions, t.answer, t.reward) == (3, "Valmora", 1.0)

    scripts = {"Where was Ada born?": ["no tags", "still none", "<answer> Valmora </answer>"]}
    (t,), *_ = rollout(gemma_tokenizer, retriever, scripts, [record("Where was Ada born?")], max_turns=1)
    assert (t.num_actions, t.answer, t.reward, t.finished) == (2, None, 0.0, False)  # out of turns


def test_invalid_actions_are_counted_however_the_turn_ends(gemma_tokenizer, retriever):
    scripts = {
        "Where was Ada born?": ["no tags", "<search></search>", "<answer> Valmora </answer>"],  # corrected twice
        "Capital of Estland?": ["<search> Estland </search>", "I give up.<eos>"],  # EOS without an action
        "Who wrote Hamlet?": ["<search> Hamlet </search>", "<search> author </search>", "no tags"],  # last turn
    }
    questions = [record(q) for q in scripts]
    trajectories, *_ = rollout(gemma_tokenizer, retriever, scripts, questions)
    assert [(t.num_actions, t.invalid_actions) for t in trajectories] == [(3, 2), (2, 1), (3, 1)]


def test_turn_limits_eos_and_action_budget(gemma_tokenizer, retriever):
    scripts = {"Where was Ada born?": ["<search> Ada </search>", "<search> again </search>", "<answer> x </answer>"]}
    (t,), _, calls, _ = rollout(gemma_tokenizer, retriever, scripts, [record("Where was Ada born?")], max_turns=1)
    assert calls == [["Ada"]] and (t.num_actions, t.answer, len(t.retrieval_turns)) == (2, None, 1)

    scripts = {"Where was Ada born?": ["I will not answer.<eos>", "<answer> Valmora </answer>"]}
    (t,), *_ = rollout(gemma_tokenizer, retriever, scripts, [record("Where was Ada born?")])
    assert (t.num_actions, t.answer, t.token_ids[-1]) == (1, None, gemma_tokenizer.eos_token_id)

    long = "<think>" + "very " * 60 + "</think> <answer> Valmora </answer>"
    scripts = {"Where was Ada born?": [long, "<answer> Valmora </answer>"]}
    (t,), _, _, agent = rollout(gemma_tokenizer, retriever, scripts, [record("Where was Ada born?")])
    first = segments(t)[0]
    assert first[1] - first[0] == 40  # cut at max_action_length, then corrected
    assert t.token_ids[first[1] : first[1] + len(agent.renderer.corrective_ids)] == agent.renderer.corrective_ids
    assert t.answer == "Valmora"


def test_response_budget_truncates_observations_never_the_question(gemma_tokenizer, retriever):
    scripts = {"Where was Ada born?": ["<search> Ada Rowntree </search>", "<answer> Valmora </answer>"]}
    question = [record("Where was Ada born?")]
    (t,), *_ = rollout(gemma_tokenizer, retriever, scripts, question, max_response_length=60,
                       max_action_length=40, max_observation_length=80)
    assert t.truncated and t.done and t.answer is None and t.response_length == 60
    obs = next((a, b) for a, b, k in segments(t) if k < 0)
    assert gemma_tokenizer.decode(t.token_ids[obs[0] : obs[1]]).endswith("</information>\n\n")
    assert "Q: Where was Ada born?\n" in gemma_tokenizer.decode(t.token_ids[: t.prompt_length])

    # No room for even the tags of the observation after the search: the retriever is not called at all.
    n_action = len(gemma_tokenizer("<search> Ada Rowntree </search>", add_special_tokens=False).input_ids)
    tags = ObservationRenderer(gemma_tokenizer, 80).overhead
    (t,), _, calls, _ = rollout(gemma_tokenizer, retriever, scripts, question, max_response_length=n_action + tags,
                                max_action_length=n_action)
    assert t.truncated and calls == [] and t.retrieval_turns == [] and t.response_length == n_action

    with pytest.raises(ValueError, match=r"test/Where.*max_prompt_length \(5\).*never truncated"):
        rollout(gemma_tokenizer, retriever, scripts, question, max_prompt_length=5)


def test_an_example_answer_in_the_prompt_never_counts(gemma_tokenizer, retriever):
    template = PromptTemplate("Example: Q: who wrote Hamlet?\n<answer> William Shakespeare </answer>\nQ: {question}\n")
    scripts = {"Who wrote Hamlet?": ["<search> Hamlet </search>", "I do not know.<eos>"]}
    (t,), *_ = rollout(gemma_tokenizer, retriever, scripts, [record("Who wrote Hamlet?", ["William Shakespeare"])],
                       template=template)
    prompt_text = gemma_tokenizer.decode(t.token_ids[: t.prompt_length])
    assert extract_answer(prompt_text + t.response_text) == "William Shakespeare"  # what a prompt-reading reward saw
    assert (t.answer, t.reward) == (None, 0.0)


def test_collate_pads_and_aligns(gemma_tokenizer, retriever):
    scripts = {"Where was Ada born?": ["<search> Ada </search>", "<answer> Valmora </answer>"],
               "Capital of Estland?": ["<answer> Kessington </answer>"]}
    trajectories, *_ = rollout(gemma_tokenizer, retriever, scripts,
                               [record("Where was Ada born?"), record("Capital of Estland?")])
    batch = collate(trajectories, pad_token_id=0)
    width = max(len(t.token_ids) for t in trajectories)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {k: (2, width) for k in batch}
    for row, t in enumerate(trajectories):
        n = len(t.token_ids)
        assert batch["input_ids"][row, :n].tolist() == t.token_ids and batch["attention_mask"][row].sum() == n
        assert batch["action_mask"][row, :n].tolist() == t.action_mask and batch["action_mask"][row, n:].sum() == 0
        assert batch["old_logp"][row, :n].tolist() == t.logprobs and batch["turn_ids"][row, :n].tolist() == t.turn_ids
        assert (batch["turn_ids"][row, n:] == -1).all() and (batch["input_ids"][row, n:] == 0).all()
    with pytest.raises(ValueError, match="at least one"):
        collate([], 0)


def test_shown_with_gold_replaces_the_lowest_ranked_others_at_a_drawn_slot():
    a, b, c, x, y = (Passage(i, i, f"text {i}") for i in "abcxy")
    assert shown_with_gold([a, b, c], [b], "q") == [a, b, c]  # already shown: nothing moves
    for salt in map(str, range(20)):
        one = shown_with_gold([a, b, c], [x], salt)
        assert sorted(p.id for p in one) == ["a", "b", "x"] and one == shown_with_gold([a, b, c], [x], salt)
        assert sorted(p.id for p in shown_with_gold([a, b, c], [x, y], salt)) == ["a", "x", "y"]
        assert shown_with_gold([a, b, c], [c, x], salt)[2] in (c, x)  # a shown gold passage is never displaced
    # the evidence does not always sit last (the warm-up learned that shortcut when it did)
    assert {[p.id for p in shown_with_gold([a, b, c], [x], str(s))].index("x") for s in range(20)} == {0, 1, 2}


def test_oracle_rollout_shows_the_gold_passages_at_every_search(gemma_tokenizer, retriever, world_questions):
    """``eval.oracle_retrieval``: a search that misses the evidence still shows it, in place of the lowest-ranked
    passage, moved to a slot drawn from the question."""
    question = next(q for q in world_questions if q.metadata["type"] == "two_hop")
    scripts = {question.question: ["<search> weather tomorrow </search>", "<search> rivers </search>",
                                   "<answer> x </answer>"]}
    agent = SearchAgent(ScriptedEngine(gemma_tokenizer, scripts), retriever, gemma_tokenizer, settings(), TEMPLATE)
    gold = gold_passages([question], retriever.passages)
    [plain] = agent.rollout([question], 1)
    [oracle] = agent.rollout([question], 1, gold=gold)
    ids = [p.id for p in gold[question.uid]]
    assert not all(set(ids) <= set(turn.shown_ids) for turn in plain.retrieval_turns)  # the searches miss
    for turn, (before, after) in enumerate(zip(plain.retrieval_turns, oracle.retrieval_turns, strict=True)):
        assert after.doc_ids == before.doc_ids  # the candidates stay the retriever's
        assert set(ids) <= set(after.shown_ids) and len(after.shown_ids) == len(before.shown_ids)
        expected = shown_with_gold(retriever.passages(before.doc_ids[:2]), gold[question.uid], f"{question.uid}/{turn}")
        assert after.shown_ids == [p.id for p in expected]
    assert all(f"(Title: {p.title})" in oracle.response_text for p in gold[question.uid])


def test_oracle_needs_gold_passages():
    with pytest.raises(DataError, match=r"eval.oracle_retrieval: question test/Where .*gold_doc_ids"):
        gold_passages([record("Where was Ada born?")], lambda ids: [])
