import pytest

from bridge_ray.agent.prompt import DEFAULT_TEMPLATE, PromptTemplate, prompt_token_ids
from bridge_ray.agent.protocol import (
    CORRECTIVE_MESSAGE,
    Action,
    ObservationRenderer,
    format_documents,
    parse_action,
)
from bridge_ray.agent.reward import extract_answer
from bridge_ray.retrieval.types import Passage


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("<think>hmm</think> <search> capital of France </search>", Action("search", "capital of France")),
        ("<answer> Paris </answer>", Action("answer", "Paris")),
        ("<answer></answer>", Action("answer", "")),
        ("<search>  </search>", Action("invalid")),
        ("just rambling", Action("invalid")),
        ("</search> closing without opening", Action("invalid")),
        ("<search> a <search> b </search>", Action("search", "b")),
        ("<answer> x </answer><search> y </search>", Action("answer", "x")),
        ("<search> y </search><answer> x </answer>", Action("search", "y")),
        ("<answer> never closed <search> q </search>", Action("search", "q")),
    ],
)
def test_parse_action_takes_the_first_complete_action(text, action):
    assert parse_action(text) == action


def test_documents_format():
    passages = [Passage("a", "T1", "first"), Passage("b", "T2", "second")]
    assert format_documents(passages) == "Doc 1(Title: T1) first\nDoc 2(Title: T2) second"


def test_corrective_message_cannot_be_read_as_an_action():
    assert parse_action(CORRECTIVE_MESSAGE).kind == "invalid"
    assert extract_answer(CORRECTIVE_MESSAGE) is None


def test_observation_truncation_keeps_the_tags(gemma_tokenizer):
    tok = gemma_tokenizer
    renderer = ObservationRenderer(tok, max_tokens=40)
    long = [Passage("x", "Long", "word " * 200)]
    ids, cut = renderer.documents(long)
    assert cut and len(ids) == 40
    assert ids[: len(renderer.open_ids)] == renderer.open_ids and ids[-len(renderer.close_ids) :] == renderer.close_ids
    text = tok.decode(ids)
    assert text.startswith("\n\n<information>Doc 1(Title: Long) word") and text.endswith("</information>\n\n")
    short_ids, short_cut = renderer.documents([Passage("y", "S", "tiny")])
    assert not short_cut and tok.decode(short_ids) == "\n\n<information>Doc 1(Title: S) tiny</information>\n\n"
    ids, cut = renderer.documents(long, budget=20)  # a smaller remaining budget wins
    assert cut and len(ids) == 20
    with pytest.raises(ValueError, match="cannot hold"):
        renderer.documents(long, budget=renderer.overhead)
    with pytest.raises(ValueError, match="max_observation_length"):
        ObservationRenderer(tok, max_tokens=renderer.overhead)


def test_template_validation(tmp_path):
    assert PromptTemplate(DEFAULT_TEMPLATE).render("Q?", 2).endswith("Question: Q?\n")
    with pytest.raises(ValueError, match=r"no \{question\}"):
        PromptTemplate("no placeholder")
    with pytest.raises(ValueError, match="unknown placeholders"):
        PromptTemplate("{question} {context}")
    bad = tmp_path / "bad.txt"
    bad.write_text("Question: {question")
    with pytest.raises(ValueError, match=r"bad\.txt: malformed"):
        PromptTemplate.from_file(bad)
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        PromptTemplate.load(tmp_path / "missing.txt")
    good = tmp_path / "t.txt"
    good.write_text("{{json}} up to {max_turns} searches. Q: {question}")
    assert PromptTemplate.load(good).render("why?", 3) == "{json} up to 3 searches. Q: why?"


def test_prompt_tokens_plain_and_chat(gemma_tokenizer):
    tok = gemma_tokenizer
    template = PromptTemplate("Q: {question}")
    plain = prompt_token_ids(tok, template, "why?", 2)
    assert plain[0] == tok.bos_token_id and plain.count(tok.bos_token_id) == 1
    assert tok.decode(plain[1:]) == "Q: why?"
    with pytest.raises(ValueError, match="no chat template"):
        prompt_token_ids(tok, template, "why?", 2, chat_template="always")
    tok.chat_template = "{{ bos_token }}{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}<bot>"
    try:
        chat = prompt_token_ids(tok, template, "why?", 2)
        assert tok.decode(chat) == "<bos><u>Q: why?</u><bot>" and chat.count(tok.bos_token_id) == 1
        assert prompt_token_ids(tok, template, "why?", 2, chat_template="never") == plain
    finally:
        tok.chat_template = None
