"""The plain values that flow between components."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Passage:
    """One retrievable passage (about 100 words) with its title."""

    id: str
    title: str
    text: str
    score: float | None = None

    def contents(self) -> str:
        """FlashRAG / Search-R1 `contents` form: quoted title line, then the text."""
        return f'"{self.title}"\n{self.text}'

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Question:
    """One benchmark or training question with every accepted gold answer."""

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = field(default=())
    type: str = ""
    source: str = ""
    # The facts the answer rests on, one sentence per supporting passage in hop order ("The
    # director of X is Y.": 2WikiMultihopQA's evidence triples in words); gold SFT trajectories
    # state them.
    evidence: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["answers"] = list(self.answers)
        d["supporting_ids"] = list(self.supporting_ids)
        d["evidence"] = list(self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Question":
        return cls(
            id=str(d["id"]),
            question=d["question"],
            answers=tuple(d["answers"]),
            supporting_ids=tuple(d.get("supporting_ids", ())),
            type=d.get("type", ""),
            source=d.get("source", ""),
            evidence=tuple(d.get("evidence", ())),
        )
