"""The held-out toy world ("toyworld-alt"): other kinds, relations, wording and names.

A check of generalisation needs a world a trained model has never read, and another seed of
the main generator is not one: it repeats the relations and the sentence patterns, so a model
that learned the template ("The birthplace of X is ...") passes it without reading. This world
is a seafaring age (dominions, ports, shipyards, merchant houses, ships, expeditions,
mariners) written in its own sentences, asked about in its own questions, with names from a
disjoint name space; its question types are the main world's, so per-type scores compare.
No recipe trains on it: the catalog offers only its test split.

    world = generate(AltWorldConfig())
    write(world, Path("data/toyworld-alt"))  # corpus.jsonl, train.jsonl (empty), test.jsonl, meta.json
"""

from __future__ import annotations

import random
from dataclasses import replace

from pydantic import Field

from searchrl.data.toyworld import QUESTION_TYPES, ToyWorld, ToyWorldConfig, to_question
from searchrl.data.toyworld import write as write_world
from searchrl.data.toyworld.alt.questions import drafts
from searchrl.data.toyworld.alt.render import render, statement
from searchrl.data.toyworld.alt.world import AltBuilder
from searchrl.data.toyworld.questions import quotas
from searchrl.data.types import Passage, Question
from searchrl.errors import DataError

__all__ = ["SOURCE", "VERSION", "AltWorldConfig", "generate", "write"]

SOURCE = "toyworld-alt"
# Bump when the same config would give different files, so caches keyed on it rebuild.
VERSION = 1


class AltWorldConfig(ToyWorldConfig):
    """Size and seed of the held-out world; by default a test split only."""

    passages: int = Field(1200, ge=100, description=(
        "Target corpus size in passages; the number of entities is derived from it."))
    train: int = Field(0, ge=0, description="Training questions: none by default, the world is held out.")
    test: int = Field(250, ge=0, description="Number of test questions.")


def generate(cfg: AltWorldConfig | None = None) -> ToyWorld:
    """Draw the held-out world, render its passages and pick the questions (as `toyworld.generate`).

    Raises `DataError` when the world is too small for the questions asked of it.
    """
    cfg = cfg or AltWorldConfig()
    world = AltBuilder(random.Random(f"{SOURCE}:{cfg.seed}:world"), cfg.passages).build()
    chunks = render(world.entities(), world.ports, random.Random(f"{SOURCE}:{cfg.seed}:render"), cfg.passage_words)
    random.Random(f"{SOURCE}:{cfg.seed}:order").shuffle(chunks)
    passages, where = [], {}
    for i, (entity, chunk) in enumerate(chunks):
        pid = f"twa-{i:06d}"
        passages.append(Passage(pid, entity.name, " ".join(chunk.sentences)))
        where.update((f, pid) for f in chunk.facts)
    by_key = {e.key: e for e in world.entities()}

    def state(f: str) -> str:
        key, relation = f.split(":")
        return statement(by_key[key], relation)

    r = random.Random(f"{SOURCE}:{cfg.seed}:questions")
    pool = drafts(world, r, per_pattern=max(20, (cfg.train + cfg.test) // 5))
    train_n, test_n = quotas(cfg.train, cfg.mix), quotas(cfg.test, cfg.mix)
    train: list[Question] = []
    test: list[Question] = []
    for t in QUESTION_TYPES:
        need = train_n[t] + test_n[t]
        if need > len(pool[t]):
            raise DataError(f"toyworld-alt: {need} {t} questions asked for but the world only supports "
                            f"{len(pool[t])}; raise passages (now {cfg.passages}) or ask for fewer questions")
        chosen = r.sample(pool[t], need)
        test += [to_question(d, where, state) for d in chosen[: test_n[t]]]
        train += [to_question(d, where, state) for d in chosen[test_n[t]:]]
    r.shuffle(train)
    r.shuffle(test)
    train = [replace(q, id=f"twa-train-{i:05d}", source=SOURCE) for i, q in enumerate(train)]
    test = [replace(q, id=f"twa-test-{i:05d}", source=SOURCE) for i, q in enumerate(test)]
    return ToyWorld(cfg, passages, train, test)


def write(world: ToyWorld, out_dir):
    """corpus.jsonl, train.jsonl, test.jsonl and meta.json, as the main world writes them."""
    return write_world(world, out_dir, source=SOURCE, version=VERSION)
