"""The toy world: deterministic, sized as promised, and every question answerable from exactly
its supporting passages, found hop by hop starting from the question's own words."""

from __future__ import annotations

import itertools
import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data.toyworld import QUESTION_TYPES, ToyWorld, ToyWorldConfig, generate, write
from searchrl.data.toyworld.world import Builder
from searchrl.errors import DataError, SearchRLError

SMALL = ToyWorldConfig(seed=7, passages=400, train=150, test=40)
HOPS = {"bridge-2hop": 2, "bridge-3hop": 3, "comparison": 2, "bridge-comparison": 4, "inference": 2}


def norm(text: str) -> str:
    return " " + " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split()) + " "


def contains(text: str, phrase: str) -> bool:
    """Whole-word, case- and punctuation-insensitive containment."""
    return norm(phrase) in norm(text)


def is_choice(q) -> bool:
    """'Which X ..., A or B?': the answer is one of the two named options, by construction."""
    return q.type in ("comparison", "bridge-comparison") and q.answers[0] not in ("yes", "no")


@pytest.fixture(scope="module")
def default_world() -> ToyWorld:
    return generate(ToyWorldConfig())


@pytest.fixture(scope="module")
def small_world() -> ToyWorld:
    return generate(SMALL)


def check_world(world: ToyWorld) -> None:
    """Every promise a question makes about its passages."""
    by_id = {p.id: p for p in world.passages}
    assert len(by_id) == len(world.passages)
    assert all(re.fullmatch(r"tw-\d{6}", pid) for pid in by_id)
    questions = world.train + world.test
    assert len({q.id for q in questions}) == len(questions)
    for q in questions:
        assert q.source == "toyworld" and q.type in QUESTION_TYPES and q.answers
        assert len(q.supporting_ids) == HOPS[q.type], q
        support = [by_id[pid] for pid in q.supporting_ids]  # KeyError = a missing passage
        # Retrieval can start from the question: it names the first-hop entity (both, in comparisons).
        firsts = {"comparison": [0, 1], "bridge-comparison": [0, 2]}.get(q.type, [0])
        for i in firsts:
            assert contains(q.question, support[i].title), (q, support[i].title)
        # Each later hop's entity is named in the passage before it.
        chains = [[0, 1], [2, 3]] if q.type == "bridge-comparison" else [] if q.type == "comparison" else [
            list(range(len(support)))]
        for chain in chains:
            for a, b in itertools.pairwise(chain):
                assert contains(support[a].text, support[b].title), (q, support[a].title, support[b].title)
        # One evidence statement a hop ("The R of S is O."): about that hop's entity, and the
        # object it names is in that hop's passage.
        assert len(q.evidence) == len(support), q
        for sentence, passage in zip(q.evidence, support):
            m = re.fullmatch(r"The [a-z ]+ of (.+) is (.+)\.", sentence.split(". The ")[0].rstrip(".") + ".")
            assert m and m[1] == passage.title and contains(passage.text, m[2]), (q, sentence)
        if q.answers[0] in ("yes", "no"):
            continue
        assert any(contains(p.text, ans) for p in support for ans in q.answers), q
        if is_choice(q):
            assert q.answers[0] in {support[i].title for i in firsts}, q
        else:
            assert not any(contains(q.question, ans) for ans in q.answers), q
            assert any(contains(q.evidence[-1], ans) for ans in q.answers), q  # the last one states it


def test_small_world_keeps_every_promise(small_world: ToyWorld) -> None:
    check_world(small_world)
    assert (len(small_world.train), len(small_world.test)) == (150, 40)


def test_default_world_is_sized_as_promised_and_keeps_every_promise(default_world: ToyWorld) -> None:
    assert 2500 <= len(default_world.passages) <= 4000
    assert len(default_world.train) >= 1500 and len(default_world.test) >= 300
    check_world(default_world)


def test_type_shares_follow_the_mix(default_world: ToyWorld) -> None:
    mix = default_world.config.mix
    for split, qs in (("train", default_world.train), ("test", default_world.test)):
        counts = Counter(q.type for q in qs)
        for t in QUESTION_TYPES:
            assert abs(counts[t] / len(qs) - mix[t] / sum(mix.values())) < 0.01, (split, t, counts)


def test_yes_and_no_are_balanced(default_world: ToyWorld) -> None:
    answers = Counter(q.answers[0] for q in default_world.train + default_world.test
                      if q.answers[0] in ("yes", "no"))
    assert answers["yes"] + answers["no"] >= 100
    assert 0.35 <= answers["yes"] / (answers["yes"] + answers["no"]) <= 0.65


def test_passages_are_about_100_words(default_world: ToyWorld) -> None:
    lengths = [len(p.text.split()) for p in default_world.passages]
    assert sum(60 <= n <= 140 for n in lengths) / len(lengths) >= 0.98
    assert 85 <= sum(lengths) / len(lengths) <= 115
    assert min(lengths) >= 40


