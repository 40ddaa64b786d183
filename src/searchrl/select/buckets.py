"""Difficulty buckets of `searchrl data select` (R1-Searcher §4.1): how many rollouts a reference
model needed for its first correct answer decides a question's bucket."""

from __future__ import annotations

from dataclasses import dataclass

BUCKETS = ("easy", "medium", "difficult", "unsolved")


def bucket_of(needed: int | None, medium_from: int = 10, difficult_from: int = 21) -> str:
    """The bucket of a question whose first correct rollout was number `needed` (None: none was).

    >>> [bucket_of(n) for n in (1, 9, 10, 20, 21, None)]
    ['easy', 'easy', 'medium', 'medium', 'difficult', 'unsolved']
    """
    if needed is None:
        return "unsolved"
    if needed < medium_from:
        return "easy"
    return "medium" if needed < difficult_from else "difficult"


@dataclass
class Tally:
    """What the rounds so far found for one question."""

    sampled: int = 0
    correct: int = 0
    first_correct: int | None = None  # 1-based position of the first correct rollout

    def add(self, flags: list[int]) -> None:
        """One round's samples, in order (1 = correct)."""
        if self.first_correct is None and any(flags):
            self.first_correct = self.sampled + flags.index(1) + 1
        self.sampled += len(flags)
        self.correct += sum(flags)

    def needed(self, cap: int) -> int | None:
        """Rollouts to the first correct one, None when none was within `cap`."""
        return (
            self.first_correct
            if self.first_correct is not None and self.first_correct <= cap
            else None
        )

    def done(self, cap: int) -> bool:
        return self.needed(cap) is not None or self.sampled >= cap


def bucket_ranges(medium_from: int, difficult_from: int, cap: int) -> dict[str, str]:
    """Each bucket's counts as people read them, within the cap.

    >>> bucket_ranges(10, 21, 32)
    {'easy': '1-9', 'medium': '10-20', 'difficult': '21-32', 'unsolved': 'none correct in 32'}
    >>> bucket_ranges(10, 21, 16)["difficult"]
    'none (cap 16)'
    """

    def span(lo: int, hi: int) -> str:
        hi = min(hi, cap)
        return f"none (cap {cap})" if lo > hi else f"{lo}-{hi}" if lo < hi else str(lo)

    return {
        "easy": span(1, medium_from - 1),
        "medium": span(medium_from, difficult_from - 1),
        "difficult": span(difficult_from, cap),
        "unsolved": f"none correct in {cap}",
    }
