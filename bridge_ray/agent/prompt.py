"""The instruction prompt that teaches the search protocol, and its tokenisation.

A template is plain text with ``{question}`` (required), ``{max_turns}`` and ``{options}`` (optional)
placeholders; literal braces are written ``{{`` and ``}}``. ``{options}`` holds a multiple-choice question's
options (``metadata["options"]``, letter -> text), one ``A. text`` line each: ``eval --suite mirage`` uses it. It
comes from the built-in :data:`DEFAULT_TEMPLATE` or a file (``policy.prompt_template``). When the tokenizer has a
chat template and ``policy.chat_template`` allows it, the filled template becomes the single user message of a
chat with the generation prompt appended.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ChatTemplateMode = Literal["auto", "always", "never"]

DEFAULT_TEMPLATE = (
    "You answer questions with the help of a search engine. Work in steps. Reason privately between "
    "<think> and </think> whenever you need to. To look something up, write a query between <search> and "
    "</search>; the system replies with the top passages between <information> and </information>. You may "
    "search up to {max_turns} times. Once you know the answer, write it between <answer> and </answer> as a "
    "few words only, without explanation, for example <answer> Marie Curie </answer>.\n"
    "Question: {question}\n"
)
# A few-shot variant that demonstrates the protocol: small base models (Gemma 3 270M) follow a demonstration,
# not instructions. Select it with policy.prompt_template.
FEW_SHOT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "few_shot.txt"
_FIELDS = {"question", "max_turns", "options"}


@dataclass(frozen=True)
class PromptTemplate:
    """A validated template; ``source`` names where it came from for error messages."""

    text: str
    source: str = "built-in template"

    def __post_init__(self) -> None:
        try:
            fields = self.placeholders
        except ValueError as exc:
            raise ValueError(
                f"{self.source}: malformed template ({exc}); write literal braces as {{{{ and }}}}"
            ) from None
        if "question" not in fields:
            raise ValueError(f"{self.source}: the template has no {{question}} placeholder")
        unknown = sorted(fields - _FIELDS)
        if unknown:
            raise ValueError(f"{self.source}: unknown placeholders {unknown}; allowed: {sorted(_FIELDS)}")

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt template file {path} does not exist")
        return cls(path.read_text(), source=str(path))

    @classmethod
    def load(cls, path: str | Path | None) -> PromptTemplate:
        """The template of ``policy.prompt_template``: the file when given, else the built-in one."""
        return cls(DEFAULT_TEMPLATE) if path is None else cls.from_file(path)

    @property
    def placeholders(self) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(self.text) if name is not None}

    def render(self, question: str, max_turns: int, options: Mapping[str, str] | None = None) -> str:
        """The filled template; ``options`` is read only by a template that shows them."""
        shown = format_options(options or {}) if "options" in self.placeholders else ""
        return self.text.format(question=question, max_turns=max_turns, options=shown)


def format_options(options: Mapping[str, str]) -> str:
    """One ``A. text`` line per option, in the given order."""
    return "\n".join(f"{letter}. {text}" for letter, text in options.items())


def prompt_token_ids(
    tokenizer: PreTrainedTokenizerBase,
    template: PromptTemplate,
    question: str,
    max_turns: int,
    chat_template: ChatTemplateMode = "auto",
    options: Mapping[str, str] | None = None,
) -> list[int]:
    """Token ids of the full prompt, special tokens (BOS, chat markup) included exactly once."""
    text = template.render(question, max_turns, options)
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "always" and not has_chat:
        raise ValueError("policy.chat_template is 'always' but the tokenizer has no chat template")
    if has_chat and chat_template != "never":
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(chat, add_special_tokens=False).input_ids)
    return list(tokenizer(text).input_ids)
