"""Which questions a training step sees: a seeded order, epoch after epoch, resumable from a
single number."""

from __future__ import annotations

import numpy as np

from searchrl.data.types import Question
from searchrl.errors import SearchRLError


class PromptSampler:
    """Questions in a seeded order, epoch after epoch. `position` (prompts drawn) is the whole state."""

    def __init__(self, questions: list[Question], seed: int, stage: int, position: int = 0) -> None:
        if not questions:
            raise SearchRLError(f"stage {stage} has no training questions; check stage{stage}.dataset")
        self.questions, self.seed, self.stage, self.position = questions, seed, stage, position
        self._orders: dict[int, np.ndarray] = {}

    def take(self, n: int) -> list[Question]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.questions))
            if epoch not in self._orders:
                rng = np.random.default_rng([self.seed, self.stage, epoch])
                self._orders[epoch] = rng.permutation(len(self.questions))
            out.append(self.questions[int(self._orders[epoch][i])])
            self.position += 1
        return out
