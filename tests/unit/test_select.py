"""`searchrl data select`: a scripted policy decides which rollout of each question is correct, so
counts, buckets, rollouts issued and resumes are exact."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from searchrl.assets import load_tokenizer
from searchrl.cli import app
from searchrl.config import load_config
from searchrl.data.loaders import load_questions
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.retrieval.index import build_index
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.select.buckets import Tally, bucket_of
from searchrl.select.run import SelectConfig, read_rounds, run_select

# Which rollouts (1-based, in sampling order) of each question answer right.
CORRECT_AT = {
    "a": {1},  # easy
    "b": {9, 12},  # easy: 9 < 10 (the second hit changes nothing)
    "c": {10},  # medium, the lower boundary
    "d": {20, 22},  # medium, the upper boundary
    "e": {21},  # difficult
    "f": {30},  # past the cap of 24: unsolved
    "g": set(),  # unsolved
}
GOLD = {
    "a": "Alder",
    "b": "Birch",
    "c": "Cedar",
    "d": "Dogwood",
    "e": "Elm",
    "f": "Fir",
    "g": "Gum",
}
TYPES = {
    "a": "comparison",
    "b": "comparison",
    "c": "bridge",
    "d": "bridge",
    "e": "bridge",
    "f": "comparison",
    "g": "bridge",
}
# With 8 per round and a cap of 24: a finishes after round 1, b and c after 2, the rest after 3.
ISSUED = {"a": 8, "b": 16, "c": 16, "d": 24, "e": 24, "f": 24, "g": 24}


class Policy:
    """Answers at once; rollout n of question q is right when n is in CORRECT_AT[q]. `start`
    says how many rollouts of each question came before (a resumed run)."""

    def __init__(self, start: dict[str, int] | None = None, stop_after: int | None = None) -> None:
        self.calls: Counter = Counter(start or {})
        self.issued: Counter = Counter()
        self.stop_after = stop_after

    def __call__(self, text: str) -> str:
        if self.stop_after is not None and sum(self.issued.values()) == self.stop_after:
            raise KeyboardInterrupt  # the run is stopped mid-round
        qid = text.rsplit("User: Question ", 1)[1].split(":")[0]
        self.calls[qid] += 1
        self.issued[qid] += 1
        answer = GOLD[qid] if self.calls[qid] in CORRECT_AT[qid] else "no idea"
        return f"</think>\n<answer>{answer}</answer>"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("select")
    build_index(
        [Passage(f"p{i}", f"T{i}", f"Passage {i} text.") for i in range(4)],
        root / "index",
        "bm25",
        progress=False,
    )
    with (root / "q.jsonl").open("w") as fh:
        for qid in CORRECT_AT:
            q = Question(
                qid,
                f"Question {qid}: which tree is it?",
                (GOLD[qid],),
                type=TYPES[qid],
                source="unit",
            )
            fh.write(json.dumps(q.to_dict()) + "\n")
    return root


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def _cfg(world, tmp_path, *overrides):
    base = [
        f"dataset={world / 'q.jsonl'}",
        f"retrieval.index={world / 'index'}",
        "protocol.tags=search-r1",
        "rollouts_per_round=8",
        "questions_per_round=3",
        "max_rollouts=24",
        f"out={tmp_path / 'sel'}",
    ]
    return load_config(SelectConfig, None, base + list(overrides))


def _bucket_ids(out, bucket):
    return [json.loads(line)["id"] for line in (out / f"{bucket}.jsonl").read_text().splitlines()]


def test_bucket_thresholds():
    assert [bucket_of(n) for n in (1, 9, 10, 20, 21, 400, None)] == [
        "easy",
        "easy",
        "medium",
        "medium",
        "difficult",
        "difficult",
        "unsolved",
    ]
    assert [bucket_of(n, 3, 5) for n in (2, 3, 4, 5)] == ["easy", "medium", "medium", "difficult"]
    assert [bucket_of(n, 4, 4) for n in (3, 4)] == ["easy", "difficult"]  # no Medium band at all


def test_tally_counts_the_first_correct_rollout():
    t = Tally()
    t.add([0, 0, 0])
    t.add([0, 1, 1])
    assert (t.first_correct, t.sampled, t.correct) == (5, 6, 2)
    t.add([1])
    assert t.first_correct == 5 and t.needed(cap=6) == 5 and t.needed(cap=4) is None
    assert t.done(cap=8) and not Tally(sampled=7).done(cap=8) and Tally(sampled=8).done(cap=8)


def test_select_counts_buckets_and_rollouts_issued(world, tmp_path, tokenizer):
    policy = Policy()
    summary = run_select(_cfg(world, tmp_path), ScriptedBackend(tokenizer, policy), progress=False)
    out = tmp_path / "sel"
    assert dict(policy.issued) == ISSUED  # a question stops being sampled once solved or at the cap
    assert summary["rollouts_sampled"] == sum(ISSUED.values()) == 136
    assert summary["buckets"] == {"easy": 2, "medium": 2, "difficult": 1, "unsolved": 2}
    assert summary["by_type"] == {
        "bridge": {"easy": 0, "medium": 2, "difficult": 1, "unsolved": 1},
        "comparison": {"easy": 2, "medium": 0, "difficult": 0, "unsolved": 1},
    }
    assert summary["needed"] == [1, 9, 10, 20, 21]
    assert [_bucket_ids(out, b) for b in ("easy", "medium", "difficult", "unsolved")] == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
        ["f", "g"],
    ]
    records = {
        json.loads(line)["id"]: json.loads(line)
        for b in ("easy", "medium", "unsolved")
        for line in (out / f"{b}.jsonl").read_text().splitlines()
    }
    assert (
        records["b"]["rollouts_needed"],
        records["b"]["rollouts_sampled"],
        records["b"]["rollouts_correct"],
    ) == (9, 16, 2)
    assert (
        records["f"]["bucket"],
        records["f"]["rollouts_needed"],
        records["f"]["rollouts_sampled"],
    ) == ("unsolved", None, 24)
    # Bucket files are datasets as they are.
    medium = load_questions(out / "medium.jsonl")
    assert [(q.id, q.answers, q.type) for q in medium] == [
        ("c", ("Cedar",), "bridge"),
        ("d", ("Dogwood",), "bridge"),
    ]
    # Rounds: the pool refills as questions leave, 3 questions a round (a; b, c; then d, e, f, g).
    rounds = read_rounds(out)
    assert [sorted(r["questions"]) for r in rounds] == [
        ["a", "b", "c"],
        ["b", "c", "d"],
        ["d", "e", "f"],
        ["d", "e", "f"],
        ["e", "f", "g"],
        ["g"],
        ["g"],
    ]
    assert (out / "histogram.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "summary.md").read_text()
    assert (
        "| medium | 10-20 | 2 | 28.6 % |" in md
        and "| unsolved | none correct in 24 | 2 | 28.6 % |" in md
    )
    assert json.loads((out / "summary.json").read_text())["buckets"] == summary["buckets"]


def test_a_short_last_round_stops_at_the_cap(world, tmp_path, tokenizer):
    policy = Policy()
    summary = run_select(
        _cfg(
            world,
            tmp_path,
            "rollouts_per_round=5",
            "max_rollouts=12",
            "medium_from=2",
            "difficult_from=10",
            "questions_per_round=7",
        ),
        ScriptedBackend(tokenizer, policy),
        progress=False,
    )
    sizes = [len(r["questions"]["g"]) for r in read_rounds(tmp_path / "sel")]
    assert sizes == [5, 5, 2]
    assert (policy.issued["a"], policy.issued["b"], policy.issued["c"], policy.issued["g"]) == (
        5,
        10,
        10,
        12,
    )
    # a at 1 easy, b at 9 medium, c at 10 difficult; d (20) and e (21) are past the cap of 12.
    assert summary["buckets"] == {"easy": 1, "medium": 1, "difficult": 1, "unsolved": 4}


def test_metric_and_threshold_decide_correctness(world, tmp_path, tokenizer):
    # "Alder tree" against "Alder": precision 1/2, recall 1, so F1 = 2/3; cover-EM 1, EM 0.
    def respond(text):
        return "</think>\n<answer>Alder tree</answer>"

    def buckets(*overrides):
        return run_select(
            _cfg(world, tmp_path / "_".join(overrides), "limit=1", "max_rollouts=8", *overrides),
            ScriptedBackend(tokenizer, respond),
            progress=False,
        )["buckets"]

    assert buckets("metric=cem")["easy"] == 1
    assert buckets("metric=em")["unsolved"] == 1
    assert buckets("metric=f1", "min_score=0.6")["easy"] == 1
    assert buckets("metric=f1", "min_score=0.7")["unsolved"] == 1


def test_interrupted_run_resumes_without_redoing_finished_questions(world, tmp_path, tokenizer):
    cfg = _cfg(world, tmp_path)
    # Round 1 (24 rollouts of a, b, c) is saved; round 2 is cut short.
    stopped = Policy(stop_after=30)
    with pytest.raises(KeyboardInterrupt):
        run_select(cfg, ScriptedBackend(tokenizer, stopped), progress=False)
    assert [sorted(r["questions"]) for r in read_rounds(tmp_path / "sel")] == [["a", "b", "c"]]
    assert not (tmp_path / "sel" / "summary.json").exists()

    # The rerun's policy continues from the rollouts the file recorded (8 of a, b and c).
    rerun = Policy(start={"a": 8, "b": 8, "c": 8})
    summary = run_select(cfg, ScriptedBackend(tokenizer, rerun), progress=False)
    assert "a" not in rerun.issued  # finished in round 1: never sampled again
    assert dict(rerun.issued) == {
        q: n - (8 if q in "abc" else 0) for q, n in ISSUED.items() if q != "a"
    }
    assert sum(rerun.issued.values()) == 136 - 24
    assert summary["buckets"] == {"easy": 2, "medium": 2, "difficult": 1, "unsolved": 2}
    assert summary["rollouts_sampled"] == 136 and summary["rounds"] == 7


def test_torn_progress_line_is_dropped_and_its_round_rerun(world, tmp_path, tokenizer):
    cfg = _cfg(world, tmp_path, "limit=1")  # question a alone: one round solves it
    run_select(cfg, ScriptedBackend(tokenizer, Policy()), progress=False)
    progress = tmp_path / "sel" / "progress.jsonl"
    # Killed while writing round 0:
    progress.write_text('{"round": 0, "seconds": 0.1, "questions": {"a": [0, 0,')
    policy = Policy()
    summary = run_select(cfg, ScriptedBackend(tokenizer, policy), progress=False)
    assert policy.issued == {"a": 8} and summary["buckets"]["easy"] == 1
    assert len(progress.read_text().splitlines()) == 1 and json.loads(progress.read_text())[
        "questions"
    ] == {"a": [1, 0, 0, 0, 0, 0, 0, 0]}


def test_rerun_with_a_higher_cap_continues_only_the_unsolved_and_new_thresholds_cost_nothing(
    world, tmp_path, tokenizer
):
    first = Policy()
    run_select(
        _cfg(world, tmp_path, "max_rollouts=16"), ScriptedBackend(tokenizer, first), progress=False
    )
    assert sum(first.issued.values()) == 8 + 16 * 6
    more = Policy(start={q: 16 for q in "cdefg"})  # c was solved at 10, so it is done; b at 9 too
    summary = run_select(_cfg(world, tmp_path), ScriptedBackend(tokenizer, more), progress=False)
    assert dict(more.issued) == {"d": 8, "e": 8, "f": 8, "g": 8}
    assert summary["buckets"] == {"easy": 2, "medium": 2, "difficult": 1, "unsolved": 2}
    # Other thresholds re-bucket the finished run without loading a model (backend=None).
    summary = run_select(
        _cfg(world, tmp_path, "medium_from=2", "difficult_from=15"), progress=False
    )
    assert summary["buckets"] == {"easy": 1, "medium": 2, "difficult": 2, "unsolved": 2}


def test_resume_refuses_settings_that_change_rollouts(world, tmp_path, tokenizer):
    run_select(
        _cfg(world, tmp_path, "limit=1"), ScriptedBackend(tokenizer, Policy()), progress=False
    )
    with pytest.raises(SearchRLError, match=r"cannot resume .*metric: 'cem' -> 'em'"):
        run_select(
            _cfg(world, tmp_path, "limit=1", "metric=em"),
            ScriptedBackend(tokenizer, Policy()),
            progress=False,
        )
    with pytest.raises(SearchRLError, match=r"rollout.temperature: 0.7 -> 0.5"):  # 0.7: smollm2-135m's profile
        run_select(
            _cfg(world, tmp_path, "limit=1", "rollout.temperature=0.5"),
            ScriptedBackend(tokenizer, Policy()),
            progress=False,
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["medium_from=12", "difficult_from=11"],
            "medium_from \\(12\\) must not exceed difficult_from \\(11\\)",
        ),
        (["rollout.greedy=true"], "rollout.greedy must be false"),
        (["rollout.samples_per_question=4"], "use rollouts_per_round"),
        (["metric=bleu"], "unknown answer metric 'bleu'"),
        (["retrieval.index=null"], "selection searches"),
    ],
)
def test_bad_configs_say_what_to_fix(world, tmp_path, overrides, message):
    with pytest.raises(SearchRLError, match=message):
        _cfg(world, tmp_path, *overrides)


def test_bad_inputs(world, tmp_path, tokenizer):
    with pytest.raises(SearchRLError, match="no output folder"):
        run_select(_cfg(world, tmp_path, "out=null"), progress=False)
    with pytest.raises(SearchRLError, match="unknown dataset"):
        run_select(_cfg(world, tmp_path, f"dataset={tmp_path / 'missing.jsonl'}"), progress=False)
    dupes = tmp_path / "dupes.jsonl"
    dupes.write_text((json.dumps(Question("x", "Q?", ("A",)).to_dict()) + "\n") * 2)
    with (
        pytest.warns(UserWarning),
        pytest.raises(SearchRLError, match="ids 'x' occur more than once"),
    ):
        run_select(_cfg(world, tmp_path, f"dataset={dupes}"), progress=False)


def test_cli_with_the_tiny_model(world, tmp_path):
    out = tmp_path / "cli"
    args = [
        "data",
        "select",
        "--model",
        "tiny-random",
        "--dataset",
        str(world / "q.jsonl"),
        "--index",
        str(world / "index"),
        "--limit",
        "2",
        "--per-round",
        "2",
        "--max-rollouts",
        "2",
        "--out",
        str(out),
        "--set",
        "rollout.max_new_tokens=4",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Data selection" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["questions"] == 2
        and summary["rollouts_sampled"] == 4
        and sum(summary["buckets"].values()) == 2
    )
    assert {p.name for p in out.iterdir()} >= {
        "easy.jsonl",
        "medium.jsonl",
        "difficult.jsonl",
        "unsolved.jsonl",
        "summary.md",
        "histogram.png",
        "progress.jsonl",
        "config.yaml",
    }


def test_shipped_select_config_validates():
    from searchrl.config import CONFIG_DIR

    cfg = load_config(SelectConfig, CONFIG_DIR / "data" / "select-toyworld-cpu.yaml")
    assert (cfg.max_rollouts, cfg.medium_from, cfg.difficult_from, cfg.protocol.tags) == (
        24,
        10,
        21,
        "search-r1",
    )


def test_doctests_pass():
    import doctest

    from searchrl.data import compose
    from searchrl.select import buckets

    for module in (buckets, compose):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
