"""Answer likelihoods ``log p_θ(y | h_t, d)`` for every retrieval turn and each of its k candidates (Appendix A).

The teacher-forced context for turn t and candidate d is exactly what the policy would have seen had the
retriever shown d alone, followed by the opening of an answer::

    h_t  ⊕  <information> block with d alone (same renderer and token budget as the loop)  ⊕  "<answer>"  ⊕  y

and only the tokens of y (tokenised as ``" " + y``, the way the model writes ``<answer> y </answer>``)
are scored. With several golden answers, y is the first one: data sets list the canonical answer first, and
one fixed y keeps ``log p`` comparable across the candidates of a turn. h_t is shared by the k contexts, so
backends compute it once (a KV-cache copy on HF, the prefix cache on vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from bridge_ray.agent.protocol import ANSWER_OPEN, ObservationRenderer
from bridge_ray.agent.types import RetrievalTurn, Trajectory
from bridge_ray.engines.base import GenerationEngine, PrefixGroup
from bridge_ray.retrieval.types import Passage

if TYPE_CHECKING:  # type hints only: the control plane imports these modules without transformers
    from transformers import PreTrainedTokenizerBase

PassageLookup = Callable[[Sequence[int]], Sequence[Passage]]


def answer_group(
    tokenizer: PreTrainedTokenizerBase,
    renderer: ObservationRenderer,
    turn: RetrievalTurn,
    candidates: Sequence[Passage],
    answer: str,
) -> PrefixGroup:
    """The scoring inputs of one retrieval turn: its prefix and one continuation per candidate."""
    opening = list(tokenizer(ANSWER_OPEN, add_special_tokens=False).input_ids)
    answer_ids = list(tokenizer(" " + answer.strip(), add_special_tokens=False).input_ids)
    if not answer_ids:
        raise ValueError(f"the golden answer {answer!r} tokenises to nothing")
    continuations = []
    for passage in candidates:
        continuations.append([*renderer.documents([passage])[0], *opening, *answer_ids])
    return PrefixGroup(turn.prefix_ids, continuations, [len(answer_ids)] * len(continuations))


def answer_groups(
    trajectories: Sequence[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    renderer: ObservationRenderer,
    passages: PassageLookup,
) -> list[tuple[int, int, PrefixGroup]]:
    """``(trajectory index, retrieval-turn index, group)`` for every retrieval turn, in order.

    ``passages(doc_ids)`` returns the corpus passages of the logged candidate ids (the shown m are not
    enough: all k candidates are scored).
    """
    out = []
    for i, t in enumerate(trajectories):
        for j, turn in enumerate(t.retrieval_turns):
            candidates = passages(turn.doc_ids)
            if len(candidates) != len(turn.doc_ids):
                raise ValueError(f"passage lookup returned {len(candidates)} of {len(turn.doc_ids)} candidates")
            out.append((i, j, answer_group(tokenizer, renderer, turn, candidates, t.golden_answers[0])))
    return out


def score_answers(
    engine: GenerationEngine,
    trajectories: Sequence[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    renderer: ObservationRenderer,
    passages: PassageLookup,
) -> tuple[list[list[torch.Tensor]], list[PrefixGroup]]:
    """``log p(y | h_t, d)`` per trajectory, per retrieval turn (a float32 tensor [k] in candidate order), and
    the groups they were scored from, one per retrieval turn in the same order (trajectory by trajectory).

    Turns whose groups are identical (rollouts of one question that issued the same query from the same
    history: a warmed-up policy's first search, mostly) are scored once: a group's likelihoods depend on its
    tokens alone, so each copy gets exactly the scores it would have got on its own.
    """
    groups = answer_groups(trajectories, tokenizer, renderer, passages)
    distinct: dict[tuple, int] = {}
    unique: list[PrefixGroup] = []
    slots = []
    for _, _, group in groups:
        key = (tuple(group.prefix), tuple(map(tuple, group.continuations)), tuple(group.num_scored))
        if key not in distinct:
            distinct[key] = len(unique)
            unique.append(group)
        slots.append(distinct[key])
    unique_scores = engine.continuation_log_probs(unique)
    scores = [unique_scores[k] for k in slots]
    out: list[list[torch.Tensor]] = [[] for _ in trajectories]
    for (i, _, _), s in zip(groups, scores, strict=True):
        out[i].append(s)
    return out, [g for _, _, g in groups]
