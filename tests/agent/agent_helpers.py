"""Helpers of the agent tests: tiny random Gemma 3 policies, a Ray-actor engine proxy, the production retriever
recording its calls, and the structural checks every rollout trajectory must pass."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from bridge_ray.agent.protocol import Action, ObservationRenderer, parse_action
from bridge_ray.agent.reward import exact_match, extract_answer
from bridge_ray.agent.types import Trajectory
from bridge_ray.retrieval.client import RetrieverClient
from bridge_ray.retrieval.types import Passage, RetrievalResult


def tiny_gemma(vocab_size: int, seed: int = 0, sliding_window: int = 8) -> torch.nn.Module:
    """A 4-layer random Gemma 3 (alternating sliding and full attention, window ``sliding_window``)."""
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=sliding_window, max_position_embeddings=4096,
        layer_types=["sliding_attention", "full_attention"] * 2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


class RecordingRetriever:
    """The :class:`RetrieverClient` the samplers use, recording every batch of queries the agent sends (one call
    per turn)."""

    def __init__(self, client: RetrieverClient) -> None:
        self.client, self.calls = client, []

    def retrieve(self, queries: list[str]) -> list[RetrievalResult]:
        self.calls.append(list(queries))
        return self.client.retrieve(queries)

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        return self.client.passages(ids)


def segments(t: Trajectory) -> list[tuple[int, int, int]]:
    """``(start, end, turn id)`` of the maximal runs of the response with one mask value and one turn id."""
    runs, start = [], t.prompt_length
    for i in range(t.prompt_length + 1, len(t.token_ids) + 1):
        if i == len(t.token_ids) or (t.action_mask[i], t.turn_ids[i]) != (t.action_mask[start], t.turn_ids[start]):
            runs.append((start, i, t.turn_ids[start]))
            start = i
    return runs


def check_trajectory(
    t: Trajectory, tokenizer, renderer: ObservationRenderer, max_response_length: int, retriever: RecordingRetriever
) -> None:
    """Every structural promise of a trajectory, checked from its token ids and the corpus alone."""
    n = len(t.token_ids)
    assert len(t.action_mask) == len(t.logprobs) == len(t.turn_ids) == n
    assert set(t.action_mask[: t.prompt_length]) <= {0} and set(t.turn_ids[: t.prompt_length]) <= {-1}
    assert t.response_length <= max_response_length
    runs = segments(t)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    # Decoding the action and observation segments one by one reproduces the response text.
    assert "".join(decode(t.token_ids[a:b]) for a, b, _ in runs) == t.response_text
    assert decode(t.token_ids[t.prompt_length :]) == t.response_text
    actions = [(a, b, k) for a, b, k in runs if k >= 0]
    assert [k for _, _, k in actions] == list(range(t.num_actions))
    turns = iter(t.retrieval_turns)
    for a, b, k in runs:
        if k >= 0:
            assert all(t.action_mask[i] == 1 and t.logprobs[i] <= 0 for i in range(a, b))
            continue
        assert all(t.action_mask[i] == 0 and t.logprobs[i] == 0.0 for i in range(a, b))
        inserted = t.token_ids[a:b]
        if inserted == renderer.corrective_ids:
            continue
        turn = next(turns)  # otherwise it is the documents of the next retrieval turn, exactly as rendered
        assert turn.prefix_ids == t.token_ids[:a] and turn.prefix_text == decode(turn.prefix_ids)
        action_text = decode(t.token_ids[actions[turn.action_index][0] : actions[turn.action_index][1]])
        assert actions[turn.action_index][1] == a and parse_action(action_text) == Action("search", turn.query)
        docs = retriever.passages(turn.doc_ids[: len(turn.shown_ids)])  # the shown m are the first candidates
        assert [p.id for p in docs] == turn.shown_ids
        assert inserted == renderer.documents(docs, budget=max_response_length - (a - t.prompt_length))[0]
    assert next(turns, None) is None
    if t.finished:  # the answer is the content of the final action, read from generated tokens only
        last_text = decode(t.token_ids[actions[-1][0] : actions[-1][1]])
        assert parse_action(last_text) == Action("answer", t.answer) and extract_answer(last_text) == t.answer
    else:
        assert t.answer is None
    assert t.reward == exact_match(t.answer, t.golden_answers)



class ActorEngine:
    """The generation-engine interface over a Ray actor that holds the real engine (how samplers will hold it)."""

    def __init__(self, handle) -> None:
        self.handle = handle

    @property
    def weight_version(self) -> int:
        import ray

        return ray.get(self.handle.weight_version.remote())

    def __getattr__(self, name):
        import ray

        method = getattr(self.handle, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


def action_ends_properly(t: Trajectory, tokenizer, max_action_length: int, stop: tuple[str, ...]) -> None:
    """Every action segment ends at the token completing a stop string, at EOS, or at its token budget."""
    for a, b, k in segments(t):
        if k < 0:
            continue
        text, before = tokenizer.decode(t.token_ids[a:b]), tokenizer.decode(t.token_ids[a : b - 1])
        hit = [s for s in stop if s in text]
        if hit:
            assert not any(s in before for s in stop), f"generation ran past a stop string: {text!r}"
        else:
            at_budget = b - a == max_action_length or b - t.prompt_length == len(t.token_ids) - t.prompt_length
            assert t.token_ids[b - 1] == tokenizer.eos_token_id or at_budget, f"turn ended early: {text!r}"


def teacher_forced_logprobs(model, token_ids: list[int], mask: list[int]) -> torch.Tensor:
    """``log p(token | prefix)`` of the tokens where ``mask`` is 1, from one plain forward of ``model`` (logits
    are only computed where needed: the vocabulary is 262k)."""
    from bridge_ray.algo.logprob import token_log_probs

    targets = torch.tensor([i for i, m in enumerate(mask) if m and i > 0])
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, logits_to_keep=targets - 1).logits
    return token_log_probs(logits, ids[:, targets])[0]
