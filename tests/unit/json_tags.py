"""A third protocol, written as a user would (docs/guides/protocols.md): JSON calls in tags.

The model calls any tool of the run as `<call>{"name": "search", "arguments": {"query": "…"}}</call>`,
reads each result between `<result>` tags, and answers between `<answer>` tags. One module and
the registry line on the class: `protocol.format: json-tags` then works in every command.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage
from searchrl.datatext import data
from searchrl.protocols.base import Codec, Message, Observed, Protocol, Script, TurnRead
from searchrl.protocols.config import PROTOCOLS, ProtocolConfig
from searchrl.reward_terms import FormatVerdict
from searchrl.tools.base import Observation, ToolCall
from searchrl.tools.batch import INVALID
from searchrl.tools.passages import format_passages

CALL_OPEN, CALL_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<call>", "</call>", "<answer>", "</answer>"
RESULT_OPEN, RESULT_CLOSE = "\n<result>", "</result>\n"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TAGS = re.compile(r"</?(call|result|answer)>")


def call_text(call: ToolCall) -> str:
    return f"{CALL_OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments})}{CALL_CLOSE}"


@PROTOCOLS.register("json-tags")
@dataclass(frozen=True)
class JsonTags(Protocol):
    format = "json-tags"
    default_template = "json-tags"
    spent_turns_allowed = 1  # told once that a budget is spent, it may still answer

    tools: tuple[str, ...] = ("search",)

    @classmethod
    def check_config(cls, cfg: ProtocolConfig, tools: Sequence[str] | None = None) -> None:
        if cfg.template != "json-tags":
            raise ValueError(f"protocol.format json-tags has one template, json-tags, not {cfg.template!r}")

    @classmethod
    def build(cls, cfg: ProtocolConfig, tools: Sequence[str], tokenizer) -> JsonTags:
        return cls(tuple(tools))

    def prompt_ids(self, question: str, codec: Codec, prompt: str | None = None) -> list[int]:
        text = prompt if prompt is not None else (
            f"Tools: {', '.join(self.tools)}. Call one as {call_text(ToolCall('search', {'query': '...'}))}, "
            f"answer as {ANSWER_OPEN}...{ANSWER_CLOSE}.\nQuestion: {data(question)}\n"
        )
        return codec.encode(text, prompt=True)

    def stop_strings(self) -> list[str]:
        return [CALL_CLOSE, ANSWER_CLOSE]

    def read_turn(self, sampled_ids: Sequence[int], finish_reason: str, stop_string: str | None,
                  codec: Codec) -> TurnRead | None:
        if finish_reason == "eos":
            return TurnRead("eos")
        if finish_reason != "stop":
            return None
        if stop_string == ANSWER_CLOSE:
            return TurnRead("answer")
        body = codec.decode(sampled_ids).rpartition(CALL_OPEN)[2].removesuffix(CALL_CLOSE)
        try:
            call = json.loads(body)
            return TurnRead(calls=[ToolCall(call["name"], call["arguments"])])
        except (ValueError, KeyError, TypeError):
            return TurnRead(malformed=['a call is {"name": ..., "arguments": {...}} between the call tags'])

    def _results(self, observations: Sequence[Observation], codec: Codec) -> tuple[list[int], str]:
        ids = codec.encode("".join(f"{RESULT_OPEN}{data(obs.text)}{RESULT_CLOSE}" for obs in observations))
        return ids, codec.decode(ids)

    def observe(self, history: list[Message], read: TurnRead, sampled_ids: Sequence[int],
                results: Sequence[tuple[ToolCall | None, Observation]], room: float, codec: Codec) -> Observed | None:
        ids, text = self._results([obs for _, obs in results], codec)
        return Observed(ids, text) if len(ids) <= room else None  # no cut: a result that does not fit ends it

    def turn_text(self, ids: Sequence[int], final_eos: frozenset[int] = frozenset()) -> list[int]:
        return list(ids[:-1]) if ids and ids[-1] in final_eos else list(ids)

    def answer(self, segments: Sequence[Segment], *, opened: bool = False, cut_short: bool = False) -> str | None:
        found = _ANSWER.findall("".join(s.text for s in segments if s.source == "policy"))
        return (found[-1].strip() or None) if found else None

    def check_format(self, traj: Trajectory, *, max_answer_words: int | None = None, require_think: bool = True,
                     think_opened_in_prompt: bool | None = None) -> FormatVerdict:
        policy = "".join(s.text for s in traj.segments if s.source == "policy")
        failed = []
        if traj.stop_reason != "answer" or not self.answer(traj.segments):
            failed.append("answer")
        if RESULT_OPEN.strip() in policy:
            failed.append("forged_documents")
        if any(c["error"] in INVALID for c in traj.tool_calls):
            failed.append("calls")
        return FormatVerdict(ok=not failed, failed=failed)

    def think_text(self, traj: Trajectory) -> str:
        return " ".join(_TAGS.sub(" ", s.text).strip() for s in traj.segments if s.source == "policy")

    def written(self, question: str, script: Script, codec: Codec) -> list[tuple[str, list[int], str]]:
        pieces: list[tuple[str, list[int], str]] = []
        for step in script.steps:
            text = f"{step.thought} {call_text(step.call)}"
            pieces.append(("policy", codec.encode(text), text))
            pieces.append(("env", *self._results([step.result], codec)))
        text = f"{script.final_thought} {ANSWER_OPEN}{script.answer}{ANSWER_CLOSE}"
        return [*pieces, ("policy", codec.encode(text), text)]

    def search_block_tokens(self, passages: Sequence[Passage], encode: Callable[[str], list[int]]) -> tuple[int, float]:
        return len(encode(RESULT_OPEN + RESULT_CLOSE)), len(encode(format_passages(passages))) / len(passages)
