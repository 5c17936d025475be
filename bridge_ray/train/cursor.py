"""Which questions each round trains on, as a resumable cursor over seeded epoch permutations."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass
class QuestionCursor:
    """Walks a fresh seeded permutation of ``num_questions`` per epoch, ``batch_size`` questions at a time.

    Its whole state is ``(epoch, position)``: saved in every checkpoint, it makes a resumed run draw
    exactly the questions an uninterrupted run would have drawn. A batch never straddles two epochs,
    so no question appears twice in one GRPO batch.
    """

    num_questions: int
    batch_size: int
    seed: int = 0
    epoch: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        if self.num_questions < self.batch_size:
            raise ValueError(
                f"the training set has {self.num_questions} questions, fewer than one batch ({self.batch_size})"
            )

    def _order(self) -> torch.Tensor:
        return torch.randperm(self.num_questions, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.num_questions:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order()[self.position : self.position + self.batch_size].tolist()
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"checkpoint data cursor has seed {state['seed']}, the config says {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def __repr__(self) -> str:
        return f"QuestionCursor({asdict(self)})"
