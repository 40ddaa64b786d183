"""Reading tool calls out of an assistant turn, one parser per call format (a registry).

A parser sees the text of one sampled assistant turn (its end-of-turn token removed) and returns
a `Turn`: the well-formed calls, one message per malformed call (the model reads it back as an
error observation; it is never executed), and the text left once calls and reasoning are gone
(the final answer when there are no calls). Reasoning (`<think>…</think>`, Qwen3) is read
first and never holds a call: a `<tool_call>` the model writes while thinking is not a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from searchrl.errors import SearchRLError
from searchrl.registry import Registry
from searchrl.tools.base import ToolCall


@dataclass
class Turn:
    """One assistant turn as a call format read it."""

    text: str  # the whole turn as sampled (decoded), reasoning included
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # one readable reason per bad call
    reasoning: str = ""  # the <think> block's content, stripped
    final_text: str = ""  # the text without reasoning and calls, stripped

    @property
    def is_final(self) -> bool:
        """A turn without any call, well-formed or not, is the final answer."""
        return not self.calls and not self.malformed


class CallFormat:
    """How one model family writes calls. Subclasses set `name`, `detect` and `read_calls`."""

    name: ClassVar[str]
    extra_stops: ClassVar[tuple[str, ...]] = ()  # tokens besides the template's end of turn
    # Text only the environment writes around a tool result: in a policy turn, a forged result.
    observation_markers: ClassVar[tuple[str, ...]] = ()

    @staticmethod
    def detect(template: str) -> bool:
        """Whether a chat template's source speaks this format."""
        raise NotImplementedError

    def read_calls(self, text: str) -> tuple[list[ToolCall], list[str], str]:
        """(calls, malformed reasons, text left) of a turn's text outside its reasoning."""
        raise NotImplementedError

    def parse(self, text: str) -> Turn:
        reasoning, rest = split_reasoning(text)
        calls, malformed, left = self.read_calls(rest)
        return Turn(text, calls, malformed, reasoning, left.strip())


