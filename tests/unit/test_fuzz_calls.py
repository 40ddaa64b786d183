"""The policy's own text never crashes the rollout (docs/security.md): whatever a turn holds —
bracket towers, numbers of thousands of digits, stray tags, broken escapes — the tool-call parsers
(`searchrl.protocols.call_formats`) and the tag protocol's turn reader return a turn with calls and
malformed-call reasons, never an exception. Fuzzed with hypothesis: 10,200 generated turns (4,000 + 3,200 + 3,000), each
through every parser (derandomized, so CI sees the same inputs each run; a few seconds)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.protocols.call_formats import CALL_FORMATS, MAX_JSON_DEPTH, Turn, json_depth
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import TAG_PRESETS
from searchrl.tools.base import ToolCall
from searchrl.tools.schema import check_arguments

FORMATS = [CALL_FORMATS.get(name)() for name in CALL_FORMATS.names()]
PROTOCOLS = [TagProtocol.named(name) for name in TAG_PRESETS.names()]
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


# Pieces a degenerate policy writes: the formats' tags, JSON punctuation and keys, escapes.
PIECES = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", "{", "}", "[", "]", '"', "\\", "\\u", ":",
    ",", '"name"', '"arguments"', '"parameters"', '"search"', '"query"', "null", "true", "1e999", "-", "0", "\n",
    "<search>", "</search>", "<answer>", "</answer>", "<|begin_of_query|>", "<|end_of_query|>", "<|im_end|>",
]
towers = st.integers(0, 1500).map(lambda n: "[" * n) | st.integers(0, 1500).map(lambda n: "{\"a\":" * n)
digits = st.integers(4000, 5000).map(lambda n: "9" * n)  # Python reads at most 4,300 digits
pieces = st.lists(st.sampled_from(PIECES) | st.text(max_size=6) | towers | digits, max_size=12).map("".join)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10) | digits
json_values = scalars | st.lists(scalars, max_size=3) | st.dictionaries(st.text(max_size=5), scalars, max_size=3)


def calls_of_json(value, depth: int) -> str:
    """A call whose arguments are `value` buried under `depth` arrays, in both formats' shapes."""
    args = "[" * depth + json.dumps(value) + "]" * depth
    return f'<tool_call>{{"name": "search", "arguments": {args}}}</tool_call>{{"name": "search", "parameters": {args}}}'


def check_every_parser(text: str) -> None:
    for fmt in FORMATS:
        turn = fmt.parse(text)
        assert isinstance(turn, Turn)
        assert all(isinstance(r, str) and r for r in turn.malformed)
        for call in turn.calls:
            assert isinstance(call, ToolCall) and isinstance(call.name, str) and isinstance(call.arguments, dict)
            assert json_depth(json.dumps(call.arguments)) <= MAX_JSON_DEPTH
            problem = check_arguments(call.name, SEARCH, call.arguments)  # the engine's next step
            assert problem is None or isinstance(problem, str)
    for protocol in PROTOCOLS:
        for stop in (*protocol.stop_strings(), None):
            read = protocol.read_text(text, "stop" if stop else "eos", stop)
            assert read is None or all(isinstance(c.arguments["query"], str) for c in read.calls)
        protocol.answer([], cut_short=True)


# Each example is a batch of EACH inputs (hypothesis's cost is mostly per example).
EACH = 4


@fuzz(1000)
@given(st.lists(st.text(), min_size=EACH, max_size=EACH))
def test_any_text(texts):
    for text in texts:
        check_every_parser(text)


@fuzz(800)
@given(st.lists(pieces, min_size=EACH, max_size=EACH))
def test_degenerate_turns_of_tags_brackets_and_digits(texts):
    for text in texts:
        check_every_parser(text)


@fuzz(750)
@given(st.lists(st.tuples(json_values, st.integers(0, 1200)), min_size=EACH, max_size=EACH))
def test_calls_with_any_json_arguments_at_any_depth(cases):
    for value, depth in cases:
        check_every_parser(calls_of_json(value, depth))


@pytest.mark.parametrize("n", [MAX_JSON_DEPTH - 2, 1000, 100_000])
def test_a_thousand_brackets_is_a_malformed_call_not_a_crash(n):
    turn = CALL_FORMATS.get("hermes")().parse(
        '<tool_call>{"name": "search", "arguments": {"query": ' + "[" * n + "]" * n + "}}</tool_call>"
    )
    if n < MAX_JSON_DEPTH:
        assert [c.name for c in turn.calls] == ["search"]
    else:
        assert turn.malformed == [f"tool call 1: JSON nested deeper than {MAX_JSON_DEPTH} levels"] and not turn.calls


def test_the_engine_reads_a_bracket_tower_back_as_a_malformed_call():
    from test_datatext import _native_engine
    from test_rollout import WordRetriever

    from searchrl.assets import load_tokenizer
    from searchrl.data.types import Question
    from searchrl.rollout.scripted import ScriptedBackend

    tok = load_tokenizer("tiny-random")
    tower = '<tool_call>{"name": "search", "arguments": {"query": ' + "[" * 1000 + "]" * 1000 + "}}</tool_call><|im_end|>"
    script = iter([tower, "Tessaly<|im_end|>"])
    engine = _native_engine(ScriptedBackend(tok, lambda text: next(script)), tok, WordRetriever(), max_new_tokens=4000)
    t = engine.run([Question("q", "Which river?", ("Tessaly",))], n=1)[0]
    assert t.stop_reason == "answer" and t.tool_calls[0]["error"] == "malformed"
    assert "nested deeper than" in next(s.text for s in t.segments if s.source == "env")
