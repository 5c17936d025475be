"""The judge's two backends: any OpenAI-compatible chat-completions server, and an in-process transformers model.

The server backend (``vllm serve``, or a hosted model) is what the paper's numbers need; the local one is the
offline default, so the whole pipeline runs without network. Both expose ``identity`` (what the judgment cache is
keyed by: kind, model, generation settings — not the URL, so one model behind another host reuses the cache).
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
from typing import Any

import httpx
import torch

from bridge_ray.config import ConfigError, JudgeConfig
from bridge_ray.engines.models import load_causal_lm, load_tokenizer, pad_token_id
from bridge_ray.model_paths import PACKAGED_GEMMA

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_BACKOFF_CAP_S = 60.0
_MAX_RETRY_AFTER_S = 300.0
_BODY_SNIPPET = 300


class JudgeRequestError(RuntimeError):
    """The server refused a request or gave up after the retries; the message holds its status and reply."""


def _retry_after(response: httpx.Response) -> float | None:
    """The server's ``Retry-After`` in seconds (delta or HTTP date), capped; None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def _content(response: httpx.Response) -> str:
    """The first choice's message text ("" when the model wrote none, e.g. its budget went to reasoning)."""
    try:
        return response.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeRequestError(f"not a chat completion: {response.text[:_BODY_SNIPPET]!r}") from None


class OpenAIJudge:
    """``POST <base_url>/chat/completions``, safe to call from many threads (one pooled httpx client).

    Connection errors, 429 and 5xx are retried ``max_retries`` times, waiting what ``Retry-After`` says or else
    an exponential backoff with jitter (``backoff_s`` · 2^attempt, at most a minute); other errors fail at once.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        *,
        max_tokens: int = 512,
        temperature: float | None = 0.0,
        extra_body: dict[str, Any] | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        concurrency: int = 8,
        backoff_s: float = 1.0,
    ) -> None:
        self.identity: dict[str, Any] = dict(
            kind="openai", model=model, max_tokens=max_tokens, temperature=temperature, extra_body=extra_body or {}
        )
        self.max_retries, self.backoff_s = max_retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=concurrency),
        )

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> OpenAIJudge:
        if cfg.model is None:
            raise ConfigError("judge.model: name the served model for the openai backend")
        return cls(
            cfg.model,
            cfg.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            os.environ.get(cfg.api_key_env),
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            extra_body=cfg.extra_body,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            concurrency=cfg.concurrency,
        )

    def complete(self, messages: list[dict[str, str]]) -> str:
        body = {
            "model": self.identity["model"],
            "messages": messages,
            # OpenAI's current name for the output limit (max_tokens is refused by its reasoning models); vLLM reads it
            "max_completion_tokens": self.identity["max_tokens"],
            **({} if self.identity["temperature"] is None else {"temperature": self.identity["temperature"]}),
            **self.identity["extra_body"],
        }
        attempt = 0
        while True:
            wait = None
            try:
                response = self._client.post("chat/completions", json=body)
            except httpx.TransportError as exc:
                failure = JudgeRequestError(f"{type(exc).__name__}: {exc}")
            else:
                if not response.is_error:
                    return _content(response)
                failure = JudgeRequestError(f"HTTP {response.status_code}: {response.text[:_BODY_SNIPPET]!r}")
                if response.status_code != 429 and response.status_code < 500:
                    raise failure  # a bad request or key: asking again cannot help
                wait = _retry_after(response)
            if attempt == self.max_retries:
                raise JudgeRequestError(f"gave up after {attempt + 1} attempts: {failure}")
            time.sleep(wait if wait is not None else self._backoff(attempt))
            attempt += 1

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * 2**attempt, _BACKOFF_CAP_S) * random.uniform(0.5, 1.0)


class LocalJudge:
    """A causal LM in this process (the packaged Gemma by default), greedy unless ``temperature`` > 0.

    One generation at a time (a lock): threads would only fight over the same cores.
    """

    def __init__(self, model: str, *, max_tokens: int = 512, temperature: float = 0.0) -> None:
        self.identity: dict[str, Any] = dict(kind="local", model=model, max_tokens=max_tokens, temperature=temperature)
        self._tokenizer = load_tokenizer(model)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self._model = load_causal_lm(model).to(device)
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> LocalJudge:
        return cls(cfg.model or PACKAGED_GEMMA, max_tokens=cfg.max_tokens, temperature=cfg.temperature or 0.0)

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's rendering when the tokenizer has one; a base model gets the turns as plain text."""
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False).input_ids)
        text = "\n\n".join(m["content"] for m in messages) + "\n\nJSON verdict:\n"
        return list(tok(text).input_ids)

    def complete(self, messages: list[dict[str, str]]) -> str:
        device = next(self._model.parameters()).device
        ids = torch.tensor([self._prompt_ids(messages)], device=device)
        temperature = self.identity["temperature"]
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with self._lock, torch.inference_mode():
            out = self._model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.identity["max_tokens"],
                pad_token_id=pad_token_id(self._tokenizer),
                **sampling,
            )
        return self._tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
