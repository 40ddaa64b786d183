"""The ACC_L judge client against a real local HTTP server speaking the OpenAI chat API."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from loopback import FakeOpenAI
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.judge import Judge, JudgeError, JudgeItem, parse_verdict


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")  # the loopback stand-in may get keys
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))  # the CLI's verdict cache
    server = FakeOpenAI()
    yield server
    server.close()


ITEMS = [
    JudgeItem("Capital of France?", ("Paris",), "It is Paris."),
    JudgeItem("Capital of Italy?", ("Rome", "Roma"), "Milan"),
    JudgeItem("Who wrote Hamlet?", ("Shakespeare",), "William Shakespeare"),
    JudgeItem("Largest planet?", ("Jupiter",), "Saturn"),
    JudgeItem("Empty?", ("x",), None),
]


def test_verdicts_in_order_and_request_format(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    judge = Judge(fake.url, model="judge-mini", api_key_env="JUDGE_KEY", workers=3)
    assert judge.judge_many(ITEMS) == [True, False, True, False, False]
    # The empty prediction is graded False without a call.
    assert len(fake.requests) == 4
    first = next(r for r in fake.requests if "France" in r.body["messages"][-1]["content"])
    assert first.path == "/v1/chat/completions"
    assert first.body["model"] == "judge-mini" and first.body["temperature"] == 0
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]
    assert "True or False" in first.body["messages"][0]["content"]
    assert all(r.headers.get("authorization") == "Bearer sk-test" for r in fake.requests)


def test_api_key_comes_from_env(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    Judge(fake.url).judge_one(ITEMS[0])
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-env"
    assert fake.requests[-1].body["model"] == "gpt-4o-mini"


def test_openai_without_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(JudgeError, match="OPENAI_API_KEY"):
        Judge()


def test_retries_with_backoff_then_succeeds(fake: FakeOpenAI) -> None:
    fake.fail_first = 2
    judge = Judge(fake.url, max_retries=3, backoff_s=0.01)
    assert judge.judge_one(ITEMS[0]) is True
    assert len(fake.requests) == 3


def test_gives_up_after_retries(fake: FakeOpenAI) -> None:
    fake.fail_first = 100
    judge = Judge(fake.url, max_retries=2, backoff_s=0.01)
    with pytest.raises(JudgeError, match=r"did not answer after 3 tries .*HTTP 503"):
        judge.judge_one(ITEMS[0])
    assert len(fake.requests) == 3


def test_unreachable_server() -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = Judge(
        f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01, timeout_s=2
    )
    with pytest.raises(JudgeError, match=f"127.0.0.1:{port}.*is the server up"):
        judge.judge_one(ITEMS[0])


@pytest.mark.parametrize(
    ("status", "message"), [(401, "OPENAI_API_KEY"), (404, "often .../v1"), (400, "HTTP 400")]
)
def test_hard_http_errors_are_not_retried(fake: FakeOpenAI, status: int, message: str) -> None:
    fake.status = status
    with pytest.raises(JudgeError, match=re.escape(message)):
        Judge(fake.url, backoff_s=0.01).judge_many(ITEMS[:2])
    assert len(fake.requests) <= 2  # one per item at most, no retries


@pytest.mark.parametrize("raw", ['{"unexpected": true}', "not json", '{"choices": []}'])
def test_malformed_replies_are_counted_not_raised(fake: FakeOpenAI, raw: str) -> None:
    fake.raw = raw
    judge = Judge(fake.url)
    assert judge.judge_many(ITEMS[:2]) == [None, None]
    assert (judge.stats.requests, judge.stats.malformed) == (2, 2)


def test_unparseable_verdict_is_none(fake: FakeOpenAI) -> None:
    fake.reply = "I am not sure."
    judge = Judge(fake.url)
    assert judge.judge_one(ITEMS[0]) is None and judge.stats.malformed == 1
    fake.reply = "**False** - the answer is Milan."
    assert Judge(fake.url).judge_one(ITEMS[0]) is False


def test_cached_verdicts_cost_no_request(fake: FakeOpenAI, tmp_path: Path) -> None:
    cache = tmp_path / "verdicts.sqlite"
    first = Judge(fake.url, cache=cache)
    assert first.judge_many(ITEMS) == [True, False, True, False, False]
    assert (first.stats.requests, first.stats.cache_hits) == (4, 0)
    again = Judge(fake.url, cache=cache)  # another process would see the same file
    assert again.judge_many(ITEMS) == [True, False, True, False, False]
    assert (again.stats.requests, again.stats.cache_hits, len(fake.requests)) == (0, 4, 4)
    other_model = Judge(fake.url, model="other", cache=cache)  # the key holds the judge model
    other_model.judge_one(ITEMS[0])
    assert other_model.stats.requests == 1


def test_malformed_verdicts_are_not_cached(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.reply = "Maybe."
    Judge(fake.url, cache=tmp_path / "c.sqlite").judge_one(ITEMS[0])
    fake.reply = None
    assert Judge(fake.url, cache=tmp_path / "c.sqlite").judge_one(ITEMS[0]) is True
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("True", True),
        ("true.", True),
        ("FALSE", False),
        ("Answer: yes", True),
        ("incorrect", False),
        ("The prediction is correct", True),
        ("untrue", None),
        ("", None),
    ],
)
def test_parse_verdict(reply: str, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


def test_cli_judges_records_without_verdicts(fake: FakeOpenAI, tmp_path: Path) -> None:
    preds = tmp_path / "p.jsonl"
    rows = [
        {"question": "Capital of France?", "answers": ["Paris"], "prediction": "Paris"},
        {"question": "Capital of Italy?", "answers": ["Rome"], "prediction": "Milan"},
        {
            "question": "Largest planet?",
            "answers": ["Jupiter"],
            "prediction": "Saturn",
            "judge": True,
        },
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "judged.jsonl"
    result = CliRunner().invoke(
        app,
        ["eval", "score", str(preds), "--json", "--judge-url", fake.url, "--judged-out", str(out)],
    )
    assert result.exit_code == 0, result.output
    # The existing verdict is kept (True), two are asked for: Paris True, Milan False.
    assert json.loads(result.stdout)["acc_l"] == pytest.approx(2 / 3)
    assert len(fake.requests) == 2
    assert [json.loads(line)["judge"] for line in out.read_text().splitlines()] == [
        True,
        False,
        True,
    ]


def test_doctests_pass() -> None:
    import doctest

    from searchrl import judge, llm

    result = doctest.testmod(judge)
    assert result.attempted >= 3 and result.failed == 0
    assert doctest.testmod(llm).failed == 0
