"""`searchrl data compose`: counts per part, filters, determinism, and the errors people meet."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.config import load_config
from searchrl.data.compose import ComposeConfig, compose, parse_take
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.rl.config import StageConfig
from searchrl.rl.preflight import stage_questions


def _write(path, questions):
    path.write_text(
        "".join(
            json.dumps({**q.to_dict(), "bucket": "medium", "rollouts_needed": 12}) + "\n"
            for q in questions
        )
    )
    return path


@pytest.fixture
def buckets(tmp_path):
    """A selection run over mixed sources: 30 Medium (20 hotpot, 10 2wiki), 5 Difficult, no Easy."""
    medium = [
        Question(
            f"h{i}",
            f"Hotpot question {i}?",
            (f"H{i}",),
            type="bridge" if i % 2 else "comparison",
            source="hotpotqa",
        )
        for i in range(20)
    ]
    medium += [
        Question(f"w{i}", f"Wiki question {i}?", (f"W{i}",), type="compositional", source="2wiki")
        for i in range(10)
    ]
    difficult = [
        Question(f"d{i}", f"Hard question {i}?", (f"D{i}",), type="bridge", source="hotpotqa")
        for i in range(5)
    ]
    _write(tmp_path / "medium.jsonl", medium)
    _write(tmp_path / "difficult.jsonl", difficult)
    (tmp_path / "easy.jsonl").write_text("")
    return tmp_path


def _cfg(parts, **kw):
    return ComposeConfig(parts=parts, **kw)


def test_parts_take_their_counts_from_their_sources(buckets):
    # The paper's Stage 1 in small: hotpot and 2wiki Medium questions in fixed numbers.
    cfg = _cfg(
        [
            {"dataset": str(buckets / "medium.jsonl"), "count": 8, "sources": ["hotpotqa"]},
            {"dataset": str(buckets / "medium.jsonl"), "count": 6, "sources": ["2wiki"]},
        ]
    )
    questions, rows = compose(cfg)
    assert len(questions) == 14 and len({q.id for q in questions}) == 14
    assert (
        sum(q.source == "hotpotqa" for q in questions) == 8
        and sum(q.source == "2wiki" for q in questions) == 6
    )
    assert [(r["available"], r["taken"]) for r in rows] == [(20, 8), (10, 6)]


def test_count_null_takes_everything_and_types_filter(buckets):
    questions, _ = compose(
        _cfg(
            [
                {"dataset": str(buckets / "medium.jsonl")},
                {"dataset": str(buckets / "difficult.jsonl")},
            ]
        )
    )
    assert sorted(q.id for q in questions) == sorted(
        [f"h{i}" for i in range(20)] + [f"w{i}" for i in range(10)] + [f"d{i}" for i in range(5)]
    )
    questions, _ = compose(
        _cfg([{"dataset": str(buckets / "medium.jsonl"), "question_types": ["comparison"]}])
    )
    assert sorted(q.id for q in questions) == sorted(f"h{i}" for i in range(0, 20, 2))


def test_same_seed_same_file_other_seed_other_draw(buckets):
    parts = [
        {"dataset": str(buckets / "medium.jsonl"), "count": 10},
        {"dataset": str(buckets / "difficult.jsonl"), "count": 2},
    ]

    def ids(seed, **kw):
        return [q.id for q in compose(_cfg(parts, seed=seed, **kw))[0]]

    assert ids(0) == ids(0)
    assert ids(0) != ids(1) and sorted(ids(0)) != sorted(ids(1))
    # Without shuffling the parts stay in order; the draw within a part is the same as shuffled.
    unshuffled = ids(0, shuffle=False)
    assert all(i.startswith("d") for i in unshuffled[10:]) and sorted(unshuffled) == sorted(ids(0))


def test_asking_for_more_than_a_part_holds_is_an_error(buckets):
    with pytest.raises(
        SearchRLError, match=r"parts\[1\] \(.*difficult.jsonl\): asks for 6 questions but holds 5"
    ):
        compose(
            _cfg(
                [
                    {"dataset": str(buckets / "medium.jsonl"), "count": 1},
                    {"dataset": str(buckets / "difficult.jsonl"), "count": 6},
                ]
            )
        )
    with pytest.raises(
        SearchRLError, match=r"sources=2wiki\]\): asks for 11 questions but holds 10"
    ):
        compose(
            _cfg([{"dataset": str(buckets / "medium.jsonl"), "count": 11, "sources": ["2wiki"]}])
        )


def test_empty_and_missing_buckets(buckets):
    questions, rows = compose(
        _cfg(
            [
                {"dataset": str(buckets / "easy.jsonl")},
                {"dataset": str(buckets / "difficult.jsonl")},
            ]
        )
    )
    assert (
        len(questions) == 5 and rows[0]["taken"] == 0
    )  # all of an empty bucket: nothing, no error
    with pytest.raises(SearchRLError, match="asks for 1 questions but holds 0"):
        compose(_cfg([{"dataset": str(buckets / "easy.jsonl"), "count": 1}]))
    with pytest.raises(SearchRLError, match="the parts hold no questions"):
        compose(_cfg([{"dataset": str(buckets / "easy.jsonl")}]))
    with pytest.raises(SearchRLError, match=r"parts\[0\] \(.*hard.jsonl\): unknown dataset"):
        compose(_cfg([{"dataset": str(buckets / "hard.jsonl")}]))


def test_overlapping_parts_are_an_error(buckets):
    with pytest.raises(SearchRLError, match="drawn by more than one part"):
        compose(
            _cfg(
                [
                    {"dataset": str(buckets / "medium.jsonl")},
                    {"dataset": str(buckets / "medium.jsonl"), "sources": ["2wiki"]},
                ]
            )
        )


def test_parse_take():
    assert parse_take("a/medium.jsonl=all") == {"dataset": "a/medium.jsonl", "count": None}
    assert parse_take("toyworld:train=5") == {"dataset": "toyworld:train", "count": 5}
    for bad in ("x.jsonl=0", "x.jsonl=many"):
        with pytest.raises(SearchRLError, match="a number >= 1, or all"):
            parse_take(bad)
    with pytest.raises(SearchRLError, match="no parts: give --take"):
        load_config(ComposeConfig, None, ["out=x.jsonl"])


def test_cli_writes_a_stage_dataset(buckets, tmp_path):
    out = tmp_path / "stage2.jsonl"
    args = [
        "data",
        "compose",
        "--take",
        f"{buckets / 'medium.jsonl'}=12",
        "--take",
        str(buckets / "difficult.jsonl"),
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    first = out.read_bytes()
    assert (
        CliRunner().invoke(app, args).exit_code == 0 and out.read_bytes() == first
    )  # byte for byte
    # The file is a stage's dataset as it is, question types included.
    questions = stage_questions(StageConfig(dataset=str(out), question_types=["bridge"]), "stage2")
    types = [json.loads(line)["type"] for line in out.read_text().splitlines()]
    assert len(questions) == types.count("bridge") >= 5 and all(
        q.type == "bridge" for q in questions
    )
    assert len(out.read_text().splitlines()) == 17


def test_config_file_with_filters(buckets, tmp_path):
    config = tmp_path / "stage1.yaml"
    config.write_text(
        f"parts:\n  - {{dataset: {buckets / 'medium.jsonl'}, count: 4, sources: [hotpotqa]}}\n"
        f"  - {{dataset: {buckets / 'medium.jsonl'}, count: 3, sources: [2wiki]}}\nseed: 1\n"
    )
    out = tmp_path / "stage1.jsonl"
    result = CliRunner().invoke(
        app, ["data", "compose", "--config", str(config), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    sources = [json.loads(line)["source"] for line in out.read_text().splitlines()]
    assert sorted(sources) == ["2wiki"] * 3 + ["hotpotqa"] * 4
