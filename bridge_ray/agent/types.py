"""What a rollout produces: one :class:`Trajectory` per sampled response, and its collation for the learner.

The per-token lists (``token_ids``, ``action_mask``, ``logprobs``, ``turn_ids``) only ever grow together,
through :meth:`Trajectory.add_action` and :meth:`Trajectory.add_observation`, so the mask is decided by who
produced each id at the moment it is inserted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class RetrievalTurn:
    """One search of a trajectory, with everything the retriever update and the answer scorer need.

    ``prefix_ids`` is h_t: the trajectory's ids up to and including this turn's ``</search>`` action.
    ``doc_ids``/``scores`` are the k candidates and their scores under ``retriever_version``; ``shown_ids``
    the passages that were inserted; ``policy_version`` the weights that wrote the query.
    """

    action_index: int
    prefix_ids: list[int]
    prefix_text: str
    query: str
    doc_ids: list[int]
    scores: list[float]
    shown_ids: list[str]
    retriever_version: int
    policy_version: int


@dataclass
class Trajectory:
    uid: str
    question: str
    golden_answers: list[str]
    sample_index: int
    token_ids: list[int]
    prompt_length: int
    action_mask: list[int]
    logprobs: list[float]
    turn_ids: list[int]
    policy_version: int
    retrieval_turns: list[RetrievalTurn] = field(default_factory=list)
    response_text: str = ""
    answer: str | None = None
    reward: float = 0.0
    finished: bool = False  # ended with a complete <answer>
    truncated: bool = False  # ran out of response budget
    done: bool = False
    num_actions: int = 0
    invalid_actions: int = 0  # actions that parsed as neither a search nor an answer

    @classmethod
    def start(
        cls, uid: str, question: str, golden_answers: list[str], sample_index: int, prompt_ids: Sequence[int],
        policy_version: int,
    ) -> Trajectory:
        n = len(prompt_ids)
        return cls(
            uid=uid, question=question, golden_answers=list(golden_answers), sample_index=sample_index,
            token_ids=list(prompt_ids), prompt_length=n, action_mask=[0] * n, logprobs=[0.0] * n,
            turn_ids=[-1] * n, policy_version=policy_version,
        )

    @property
    def response_length(self) -> int:
        return len(self.token_ids) - self.prompt_length

    def add_action(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Append one generated segment (mask 1, its sampler log-probs, the next action index)."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} generated tokens but {len(logprobs)} log-probs")
        self.token_ids.extend(token_ids)
        self.action_mask.extend([1] * len(token_ids))
        self.logprobs.extend(logprobs)
        self.turn_ids.extend([self.num_actions] * len(token_ids))
        self.num_actions += 1

    def add_observation(self, token_ids: Sequence[int]) -> None:
        """Append system-inserted ids (mask 0, log-prob 0, turn id -1)."""
        self.token_ids.extend(token_ids)
        self.action_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))
        self.turn_ids.extend([-1] * len(token_ids))


def collate(trajectories: Sequence[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``[N, T]`` tensors for the learner.

    ``old_logp[:, t]`` is the sampler's ``log p(input_ids[:, t] | input_ids[:, <t])`` (0 where not generated),
    so it lines up with ``token_log_probs(logits[:, :-1], input_ids[:, 1:])`` after dropping column 0.
    ``turn_ids`` is -1 outside action tokens (see :func:`bridge_ray.algo.aggregate.aggregation_weights`).
    """
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    out = {
        "input_ids": torch.full((n, width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((n, width), dtype=torch.long),
        "action_mask": torch.zeros((n, width), dtype=torch.long),
        "old_logp": torch.zeros((n, width), dtype=torch.float32),
        "turn_ids": torch.full((n, width), -1, dtype=torch.long),
    }
    for row, t in enumerate(trajectories):
        length = len(t.token_ids)
        out["input_ids"][row, :length] = torch.tensor(t.token_ids)
        out["attention_mask"][row, :length] = 1
        out["action_mask"][row, :length] = torch.tensor(t.action_mask)
        out["old_logp"][row, :length] = torch.tensor(t.logprobs, dtype=torch.float32)
        out["turn_ids"][row, :length] = torch.tensor(t.turn_ids)
    return out


@dataclass(frozen=True)
class RetrievalRows:
    """The retriever side of ``L_RAG(θ, η)`` for the policy ranks: ``log ρ_η(d | h_t)`` [M, K] of every logged
    retrieval turn's candidates under one retriever state, in the round's turn order, and their mask. The retriever
    learner sends it, the policy ranks read it: it sits below both roles."""

    log_rho: torch.Tensor
    candidate_mask: torch.Tensor