CALL_FORMATS: Registry[type[CallFormat]] = Registry("call format")

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, the rest). A `</think>` without `<think>` closes a block the generation prompt
    opened (Qwen3 thinking models); a `<think>` never closed keeps the whole rest as reasoning."""
    close = text.find(_THINK_CLOSE)
    open_ = text.find(_THINK_OPEN)
    if close == -1:
        if open_ == -1:
            return "", text
        return text[open_ + len(_THINK_OPEN) :].strip(), text[:open_]
    start = open_ + len(_THINK_OPEN) if -1 < open_ < close else 0
    head = text[:open_] if -1 < open_ < close else ""
    return text[start:close].strip(), head + text[close + len(_THINK_CLOSE) :]


# Deepest nesting of arrays and objects a call's JSON may have. A policy that writes a thousand
# brackets (a degenerate one does, mid-RL) would make the JSON reader recurse past Python's limit;
# such a call is malformed, read back to the model like any other.
MAX_JSON_DEPTH = 32


def json_depth(text: str, limit: int | None = None) -> int:
    """How deep arrays and objects nest in `text`, read as JSON (brackets in strings skipped);
    with `limit`, any depth past it may be reported as `limit + 1` (the scan stops there)."""
    if text.count("[") + text.count("{") <= (limit or 0):
        return text.count("[") + text.count("{")  # a bound that is enough: no deeper than that
    depth = most = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
            if limit is not None and most > limit:
                return most
        elif ch in "]}":
            depth -= 1
    return most


def load_json(text: str, where: str) -> tuple[Any, str | None]:
    """(the JSON value of `text`, None), or (None, why it is malformed): bad JSON, nested deeper
    than `MAX_JSON_DEPTH`, or a number Python refuses to read (over 4,300 digits). Never raises."""
    if json_depth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        return None, f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{where}: bad JSON ({exc.msg} at char {exc.pos})"
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        return None, f"{where}: unreadable JSON ({str(exc).split(';')[0][:80]})"


def _call_from_json(body: str, args_key: str, where: str) -> ToolCall | str:
    """A `ToolCall` from a JSON object `{"name": ..., args_key: {...}}`, or why it is malformed."""
    obj, problem = load_json(body, where)
    if problem is not None:
        return problem
    if not isinstance(obj, dict):
        return f"{where}: not a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'{where}: missing "name"'
    args: Any = obj.get(args_key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args, problem = load_json(args, where)
        if problem is not None:
            return f'{where}: "{args_key}" is a string that is not JSON we read ({problem.removeprefix(where + ": ")})'
    if not isinstance(args, dict):
        return f'{where}: "{args_key}" is not an object'
    return ToolCall(name.strip(), args)


@CALL_FORMATS.register("hermes")
class HermesFormat(CallFormat):
    """Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": …, "arguments": …}</tool_call>`, any number
    per turn. An opening tag without its closing one is a call cut by the token budget."""

    name = "hermes"
    observation_markers = ("<tool_response>", "</tool_response>")
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    @staticmethod
    def detect(template: str) -> bool:
        return "<tool_call>" in template

    def read_calls(self, text: str) -> tuple[list[ToolCall], list[str], str]:
        calls: list[ToolCall] = []
        malformed: list[str] = []
        left: list[str] = []
        pos = 0
        while True:
            start = text.find(self._OPEN, pos)
            stray = text.find(self._CLOSE, pos)
            if -1 < stray < (start if start != -1 else len(text)):
                malformed.append(f"{self._CLOSE} without {self._OPEN}")
                left.append(text[pos:stray])
                pos = stray + len(self._CLOSE)
                continue
            if start == -1:
                left.append(text[pos:])
                break
            left.append(text[pos:start])
            end = text.find(self._CLOSE, start)
            where = f"tool call {len(calls) + len(malformed) + 1}"
            if end == -1:
                malformed.append(f"{where}: cut off, {self._OPEN} without {self._CLOSE}")
                break
            parsed = _call_from_json(
                text[start + len(self._OPEN) : end].strip(), "arguments", where
            )
            (calls if isinstance(parsed, ToolCall) else malformed).append(parsed)
            pos = end + len(self._CLOSE)
        return calls, malformed, "".join(left)


@CALL_FORMATS.register("llama3-json")
class Llama3JsonFormat(CallFormat):
    """Llama 3.1 / 3.2 custom tools: the whole turn is one JSON object `{"name": …,
    "parameters": …}`, optionally after `<|python_tag|>`. One call per turn; a turn that starts
    with `{` (or the tag) is a call attempt, anything else is the final answer."""

    name = "llama3-json"
    extra_stops = ("<|eom_id|>",)
    observation_markers = ("<|start_header_id|>ipython<|end_header_id|>",)
    _TAG = "<|python_tag|>"

    @staticmethod
    def detect(template: str) -> bool:
        return "<|python_tag|>" in template or (
            '"parameters"' in template and "ipython" in template
        )

    def read_calls(self, text: str) -> tuple[list[ToolCall], list[str], str]:
        body = text.strip()
        tagged = body.startswith(self._TAG)
        if tagged:
            body = body[len(self._TAG) :].strip()
        if not tagged and not body.startswith("{"):
            return [], [], text
        try:
            end = json.JSONDecoder().raw_decode(body)[1] if json_depth(body, MAX_JSON_DEPTH) <= MAX_JSON_DEPTH else len(body)
        except (ValueError, RecursionError):
            end = len(body)  # reported as bad JSON (or too deep) below
        if body[end:].strip():
            return [], ["tool call: one call per turn, and nothing after it"], ""
        parsed = _call_from_json(body, "parameters", "tool call")
        return ([parsed], [], "") if isinstance(parsed, ToolCall) else ([], [parsed], "")


def detect_format(template: str) -> str:
    """The call format a chat template's source speaks; a clear error when it has none."""
    for name in CALL_FORMATS.names():
        if CALL_FORMATS.get(name).detect(template):
            return name
    raise SearchRLError(
        "the chat template has no tool-call section (no <tool_call>, no <|python_tag|> or "
        '"parameters" with an ipython role); pick our Hermes-style template explicitly '
        "(template: hermes-fallback, format: hermes) or set the format by name "
        f"(one of: {', '.join(CALL_FORMATS.names())})"
    )