def test_no_question_repeats_within_or_across_splits(default_world: ToyWorld) -> None:
    train = [norm(q.question) for q in default_world.train]
    test = [norm(q.question) for q in default_world.test]
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)


def test_entity_names_are_unique() -> None:
    world = Builder(random.Random("names"), 3000).build()
    names = [e.name for e in world.entities()]
    assert len(names) > 2500
    assert len(set(names)) == len(names)
    assert len({n.lower() for n in names}) == len(names)


def birth_year(text: str) -> int:
    return int(re.search(r"(?:\(born |\(|born in |lived from )(\d{4})", text).group(1))


def test_birth_comparisons_name_the_right_person(default_world: ToyWorld) -> None:
    """Read the birth years back from the passages and redo the comparison."""
    by_id = {p.id: p for p in default_world.passages}
    checked = 0
    for q in default_world.train + default_world.test:
        m = re.fullmatch(r"Who was born (first|later), (.+) or (.+)\?", q.question)
        if m:
            years = {by_id[pid].title: birth_year(by_id[pid].text) for pid in q.supporting_ids}
            pick = min if m.group(1) == "first" else max
            assert q.answers == (pick(years, key=years.get),), (q, years)
            checked += 1
    assert checked >= 10


def test_film_comparisons_name_the_right_film(default_world: ToyWorld) -> None:
    by_id = {p.id: p for p in default_world.passages}
    checked = 0
    for q in default_world.train + default_world.test:
        m = re.fullmatch(r"Which film (came out first|was released more recently), (.+) or (.+)\?", q.question)
        if m:
            # The opening sentence of a film passage holds its one release year.
            years = {by_id[pid].title: int(re.findall(r"\b\d{4}\b", by_id[pid].text.split(". ")[0])[0])
                     for pid in q.supporting_ids}
            pick = min if "first" in m.group(1) else max
            assert q.answers == (pick(years, key=years.get),), (q, years)
            checked += 1
    assert checked >= 10


def test_rich_entities_split_into_several_passages_and_still_keep_promises() -> None:
    world = generate(ToyWorldConfig(seed=3, passages=400, train=120, test=30, passage_words=40))
    titles = Counter(p.title for p in world.passages)
    assert any(n >= 2 for n in titles.values())
    check_world(world)


def test_same_config_gives_identical_files_and_seed_changes_them(tmp_path) -> None:
    for name, cfg in (("a", SMALL), ("b", SMALL), ("c", SMALL.model_copy(update={"seed": 8})),
                      ("d", SMALL.model_copy(update={"train": 100}))):
        write(generate(cfg), tmp_path / name)
    files = ("corpus.jsonl", "train.jsonl", "test.jsonl", "meta.json")
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() != (tmp_path / "c" / "corpus.jsonl").read_bytes()
    assert (tmp_path / "a" / "train.jsonl").read_bytes() != (tmp_path / "c" / "train.jsonl").read_bytes()
    # Asking for fewer questions leaves the corpus alone (separate random streams).
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (tmp_path / "d" / "corpus.jsonl").read_bytes()


def test_output_does_not_depend_on_the_hash_seed(tmp_path) -> None:
    """Set iteration order varies with PYTHONHASHSEED; generation must never depend on it."""
    code = ("import sys, pathlib; from searchrl.data.toyworld import ToyWorldConfig, generate, write; "
            "write(generate(ToyWorldConfig(seed=7, passages=200, train=40, test=10)), pathlib.Path(sys.argv[1]))")
    for h in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": h}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / h)], check=True, env=env)
    for f in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "1" / f).read_bytes() == (tmp_path / "2" / f).read_bytes(), f


def test_config_errors_are_explained() -> None:
    with pytest.raises(ValueError, match="unknown question types"):
        ToyWorldConfig(mix={"bridge-4hop": 1.0})
    with pytest.raises(DataError, match="raise --passages"):
        generate(ToyWorldConfig(passages=100, train=3000, test=0))


def test_mix_can_drop_a_type() -> None:
    world = generate(ToyWorldConfig(seed=1, passages=300, train=40, test=10, mix={"inference": 1.0}))
    assert {q.type for q in world.train + world.test} == {"inference"}


def test_cli_writes_files_and_prints_counts(tmp_path) -> None:
    result = CliRunner().invoke(app, ["data", "toyworld", "--out", str(tmp_path), "--seed", "2",
                                      "--passages", "300", "--train", "60", "--test", "20"])
    assert result.exit_code == 0, result.output
    assert "bridge-comparison" in result.output and "total" in result.output
    assert sum(1 for _ in (tmp_path / "train.jsonl").open()) == 60
    assert sum(1 for _ in (tmp_path / "test.jsonl").open()) == 20
    result = CliRunner().invoke(app, ["data", "toyworld", "--out", str(tmp_path), "--passages", "5"])
    assert result.exit_code != 0 and isinstance(result.exception, SearchRLError)
