"""The toy world: a fictional encyclopedia with multi-hop questions over it.

Every name is invented, so no model can answer from memory: the only way to a correct answer
is to search the corpus. Generation is deterministic: the same config gives byte-identical files.

    world = generate(ToyWorldConfig(seed=0))
    write(world, Path("data/toyworld"))  # corpus.jsonl, train.jsonl, test.jsonl, meta.json
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import Field, field_validator

from searchrl.config import StrictModel
from searchrl.data.toyworld.questions import QUESTION_TYPES, Draft, drafts, quotas
from searchrl.data.toyworld.render import render, statement
from searchrl.data.toyworld.world import Builder
from searchrl.data.types import Passage, Question
from searchrl.errors import DataError

__all__ = ["QUESTION_TYPES", "VERSION", "ToyWorld", "ToyWorldConfig", "generate", "to_question", "write"]

# Bump when the same config would give different files, so caches keyed on it can rebuild.
# 2: questions state their evidence, one sentence a hop.
VERSION = 2

DEFAULT_MIX = {"bridge-2hop": 0.32, "bridge-3hop": 0.22, "comparison": 0.24, "bridge-comparison": 0.10,
               "inference": 0.12}


class ToyWorldConfig(StrictModel):
    """Size and seed of a generated toy world."""

    seed: int = Field(0, description="Random seed. The same seed and sizes give byte-identical files.")
    passages: int = Field(3000, ge=100, description=(
        "Target corpus size in passages; the number of entities is derived from it, and the "
        "actual count lands within a few percent."))
    train: int = Field(2000, ge=0, description="Number of training questions.")
    test: int = Field(500, ge=0, description="Number of test questions; none repeats a training question.")
    passage_words: int = Field(100, ge=40, le=300, description=(
        "Target passage length in words (the paper's corpus uses 100-word Wikipedia passages). "
        "Passages run from about 0.6x to 1.3x this."))
    mix: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MIX), description=(
        f"Share of each question type ({', '.join(QUESTION_TYPES)}); shares are normalised, "
        "a missing type gets none."))

    @field_validator("mix")
    @classmethod
    def _known_types(cls, mix: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(mix) - set(QUESTION_TYPES))
        if unknown:
            raise ValueError(f"unknown question types {unknown}; known: {', '.join(QUESTION_TYPES)}")
        if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
            raise ValueError("shares must be >= 0 and not all zero")
        return mix


@dataclass
class ToyWorld:
    config: ToyWorldConfig
    passages: list[Passage]
    train: list[Question]
    test: list[Question]

    def counts(self) -> dict[str, dict[str, int]]:
        """Questions per type in each split, every type listed."""
        return {split: {t: Counter(q.type for q in qs)[t] for t in QUESTION_TYPES}
                for split, qs in (("train", self.train), ("test", self.test))}


def generate(cfg: ToyWorldConfig | None = None) -> ToyWorld:
    """Draw the world, render its passages and pick the questions.

    Raises `DataError` when the world is too small for the questions asked of it.
    """
    cfg = cfg or ToyWorldConfig()
    # Independent streams: changing the question counts must not change the corpus.
    world = Builder(random.Random(f"toyworld:{cfg.seed}:world"), cfg.passages).build()
    rng = random.Random(f"toyworld:{cfg.seed}:render")
    chunks = render(world.entities(), world.cities, rng, cfg.passage_words)
    random.Random(f"toyworld:{cfg.seed}:order").shuffle(chunks)  # ids say nothing about kind
    passages, where = [], {}
    for i, (entity, chunk) in enumerate(chunks):
        pid = f"tw-{i:06d}"
        passages.append(Passage(pid, entity.name, " ".join(chunk.sentences)))
        where.update((f, pid) for f in chunk.facts)
    by_key = {e.key: e for e in world.entities()}

    def state(f: str) -> str:
        key, relation = f.split(":")
        return statement(by_key[key], relation)

    r = random.Random(f"toyworld:{cfg.seed}:questions")
    total = cfg.train + cfg.test
    pool = drafts(world, r, per_pattern=max(20, total // 5))
    train_n, test_n = quotas(cfg.train, cfg.mix), quotas(cfg.test, cfg.mix)
    train: list[Question] = []
    test: list[Question] = []
    for t in QUESTION_TYPES:
        need = train_n[t] + test_n[t]
        if need > len(pool[t]):
            raise DataError(
                f"toy world: {need} {t} questions asked for but the world only supports {len(pool[t])}; "
                f"raise --passages (now {cfg.passages}) or lower --train/--test")
        chosen = r.sample(pool[t], need)
        test += [to_question(d, where, state) for d in chosen[: test_n[t]]]
        train += [to_question(d, where, state) for d in chosen[test_n[t]:]]
    r.shuffle(train)
    r.shuffle(test)
    train = [replace(q, id=f"tw-train-{i:05d}") for i, q in enumerate(train)]
    test = [replace(q, id=f"tw-test-{i:05d}") for i, q in enumerate(test)]
    return ToyWorld(cfg, passages, train, test)


def to_question(d: Draft, where: dict[str, str], state: Callable[[str], str]) -> Question:
    """`where`: fact -> passage id; `state`: fact -> the sentence stating it (`render.statement`)."""
    support = tuple(dict.fromkeys(where[f] for f in d.facts))  # hop order, each passage once
    # A hop's evidence: the statements of its passage's facts (a film's lead sentence can hold two).
    evidence = tuple(" ".join(state(f) for f in d.facts if where[f] == pid) for pid in support)
    return Question("", d.question, d.answers, support, d.type, "toyworld", evidence)


def write(world: ToyWorld, out_dir: Path, source: str = "toyworld", version: int = VERSION) -> dict[str, Path]:
    """Write corpus.jsonl, train.jsonl, test.jsonl and meta.json into `out_dir`; returns the paths.
    `source` and `version` name the generator in meta.json (another world's generator passes its own)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / f"{name}.jsonl" for name in ("corpus", "train", "test")}
    rows = {"corpus": [{"id": p.id, "title": p.title, "text": p.text} for p in world.passages],
            "train": [q.to_dict() for q in world.train], "test": [q.to_dict() for q in world.test]}
    for name, path in paths.items():
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[name]),
                        encoding="utf-8")
    meta = {"source": source, "version": version, "config": world.config.model_dump(mode="json"),
            "passages": len(world.passages), "questions": world.counts()}
    paths["meta"] = out_dir / "meta.json"
    paths["meta"].write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return paths
