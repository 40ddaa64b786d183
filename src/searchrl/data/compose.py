"""`searchrl data compose`: a training set drawn from buckets and sources in given counts (docs/guides/data-selection.md;
the paper's Stage 1 = 200 HotpotQA + 150 2WikiMultiHopQA Medium questions, Stage 2 = Medium +
Difficult).

Each part names a dataset (a bucket file of `searchrl data select`, any question file or catalog
name), optionally narrows it to some question types or sources, and takes `count` of its
questions at random (all of them when `count` is null). The parts are joined and, by default,
shuffled. The same seed and inputs write the same file, byte for byte. The output is a question
file: `stage1.dataset: runs/stage1.jsonl` trains on it.

Asking a part for more questions than it holds is an error that says how many it has; a part
that takes all of an empty bucket file contributes nothing (a small run may have no Difficult
question), with a note. A question id drawn by two parts is an error: the parts overlap.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pydantic import Field, model_validator

from searchrl.config import StrictModel
from searchrl.data.types import Question
from searchrl.errors import SearchRLError, listing


class ComposePart(StrictModel):
    """One source of questions and how many to take from it."""

    dataset: str = Field(
        description="Questions to draw from: a bucket file of `searchrl data select` (OUT/medium.jsonl), any question "
        "file, a catalog name or hf:NAME."
    )
    count: int | None = Field(
        None, ge=1, description="How many to draw at random; null = all of them."
    )
    question_types: list[str] | None = Field(
        None, description="Keep only these question types (Question.type); null = all."
    )
    sources: list[str] | None = Field(
        None,
        description="Keep only questions whose `source` is one of these (a selection run over mixed data); null = all.",
    )

    def label(self) -> str:
        filters = [
            f"{name}={','.join(v)}"
            for name, v in (("types", self.question_types), ("sources", self.sources))
            if v
        ]
        return self.dataset + (f" [{'; '.join(filters)}]" if filters else "")


class ComposeConfig(StrictModel):
    """A composed training set. `searchrl data compose --take DATASET[=COUNT] ... --out FILE`."""

    parts: list[ComposePart] = Field(
        default_factory=list, description="Where the questions come from, in order."
    )
    seed: int = Field(
        0, description="Seeds which questions are drawn and the order they are written in."
    )
    shuffle: bool = Field(
        True, description="Shuffle the joined parts; false keeps them part after part."
    )
    out: str | None = Field(None, description="Question file (.jsonl) to write.")

    @model_validator(mode="after")
    def _check(self) -> ComposeConfig:
        if not self.parts:
            raise ValueError(
                "no parts: give --take DATASET[=COUNT] (repeatable) or `parts:` in the config file"
            )
        return self


def parse_take(text: str) -> dict:
    """A `--take` value as a part: `DATASET[=COUNT]`, COUNT a number or `all`.

    >>> parse_take("runs/select/medium.jsonl=200")
    {'dataset': 'runs/select/medium.jsonl', 'count': 200}
    >>> parse_take("toyworld:train")
    {'dataset': 'toyworld:train', 'count': None}
    """
    dataset, sep, count = text.rpartition("=")
    if not sep:
        return {"dataset": text, "count": None}
    if count == "all":
        return {"dataset": dataset, "count": None}
    if not count.isdigit() or int(count) < 1:
        raise SearchRLError(
            f"--take {text!r}: after '=' comes how many questions to take (a number >= 1, or all)"
        )
    return {"dataset": dataset, "count": int(count)}


def _pool(part: ComposePart, where: str) -> list[Question]:
    """The questions a part may draw from, in file order."""
    from searchrl.data.catalog import load_dataset

    path = Path(part.dataset).expanduser()
    if path.is_file() and not path.read_text(encoding="utf-8").strip():
        questions = []  # an empty bucket of `data select`
    else:
        try:
            questions = load_dataset(part.dataset)
        except SearchRLError as exc:
            raise SearchRLError(f"{where}: {exc}") from None
    if part.question_types is not None:
        questions = [q for q in questions if q.type in part.question_types]
    if part.sources is not None:
        questions = [q for q in questions if q.source in part.sources]
    return questions


def compose(cfg: ComposeConfig) -> tuple[list[Question], list[dict]]:
    """The composed questions, and per part what it held and gave (for the table)."""
    rng = random.Random(cfg.seed)
    chosen: list[Question] = []
    rows = []
    for i, part in enumerate(cfg.parts):
        where = f"parts[{i}] ({part.label()})"
        pool = _pool(part, where)
        if part.count is not None and part.count > len(pool):
            raise SearchRLError(
                f"{where}: asks for {part.count} questions but holds {len(pool)}; lower its count, or drop it to take all"
            )
        taken = pool if part.count is None else rng.sample(pool, part.count)
        rows.append({"part": part.label(), "available": len(pool), "taken": len(taken)})
        chosen.extend(taken)
    seen: set[str] = set()
    dupes = [q.id for q in chosen if q.id in seen or seen.add(q.id)]
    if dupes:
        raise SearchRLError(
            f"question ids {listing(dupes)} are drawn by more than one part; parts must not overlap (narrow them with "
            "question_types or sources, or give each question its own id)"
        )
    if not chosen:
        raise SearchRLError(
            "the parts hold no questions: nothing to compose (are the bucket files empty?)"
        )
    if cfg.shuffle:
        rng.shuffle(chosen)
    return chosen, rows


def compose_command(
    config: str | None, overrides: list[str], takes: list[str], flags: dict
) -> list[Question]:
    """`searchrl data compose`: YAML file, `--set` overrides, then `--take` parts and flags win."""
    from rich.console import Console

    from searchrl.config import flag_overrides, load_config
    from searchrl.tables import Column, print_table

    if takes:
        flags = {**flags, "parts": [parse_take(t) for t in takes]}
    cfg = load_config(ComposeConfig, config, list(overrides) + flag_overrides(flags, overrides))
    if cfg.out is None:
        raise SearchRLError("no output file: give --out FILE.jsonl")
    questions, rows = compose(cfg)
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "".join(json.dumps(q.to_dict(), ensure_ascii=False) + "\n" for q in questions),
        encoding="utf-8",
    )
    console = Console()
    print_table(console, [Column("part", wrap=True), Column("available", right=True), Column("taken", right=True)],
                [[row["part"], str(row["available"]), str(row["taken"])] for row in rows],
                title=f"{out}: {len(questions)} questions (seed {cfg.seed})")
    for row in rows:
        if row["available"] == 0:
            console.print(f"note: {row['part']} holds no questions; it adds none", highlight=False)
    return questions
