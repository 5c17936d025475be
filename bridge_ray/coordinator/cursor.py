"""Which questions each round trains on, as a resumable cursor over seeded epoch permutations, and where a run
starts in that order."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from bridge_ray.checkpoint import Manifest, load_manifest, restore_rng_state, seed_rng
from bridge_ray.config import Config


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


def loop_start(config: Config, num_questions: int, resumed: Manifest | None) -> QuestionCursor:
    """The data cursor a run starts its rounds with, and this process's RNG (the source of the sampler seeds) set
    to match: the ``resumed`` checkpoint's; else, when the run continues another (``run.continue_from``: a stage
    continues the run it starts from), that checkpoint's, so it draws the questions and seeds after it; else fresh
    from ``run.seed``. A stage of R₁ + R₂ rounds end to end thus draws what one run of R₁ + R₂ rounds draws."""
    state = resumed or (load_manifest(config.run.continue_from) if config.run.continue_from else None)
    cursor = QuestionCursor(num_questions, config.rollout.questions_drawn, config.run.seed)
    if state is not None:
        cursor.load_state_dict(state.data_cursor)
    if state is not None and state.rng:
        restore_rng_state(state.rng)
    else:
        seed_rng(config.run.seed)
    return cursor
